"""One trial start outside the daemon (`tune`, core/trial.py): the daemon's ready gate, its
deadlines and its failure ranker on the facts of one start. The clock is an argument: no timing."""

from __future__ import annotations

import pytest

from sglang_supervisor.core.events import (
    CaptureEnded,
    EngineCrashed,
    EngineEvent,
    EngineFailed,
    FailureClass,
    HttpUp,
    PrefillGraphDisabled,
    ServerReady,
    WeightsLoadBegan,
)
from sglang_supervisor.core.logwatch import LogParser
from sglang_supervisor.core.readiness import CaptureKey, capture_keys
from sglang_supervisor.core.trial import Deadlines, Decision, Step, TrialStart

LIMITS = Deadlines(start_s=600.0, stall_s=60.0, grace_s=15.0)
TP1: frozenset[CaptureKey] = frozenset({("target", "prefill", None), ("target", "decode", None)})


def ended(phase: str, rank: str | None = None) -> CaptureEnded:
    return CaptureEnded(1, rank, "target", phase, 1.0, 0.1)  # type: ignore[arg-type]


def failed(line: int, cls: FailureClass, message: str = "") -> EngineFailed:
    return EngineFailed(line, None, cls, message or cls.value)


def run(events: list[EngineEvent]) -> tuple[TrialStart, Decision]:
    """The events at t=0..n, decided at t=10 with the engine still running."""
    trial = TrialStart(TP1, began=0.0)
    for i, ev in enumerate(events):
        trial.output(float(i))
        trial.feed(ev, float(i))
    return trial, trial.decide(10.0, None, LIMITS)


DECIDE_ROWS = [
    # (case, events (all at t=0), last output, now, returncode, step, verdict)
    ("every capture ended and the ready line came: ready",
     [ended("prefill"), ended("decode"), ServerReady(3, None)], 0.0, 10.0, None, Step.READY, None),
    ("the ready line without the prefill capture: the daemon's capture_missing",
     [ended("decode"), ServerReady(3, None)], 0.0, 10.0, None, Step.STOP, FailureClass.CAPTURE_FAILED),
    ("the engine said it turned the prefill graph off: the decode graph and the ready line do",
     [PrefillGraphDisabled(1, None, "rule"), ended("decode"), ServerReady(3, None)], 0.0, 10.0, None,
     Step.READY, None),
    ("captures done, no ready line yet: wait", [ended("prefill"), ended("decode")], 0.0, 10.0, None,
     Step.WAIT, None),
    ("the engine ended on its own", [WeightsLoadBegan(1, None, 80.0)], 0.0, 10.0, 1, Step.EXITED, None),
    ("a failure line and the engine still runs past the grace: the daemon stops it",
     [failed(1, FailureClass.CUDA_ERROR)], 0.0, LIMITS.grace_s, None, Step.STOP, None),
    ("a failure line within the grace: wait for what the engine does",
     [failed(1, FailureClass.CUDA_ERROR)], 0.0, LIMITS.grace_s - 1, None, Step.WAIT, None),
    ("a failure line once HTTP is up starts no grace (it may be a user's text)",
     [HttpUp(1, None, "127.0.0.1", 30000), failed(2, FailureClass.CUDA_ERROR)], 0.0,
     LIMITS.grace_s + 1, None, Step.WAIT, None),
    ("no output for stall_s: a hang", [WeightsLoadBegan(1, None, 80.0)], 0.0, LIMITS.stall_s + 1,
     None, Step.STOP, FailureClass.HANG),
    ("output moves the stall deadline", [WeightsLoadBegan(1, None, 80.0)], 50.0, LIMITS.stall_s + 1,
     None, Step.WAIT, None),
    ("not ready by start_s while output flows: a hang", [], LIMITS.start_s, LIMITS.start_s + 1, None,
     Step.STOP, FailureClass.HANG),
]


@pytest.mark.parametrize(("case", "events", "last_output", "now", "returncode", "step", "verdict"),
                         DECIDE_ROWS, ids=[r[0] for r in DECIDE_ROWS])
