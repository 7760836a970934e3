"""The one failure ranker: which of the failure lines of an engine start is its cause.

The daemon (policy: which profile next, which remediation) and `logscan` (the class it prints
and the fix it suggests) both decide with these functions, so that one log gets one cause.

Why rank instead of taking the first line: when an engine start fails, several signatures often
appear. SGLang's own diagnostics (`Not enough memory ... increase --mem-fraction-static`, a
capture OOM, an unknown flag, a watchdog or NCCL timeout) name a cause and a remedy. A `CUDA error:`
line is reported asynchronously, at whatever CUDA call happens to run next, often on another rank,
so it comes before or after the real cause by chance; capture and warm-up failures without an OOM
are the symptom of something the specific lines name. Generic lines (a scheduler traceback with no
finer class, a child that crashed, an unclassified error) are fallout. So: the most specific rank
wins, and among equals the earliest line (later lines are fallout of the first). Lines after the
first crash that follows the first failure belong to the next failure (logscan reads whole files
that span restarts) and are not considered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sglang_supervisor.core.events import EngineFailed, FailureClass

# argparse's exit status: the command line itself was rejected.
ARGPARSE_EXIT = 2

# Lower is more specific. Classes absent here (the supervisor's own verdicts HANG, WEDGED and
# GPU_BUSY) are never printed by the engine; they rank after everything the engine printed.
FAILURE_RANK: dict[FailureClass, int] = {
    FailureClass.UNKNOWN_FLAG: 0,
    FailureClass.FLAG_REFUSED: 0,
    FailureClass.ENVIRONMENT: 0,
    FailureClass.PORT_IN_USE: 0,
    FailureClass.KV_CACHE_OOM: 0,
    FailureClass.PREFILL_GRAPH_FAILED: 0,
    FailureClass.DRAFT_CAPTURE_FAILED: 0,
    FailureClass.CAPTURE_OOM: 0,
    FailureClass.SCHEDULER_DIED: 0,
    FailureClass.WATCHDOG_TIMEOUT: 0,
    FailureClass.NCCL_TIMEOUT: 0,
    FailureClass.OUTPUT_MISMATCH: 0,
    FailureClass.CAPTURE_FAILED: 1,
    FailureClass.WARMUP_FAILED: 1,
    FailureClass.CUDA_ERROR: 1,
    FailureClass.SCHEDULER_EXCEPTION: 2,
    FailureClass.CHILD_CRASHED: 3,
    FailureClass.OTHER: 4,
}
_UNRANKED = max(FAILURE_RANK.values()) + 1
# Classes that name no cause: the supervisor's verdict (hang, wedged) says more than they do.
GENERIC_FAILURES = frozenset(
    c for c, r in FAILURE_RANK.items() if r >= FAILURE_RANK[FailureClass.SCHEDULER_EXCEPTION])


def rank(failure: FailureClass) -> int:
    """How specific a class is (0 = names the cause)."""
    return FAILURE_RANK.get(failure, _UNRANKED)


def root_of(failures: Sequence[EngineFailed], crash_lines: Iterable[int] = ()) -> EngineFailed | None:
    """The cause among `failures` (in the order the engine printed them): the most specific one of
    the first failure, earliest on ties. `crash_lines` are the line numbers of crash lines
    (`Subprocess ... crashed`, SIGQUIT): the first one at or after the first failure ends it."""
    if not failures:
        return None
    first = failures[0].line_no
    limit = min((n for n in crash_lines if n >= first), default=None)
    cluster = [f for f in failures if limit is None or f.line_no <= limit] or list(failures[:1])
    return min(enumerate(cluster), key=lambda item: (rank(item[1].failure), item[0]))[1]


def classify_failure(
    returncode: int | None,
    failures: Iterable[EngineFailed],
    verdict: FailureClass | None = None,
    *,
    after_ready: bool = False,
) -> FailureClass:
    """Why a start or a run failed.

    The engine's own signature is the best witness (`root_of`); the supervisor's verdict (hang,
    wedged) outranks a generic one; then the exit code (argparse's 2, only before READY: a serving
    engine parses no command line); else OTHER.
    """
    root = root_of(list(failures))
    if root is not None and root.failure not in GENERIC_FAILURES:
        return root.failure
    if verdict is not None:
        return verdict
    if root is not None:
        return root.failure
    if returncode == ARGPARSE_EXIT and not after_ready:
        return FailureClass.UNKNOWN_FLAG
    return FailureClass.OTHER
