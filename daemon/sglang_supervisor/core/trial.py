"""One trial start of a profile outside the daemon (`tune`): its facts, and the daemon's decisions
on them.

tune starts each profile once, waits until it is ready, probes it and stops it. "Ready" and "why
it failed" must mean there what they mean to the daemon, or tune ranks a profile that the daemon
then refuses (a ready line without the prefill capture) or names a cause the daemon would not (the
first failure line instead of the most specific one). So this module only keeps facts; it decides
with the daemon's functions: the ready gate (readiness.ready_gate, readiness.without_prefill), the
lines the engine's behaviour corroborates (failover.corroborated), the failure ranker
(failures.classify_failure) and the daemon's deadlines (the grace after a failure line before
HTTP is up, the start and stall timeouts: their verdict is a hang). The clock is an argument.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from enum import Enum

from sglang_supervisor.core.events import (
    CaptureBegan,
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
from sglang_supervisor.core.failover import corroborated
from sglang_supervisor.core.failures import classify_failure
from sglang_supervisor.core.readiness import CaptureKey, Gate, GateVerdict, ready_gate, without_prefill


class Step(Enum):
    WAIT = "wait"
    READY = "ready"  # every expected capture ended and the ready line came: probe it
    STOP = "stop"  # the supervisor ends the start (its verdict, or a failure line's grace ran out)
    EXITED = "exited"  # the engine ended on its own before it was ready


@dataclass(frozen=True)
class Decision:
    step: Step
    verdict: FailureClass | None = None  # the supervisor's own verdict, for STOP
    why: str = ""
    missing: tuple[CaptureKey, ...] = ()  # the ready line came without these captures


@dataclass(frozen=True)
class Deadlines:
    start_s: float  # launch -> ready
    stall_s: float  # no output at all
    grace_s: float  # a failure line before HTTP is up, and the engine still runs


@dataclass
class TrialStart:
    expected: Set[CaptureKey]
    began: float
    last_output: float = 0.0
    ended: set[CaptureKey] = field(default_factory=set)
    ready_line: bool = False
    http_up: bool = False
    launching: bool = True  # nothing loaded yet (a rejected command line ends it here)
    failures: list[EngineFailed] = field(default_factory=list)
    grace_from: float | None = None
    capture_begin: float | None = None
    capture_end: float | None = None

    def __post_init__(self) -> None:
        self.last_output = max(self.last_output, self.began)

    def output(self, now: float) -> None:
        """Any output, parsed or not, moves the stall deadline."""
        self.last_output = now

    def feed(self, ev: EngineEvent, now: float) -> None:
        if isinstance(ev, EngineFailed | EngineCrashed):
            self._failure_line(ev, now)
        elif isinstance(ev, WeightsLoadBegan):
            self.launching = False
        elif isinstance(ev, CaptureBegan):
            self.launching = False
            self.capture_begin = now if self.capture_begin is None else self.capture_begin
        elif isinstance(ev, CaptureEnded):
            self.ended.add((ev.owner, ev.phase, ev.rank))
            self.capture_end = now
        elif isinstance(ev, PrefillGraphDisabled):
            self.expected = without_prefill(self.expected, ev.rank)
        elif isinstance(ev, HttpUp):
            self.launching, self.http_up = False, True
        elif isinstance(ev, ServerReady):
            self.ready_line = True

    def _failure_line(self, ev: EngineFailed | EngineCrashed, now: float) -> None:
        if ev.line_no and any(f.line_no == ev.line_no for f in self.failures):
            return  # a crash line is reported both as EngineCrashed and as its signature
        failed = ev if isinstance(ev, EngineFailed) else EngineFailed(
            ev.line_no, ev.rank, FailureClass.CHILD_CRASHED, ev.message)
        if not self.failures and not self.http_up:
            self.grace_from = now  # as the daemon: once users can reach it, one line stops nothing
        self.failures.append(failed)

    def gate(self) -> GateVerdict:
        return ready_gate(starting=True, ready_line=self.ready_line, probing=False,
                          expected=self.expected, ended=self.ended)

    def decide(self, now: float, returncode: int | None, deadlines: Deadlines) -> Decision:
        verdict = self.gate()
        if verdict.gate is Gate.PROBE:
            return Decision(Step.READY)
        if verdict.gate is Gate.MISSING:
            return Decision(Step.STOP, FailureClass.CAPTURE_FAILED,
                            f"ready line without these CUDA graph captures: {verdict.missing_text()}",
                            verdict.missing)
        if returncode is not None:
            return Decision(Step.EXITED, why=f"engine exited with returncode {returncode}")
        if self.grace_from is not None and now - self.grace_from >= deadlines.grace_s:
            return Decision(Step.STOP, None, f"a failure line and the engine still ran "
                                             f"{deadlines.grace_s:g} s later")
        if now - self.began > deadlines.start_s:
            return Decision(Step.STOP, FailureClass.HANG, f"not ready within {deadlines.start_s:g} s")
        if now - self.last_output > deadlines.stall_s:
            return Decision(Step.STOP, FailureClass.HANG, f"no output for {deadlines.stall_s:g} s")
        return Decision(Step.WAIT)

    def failure(self, returncode: int | None, decision: Decision) -> tuple[FailureClass, str]:
        """Why the start failed (the daemon's classification) and the line that says so."""
        lines = list(self.failures)
        if decision.missing:
            lines.append(EngineFailed(line_no=0, rank=None, failure=FailureClass.CAPTURE_FAILED,
                                      message=decision.why))
        kept, _ = corroborated(lines, returncode=returncode, after_ready=False,
                               launching=self.launching)
        failure = classify_failure(returncode, kept, decision.verdict)
        witness = next((f for f in kept if f.failure is failure), None)
        return failure, witness.message if witness is not None else decision.why
