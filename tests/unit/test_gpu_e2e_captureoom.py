"""scripts/gpu/e2e.py's readings for the capture OOM scenario (s13_captureoom, issue 25).

The scenario decides how much memory its foreign holder leaves free from the calibration start's
capture lines and checks the serving engine's batch list from them, so the parsing is tested on
real SGLang 0.5.17 lines (tests/fixtures/sglang-0.5.17-h200/graphs.log) and on what must not match.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
GRAPHS_LOG = ROOT / "tests" / "fixtures" / "sglang-0.5.17-h200" / "graphs.log"


@pytest.fixture(scope="module")
def e2e() -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    try:
        return importlib.import_module("e2e")
    finally:
        sys.path.remove(str(ROOT / "scripts" / "gpu"))


def test_decode_captures_reads_the_real_begin_and_end_lines(e2e: ModuleType) -> None:
    text = GRAPHS_LOG.read_bytes().decode(errors="replace")
    caps = e2e.decode_captures([(0.0, x) for x in text.replace("\r", "\n").split("\n")])
    assert [c["state"] for c in caps] == ["begin", "end"]  # the prefill graph's lines are not decode's
    assert caps[0]["max_bs"] == 16 and caps[0]["avail_gb"] == 138.67
    assert caps[1]["usage_gb"] == 0.03 and caps[1]["avail_gb"] == 138.64


def test_the_holder_leaves_a_third_of_the_calibrated_usage_unless_told(e2e: ModuleType) -> None:
    assert e2e.oom_margin_gb(0.3, None) == pytest.approx(0.1)
    assert e2e.oom_margin_gb(0.3, 0.05) == 0.05
    assert e2e.oom_margin_gb(None, None) is None  # no calibration: the scenario fails, never guesses


def test_the_holder_script_compiles_and_triggers_on_the_decode_begin_line_only(e2e: ModuleType) -> None:
    compile(e2e.HOLDER, "holder", "exec")
    assert "Capture target decode CUDA graph begin" in e2e.HOLDER
    assert "prefill" not in e2e.HOLDER
