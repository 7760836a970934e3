"""One attempt: everything the lifecycle knows about one engine launch.

A launch replaces the whole `Attempt` (nothing of the previous engine can leak into the next one's
decisions: its failure lines, its captures, its stop reason), and `AttemptRecord` is what stays of
it in `/status` and the demo summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_supervisor.core.events import EngineFailed, FailureClass
from sglang_supervisor.core.readiness import CaptureKey
from sglang_supervisor.core.reasons import Outcome, StopReason
from sglang_supervisor.core.wedge import Tally


@dataclass
class Attempt:
    """The current engine's facts. `Attempt()` (number 0) stands for "none launched yet"."""

    number: int = 0
    profile: str | None = None
    engine_alive: bool = False
    stop_reason: StopReason | None = None  # why we asked the engine to stop; the first one wins
    next_profile: str | None = None  # relaunch target after a deliberate stop (reload, regression)
    expected: set[CaptureKey] = field(default_factory=set)  # captures READY waits for
    ended: set[CaptureKey] = field(default_factory=set)
    failures: list[EngineFailed] = field(default_factory=list)
    failure_times: list[float] = field(default_factory=list)  # when each of `failures` arrived
    ready_line: bool = False
    probing: bool = False  # the first (ready) probe runs
    reached_ready: bool = False
    wedge: Tally = field(default_factory=Tally)  # wedge.judge's counts (health misses, hung probes)
    log_on_stdout: bool = False  # SGLang's log came on stdout, stderr silent (LogOnStdout)
    progress: bool = False  # decode progress (log or /metrics) since the last check result
    # The graph sizes SGLang resolved for this start (engine/resolved.py; its server_args dump):
    # what a derived profile halves when the profile itself does not set them.
    resolved_graphs: dict[str, int] = field(default_factory=dict)

    @property
    def stopping(self) -> bool:
        return self.stop_reason is not None

    def captures_done(self) -> int:
        return len(self.ended & self.expected)


@dataclass
class AttemptRecord:
    profile: str
    attempt: int
    reason: str
    started_at: float
    ended_at: float | None = None
    outcome: Outcome = Outcome.RUNNING
    failure_class: FailureClass | None = None
    failure_line: str | None = None  # the engine's log line that showed the class, if one did

    def seconds(self, now: float) -> float:
        return round((self.ended_at if self.ended_at is not None else now) - self.started_at, 3)

    def close(self, now: float, outcome: Outcome, failure: FailureClass | None) -> None:
        if self.ended_at is not None:
            return
        self.ended_at = now
        # An attempt that reached READY keeps that outcome when it is later stopped on purpose.
        if not (self.outcome is Outcome.READY and outcome is Outcome.STOPPED):
            self.outcome = outcome
        self.failure_class = failure
