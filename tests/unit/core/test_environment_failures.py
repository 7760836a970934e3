"""Environment failures beyond a missing ninja/nvcc (issue 25 F), on real lines from public
issues (tests/fixtures/environment/README.md names each source): the class is `environment`
(exit 78 with the fix, no ladder, nothing marked bad), and the fix fits the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor.core import logwatch
from sglang_supervisor.core.events import EngineFailed, FailureClass
from sglang_supervisor.engine import patterns as P

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "environment"


def failures(lines: list[str]) -> list[EngineFailed]:
    return [e for e in logwatch.parse_lines(lines) if isinstance(e, EngineFailed)]


@pytest.mark.parametrize(("fixture", "fix_words"), [
    ("triton_cache_permission.log", "TRITON_CACHE_DIR"),
    ("flashinfer_cache_readonly.log", "XDG_CACHE_HOME"),
    ("libcudart_missing.log", "LD_LIBRARY_PATH"),
    ("libnvrtc_missing.log", "nvidia-cuda-nvrtc"),
    ("triton_no_c_compiler.log", "install gcc"),
    ("jit_build_failed.log", "JIT kernel build failed"),
])
def test_each_real_line_is_an_environment_failure_with_its_own_fix(fixture: str, fix_words: str) -> None:
    lines = (FIX / fixture).read_text().splitlines()
    head = "[2026-12-03 06:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):"
    found = failures([head, *lines, "[2026-12-03 06:00:01] Received sigquit from a child process."])
    assert found, fixture
    assert {f.failure for f in found} == {FailureClass.ENVIRONMENT}, [(f.failure, f.message) for f in found]
    assert fix_words in P.environment_fix(found[0].message)


def test_the_drivers_libcuda_is_named_the_same_way() -> None:
    # The dynamic loader's text for any library it cannot find, libcuda.so.1 (the driver's) too.
    [f] = failures(["OSError: libcuda.so.1: cannot open shared object file: No such file or directory"])
    assert f.failure is FailureClass.ENVIRONMENT and "NVIDIA driver" in P.environment_fix(f.message)


def test_a_kernel_build_failing_while_a_graph_is_captured_is_that_graphs_failure() -> None:
    """Before any capture a failed JIT build is the host's toolchain; during one it may be the
    captured graph's kernel, which another profile may not build: the capture class decides."""
    begin = ("[2026-12-03 06:00:00 TP0] Capture target decode CUDA graph begin. backend=full, "
             "num_tokens_per_req=1, bs=[1, 2, 4], avail mem=70.00 GB")
    build = "[2026-12-03 06:00:01 TP0] RuntimeError: Error building extension 'decode_kernel_sm90'"
    assert [f.failure for f in failures([build])] == [FailureClass.ENVIRONMENT]
    assert [f.failure for f in failures([begin, build])] == [FailureClass.CAPTURE_FAILED]
    # A missing build tool is the host's wherever it shows (the ninja rule of issue 25 item 4).
    no_cc = ("[2026-12-03 06:00:01 TP0] RuntimeError: Failed to find C compiler. Please specify via "
             "CC environment variable.")
    assert [f.failure for f in failures([begin, no_cc])] == [FailureClass.ENVIRONMENT]


def test_a_kernel_build_failing_before_its_own_ranks_capture_is_the_hosts() -> None:
    """Under TP the ranks start apart: on a busy host TP1 may begin its prefill capture while TP0,
    still loading, fails its kernel build before any capture of its own. That is the host's
    toolchain (exit 78, no ladder), not TP1's graph (the flaky env:jit-build integration run)."""
    other = ("[2026-12-03 06:00:00 TP1] Capture target prefill CUDA graph begin. backend=breakable, "
             "num_tokens=[4, 8], avail mem=11.40 GB")
    lines = [
        "[2026-12-03 06:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/usr/lib/python3/site-packages/sglang/srt/managers/scheduler.py", line 985, in '
        "init_model_worker",
        "    self.init_all_cuda_graphs()",
        "RuntimeError: Error building extension 'sgl_kernel_jit_norm'",
        "",
        "[2026-12-03 06:00:01] Received sigquit from a child process. It usually means the child failed.",
    ]
    found = failures([other, *lines])
    assert found and {f.failure for f in found} == {FailureClass.ENVIRONMENT}, found
    # The same build failing on the rank that is capturing stays that capture's failure.
    own = other.replace(" TP1]", " TP0]")
    assert FailureClass.ENVIRONMENT not in {f.failure for f in failures([own, *lines])}


def test_the_ninja_fix_stays_the_default() -> None:
    assert "pip install ninja" in P.environment_fix("RuntimeError: Ninja is required to load C++ extensions")
