"""scripts/gpu/warmcache.py, the helpers of GPU scenario warmcache (issue 26): what dominated a
start, read from the log real SGLang 0.5.17 wrote on the H200 (the cold start of the tiny Qwen3,
tests/fixtures/sglang-0.5.17-h200/graphs.timed.log), and the unit's environment as emulated."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

import gpu_scripts

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "fixtures" / "sglang-0.5.17-h200" / "graphs.timed.log"


@pytest.fixture(scope="module")
def wc() -> ModuleType:
    return gpu_scripts.load("warmcache")


def timed_lines() -> list[tuple[float, str]]:
    out = []
    for line in LOG.read_text().splitlines():
        m = re.match(r"\s*([\d.]+) (?:NL|CR) (.*)", line)
        if m:
            out.append((float(m[1]), m[2]))
    return out


def test_the_cold_starts_phases_name_the_prefill_capture_first(wc: ModuleType) -> None:
    ph = wc.phases(timed_lines(), 0.0)
    marks = ph["marks"]
    assert list(marks)[:3] == ["first_line", "server_args", "init_distributed"]
    assert marks["ready_line"] == 144.8 and marks["capture_target_prefill_end"] == 130.7
    assert ph["largest_gaps"][0] == ("capture_target_prefill_begin->capture_target_prefill_end", 78.9)
    # the scheduler process's own start (a second import of torch and SGLang) comes next
    assert ph["largest_gaps"][1] == ("server_args->init_distributed", 24.6)
    assert "cuda_graph={prefill=78.90" in ph["sglang_startup_timings"][0]


def test_the_unit_environment_drops_the_exported_jit_paths(wc: ModuleType, tmp_path: Path) -> None:
    base = {"PATH": "/usr/bin", "TVM_FFI_CACHE_DIR": "/tmp/jit/tvmffi", "TRITON_CACHE_DIR": "/tmp/jit/triton"}
    env = wc.unit_environment(base, tmp_path / "cache", tmp_path / "start1")
    assert "TVM_FFI_CACHE_DIR" not in env and "TRITON_CACHE_DIR" not in env
    assert env["CACHE_DIRECTORY"] == str(tmp_path / "cache") and env["PATH"] == "/usr/bin"
    assert env["TMPDIR"] == str(tmp_path / "start1" / "tmp") and (tmp_path / "start1" / "home").is_dir()
