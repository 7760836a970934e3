"""core/failures: the one failure ranker, shared by the daemon (policy) and logscan."""

from __future__ import annotations

import pytest

from sglang_supervisor.core import lifecycle
from sglang_supervisor.core.events import EngineFailed, FailureClass
from sglang_supervisor.core.failures import FAILURE_RANK, GENERIC_FAILURES, classify_failure, root_of
from sglang_supervisor.core.logwatch import parse_lines, root_failure, summarize

F = FailureClass


def fails(*classes: FailureClass, start: int = 10) -> list[EngineFailed]:
    return [EngineFailed(line_no=start + i, rank="TP0", failure=c, message=c.value)
            for i, c in enumerate(classes)]


@pytest.mark.parametrize(
    ("classes", "crash_lines", "expected"),
    [
        ((), (), None),
        ((F.KV_CACHE_OOM,), (), F.KV_CACHE_OOM),
        # The case the issue names: the asynchronous CUDA error first, SGLang's diagnosis after it.
        ((F.CUDA_ERROR, F.KV_CACHE_OOM), (), F.KV_CACHE_OOM),
        ((F.KV_CACHE_OOM, F.CUDA_ERROR), (), F.KV_CACHE_OOM),
        ((F.CAPTURE_FAILED, F.CAPTURE_OOM), (), F.CAPTURE_OOM),
        ((F.WARMUP_FAILED, F.NCCL_TIMEOUT), (), F.NCCL_TIMEOUT),
        ((F.SCHEDULER_EXCEPTION, F.CUDA_ERROR), (), F.CUDA_ERROR),
        ((F.CHILD_CRASHED, F.SCHEDULER_EXCEPTION), (), F.SCHEDULER_EXCEPTION),
        ((F.OTHER, F.CHILD_CRASHED), (), F.CHILD_CRASHED),
        # Equally specific: the earliest; later ones are fallout of the first.
        ((F.PREFILL_GRAPH_FAILED, F.CAPTURE_OOM), (), F.PREFILL_GRAPH_FAILED),
        ((F.CAPTURE_OOM, F.NCCL_TIMEOUT, F.WATCHDOG_TIMEOUT), (), F.CAPTURE_OOM),
        # A crash line after the first failure closes it: what follows is the next start's failure.
        ((F.CUDA_ERROR, F.KV_CACHE_OOM), (10,), F.CUDA_ERROR),
        ((F.CUDA_ERROR, F.KV_CACHE_OOM), (11,), F.KV_CACHE_OOM),
        ((F.CUDA_ERROR, F.KV_CACHE_OOM), (5,), F.KV_CACHE_OOM),  # a crash before the failure: no limit
    ],
)
def test_root_of(classes: tuple[FailureClass, ...], crash_lines: tuple[int, ...],
                 expected: FailureClass | None) -> None:
    root = root_of(fails(*classes), crash_lines)
    assert (root.failure if root else None) is expected


def test_root_of_picks_the_first_of_equals_by_order_not_by_line_number() -> None:
    # The daemon's failures of a multi-node group come from several logs: their line numbers are
    # not comparable, the order they arrived in is.
    a = EngineFailed(line_no=900, rank="TP1", failure=F.CAPTURE_OOM, message="node 1")
    b = EngineFailed(line_no=3, rank="TP0", failure=F.CAPTURE_OOM, message="node 0")
    assert root_of([a, b]) is a


@pytest.mark.parametrize(
    ("rc", "classes", "verdict", "after_ready", "expected"),
    [
        (2, (), None, False, F.UNKNOWN_FLAG),
        (2, (), None, True, F.OTHER),  # a serving engine parses no command line
        (-9, (), None, False, F.OTHER),
        (-9, (F.SCHEDULER_EXCEPTION, F.CAPTURE_OOM), None, False, F.CAPTURE_OOM),
        (-9, (F.CUDA_ERROR, F.KV_CACHE_OOM), None, False, F.KV_CACHE_OOM),
        (-9, (F.CHILD_CRASHED,), None, False, F.CHILD_CRASHED),
        (-9, (F.CHILD_CRASHED,), F.HANG, False, F.HANG),  # the verdict says more than fallout
        (-9, (F.CUDA_ERROR,), F.HANG, False, F.CUDA_ERROR),  # an engine-named cause beats it
        (-9, (F.NCCL_TIMEOUT,), F.HANG, False, F.NCCL_TIMEOUT),
        (-9, (), F.WEDGED, True, F.WEDGED),
        (1, (F.KV_CACHE_OOM,), None, False, F.KV_CACHE_OOM),
        (2, (F.OTHER,), None, False, F.OTHER),  # a printed failure beats the guess from the code
    ],
)
def test_classify_failure(rc: int, classes: tuple[FailureClass, ...], verdict: FailureClass | None,
                          after_ready: bool, expected: FailureClass) -> None:
    assert classify_failure(rc, fails(*classes), verdict, after_ready=after_ready) is expected


def test_the_lifecycle_decides_with_the_same_function() -> None:
    assert lifecycle.classify_failure is classify_failure


def test_every_class_the_engine_prints_is_ranked_and_generic_is_the_tail() -> None:
    verdicts = {F.HANG, F.WEDGED, F.GPU_BUSY}  # the supervisor's own, never parsed from a log
    assert set(FAILURE_RANK) == set(F) - verdicts
    assert {F.SCHEDULER_EXCEPTION, F.CHILD_CRASHED, F.OTHER} == GENERIC_FAILURES
    assert max(FAILURE_RANK[c] for c in set(FAILURE_RANK) - GENERIC_FAILURES) < min(
        FAILURE_RANK[c] for c in GENERIC_FAILURES)


# A two-rank start: TP1 reports an asynchronous CUDA error before TP0 prints SGLang's diagnosis.
TWO_RANK_LOG = [
    "[2026-05-01 12:00:00 TP1] Scheduler hit an exception: Traceback (most recent call last):",
    "RuntimeError: CUDA error: out of memory",
    "[2026-05-01 12:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    "[2026-05-01 12:00:01] Received sigquit from a child process. It usually means the child failed.",
]


def test_the_daemon_and_logscan_name_the_same_cause() -> None:
    events = parse_lines(TWO_RANK_LOG)
    failures = [e for e in events if isinstance(e, EngineFailed)]
    assert [f.failure for f in failures] == [F.CUDA_ERROR, F.KV_CACHE_OOM]
    logscan = summarize(events).to_json()["failure"]["class"]
    root = root_failure(events)
    assert root is not None and root.failure is F.KV_CACHE_OOM
    assert logscan == classify_failure(-9, failures).value == "kv_cache_oom"
