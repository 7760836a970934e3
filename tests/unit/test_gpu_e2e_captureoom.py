"""scripts/gpu/e2e_scenarios/captureoom.py's readings for the capture OOM scenario
(s15_captureoom, issue 25).

The scenario decides how much memory its foreign holder leaves free from the calibration start's
capture lines and checks the serving engine's batch list from them, so the parsing is tested on
real SGLang 0.5.17 lines (tests/fixtures/sglang-0.5.17-h200/graphs.log) and on what must not match.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

import gpu_scripts

ROOT = Path(__file__).resolve().parents[2]
GRAPHS_LOG = ROOT / "tests" / "fixtures" / "sglang-0.5.17-h200" / "graphs.log"


@pytest.fixture(scope="module")
def e2e() -> ModuleType:
    return gpu_scripts.load("e2e_scenarios.captureoom")


def test_decode_captures_reads_the_real_begin_and_end_lines(e2e: ModuleType) -> None:
    text = GRAPHS_LOG.read_bytes().decode(errors="replace")
    caps = e2e.decode_captures([(0.0, x) for x in text.replace("\r", "\n").split("\n")])
    assert [c["state"] for c in caps] == ["begin", "end"]  # the prefill graph's lines are not decode's
    assert caps[0]["max_bs"] == 16 and caps[0]["avail_gb"] == 138.67
    assert caps[1]["usage_gb"] == 0.03 and caps[1]["avail_gb"] == 138.64


def test_the_holder_leaves_halfway_between_the_two_calibrated_needs_unless_told(e2e: ModuleType) -> None:
    assert e2e.oom_margin_bytes(300, 100, None) == 200
    assert e2e.oom_margin_bytes(300, 100, 0.5) == 2**29  # the flag wins
    # No gap measured (or nothing measured): the scenario fails its check, it never guesses.
    assert e2e.oom_margin_bytes(100, 100, None) is None
    assert e2e.oom_margin_bytes(None, 100, None) is None
    assert e2e.oom_margin_bytes(300, None, None) is None


def test_the_holder_reports_what_it_measured(e2e: ModuleType) -> None:
    m = e2e.MEASURED.search("holder ready measure\nmeasured need_bytes 123456789 free_at_pool_end 9\n")
    assert m is not None and int(m["need"]) == 123456789


def test_the_holder_script_compiles_and_arms_at_the_memory_pool_end_line(e2e: ModuleType) -> None:
    compile(e2e.HOLDER, "holder", "exec")
    assert '"Memory pool end"' in e2e.HOLDER and "Capture target decode CUDA graph end" in e2e.HOLDER
    assert "prefill" not in e2e.HOLDER