def test_decide(case: str, events: list[EngineEvent], last_output: float, now: float,
                returncode: int | None, step: Step, verdict: FailureClass | None) -> None:
    trial = TrialStart(TP1, began=0.0)
    for ev in events:
        trial.feed(ev, 0.0)
    trial.output(last_output)
    decision = trial.decide(now, returncode, LIMITS)
    assert (decision.step, decision.verdict) == (step, verdict), case


FAILURE_ROWS = [
    # (case, events, returncode, decision verdict, failure)
    ("a CUDA error line, then SGLang's KV-cache OOM: the ranker names the OOM",
     [WeightsLoadBegan(1, None, 80.0), failed(2, FailureClass.CUDA_ERROR),
      failed(3, FailureClass.KV_CACHE_OOM)], 1, None, FailureClass.KV_CACHE_OOM),
    ("a generic traceback loses to the supervisor's hang verdict",
     [WeightsLoadBegan(1, None, 80.0), failed(2, FailureClass.SCHEDULER_EXCEPTION)], -15,
     FailureClass.HANG, FailureClass.HANG),
    ("a crash line is one failure, not two", [WeightsLoadBegan(1, None, 80.0),
     EngineCrashed(4, None, "Subprocess scheduler_0 (pid=1) crashed with exit code -9"),
     failed(4, FailureClass.CHILD_CRASHED)], 1, None, FailureClass.CHILD_CRASHED),
    ("argparse's exit status with nothing printed: an unknown flag", [], 2, None,
     FailureClass.UNKNOWN_FLAG),
    ("an 'unrecognized arguments' line after weights loaded and exit 1 is not corroborated",
     [WeightsLoadBegan(1, None, 80.0), failed(2, FailureClass.UNKNOWN_FLAG)], 1, None,
     FailureClass.OTHER),
]


@pytest.mark.parametrize(("case", "events", "returncode", "verdict", "failure"), FAILURE_ROWS,
                         ids=[r[0] for r in FAILURE_ROWS])
def test_failure(case: str, events: list[EngineEvent], returncode: int | None,
                 verdict: FailureClass | None, failure: FailureClass) -> None:
    trial, _ = run(events)
    got, _message = trial.failure(returncode, Decision(Step.EXITED, verdict, "why"))
    assert got is failure


def test_missing_capture_is_named_and_a_specific_line_still_wins() -> None:
    trial, decision = run([ended("decode"), ServerReady(3, None)])
    assert decision.missing == (("target", "prefill", None),)
    assert trial.failure(None, decision) == (
        FailureClass.CAPTURE_FAILED, "ready line without these CUDA graph captures: target prefill@main")
    trial, decision = run([failed(1, FailureClass.CAPTURE_OOM, "CUDA out of memory"), ended("decode"),
                           ServerReady(3, None)])
    assert trial.failure(None, decision) == (FailureClass.CAPTURE_OOM, "CUDA out of memory")


def test_real_lines_of_a_start_without_its_prefill_capture_are_not_ready() -> None:
    """SGLang 0.5.23, tp=1, default flags: the daemon expects the prefill (breakable) and the
    decode capture; a log with the ready line but no prefill end is a failed start."""
    expected = capture_keys(["--model-path", "m"], "0.5.23")
    assert expected == TP1
    lines = [
        "[2026-12-01 10:00:00] Capture target prefill CUDA graph begin. backend=breakable, "
        "num_tokens=[4, 8], avail mem=60.00 GB",
        "[2026-12-01 10:00:09] Capture target decode CUDA graph begin. backend=full, "
        "num_tokens_per_req=1, bs=[1, 2], avail mem=59.80 GB",
        "[2026-12-01 10:00:12] Capture target decode CUDA graph end. bs=[1, 2], elapsed=2.50 s, "
        "mem usage=0.03 GB, avail mem=59.77 GB.",
        "[2026-12-01 10:00:15] The server is fired up and ready to roll!",
    ]
    parser = LogParser("0.5.23", [])
    trial = TrialStart(expected, began=0.0)
    for line in lines:
        for ev in parser.feed_line(line):
            trial.feed(ev, 1.0)
    assert trial.ready_line and trial.ended == {("target", "decode", None)}
    decision = trial.decide(2.0, None, LIMITS)
    assert (decision.step, decision.verdict) == (Step.STOP, FailureClass.CAPTURE_FAILED)
