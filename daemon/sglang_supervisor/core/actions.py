"""What the lifecycle asks the shell to do, in order: launch, stop, timers, systemd, state, log, exit.

Deadlines are actions too: the machine asks for a named timer (`SetTimer`) and the shell feeds
`TimerFired` back, so every decision can be tested without sleeping. `Action` is a closed union:
the shell's executor matches on it with `assert_never` so that mypy proves every action is carried
out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sglang_supervisor.core.canary import CanaryPlan, Verdict
from sglang_supervisor.core.derive import Derivation
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.reasons import StopReason


@dataclass(frozen=True)
class Launch:
    profile: str
    attempt: int
    reason: str
    delay_s: float  # backoff before spawning (after the GPU release wait)
    # Set when this launch replaces an engine of this run: the bounded `reason` label of the
    # restarts counter, a FailureClass or RestartCause *value* (a plain string: it becomes a
    # Prometheus label and an exit message).
    restart: str | None = None
    # A derived profile (core/derive.py): the shell renders it as this overlay on its base.
    derived: Derivation | None = None


@dataclass(frozen=True)
class StopEngine:
    reason: StopReason  # `reason.planned`: the engine gets its full drain


@dataclass(frozen=True)
class SetTimer:
    name: str
    seconds: float
    reset_on_output: bool = False


@dataclass(frozen=True)
class CancelTimer:
    name: str


@dataclass(frozen=True)
class RunReadyProbe:
    attempt: int


@dataclass(frozen=True)
class NotifyReady:
    pass


@dataclass(frozen=True)
class NotifyStatus:
    text: str


@dataclass(frozen=True)
class NotifyStopping:
    pass


@dataclass(frozen=True)
class NotifyReloading:
    pass


@dataclass(frozen=True)
class MarkGood:
    profile: str
    seconds: float | None = None  # from launch to READY


@dataclass(frozen=True)
class MarkBad:
    profile: str
    failure_class: FailureClass


@dataclass(frozen=True)
class WaitTemporary:
    """Check `what` ("port" or "gpu") until it is clear, then feed TemporaryCleared(seq); check
    the first time after `delay_s`. The lifecycle's TEMPORARY_TIMER bounds the wait."""

    what: str
    detail: str
    delay_s: float
    seq: int


@dataclass(frozen=True)
class RollBack:
    """The command a reload started failed before READY: the shell puts back the configuration
    that served before that reload (the `Launch` after this one starts its `profile`), and reports
    the refused change where operators look (STATUS=, /status, a metric)."""

    profile: str
    failure_class: str  # a FailureClass value
    message: str


@dataclass(frozen=True)
class CanaryJudged:
    """An upgrade canary's verdict at its READY probe: the shell remembers it (the release
    history), publishes it (/status, metrics, STATUS=) and, when promoted, keeps the candidate."""

    profile: str
    plan: CanaryPlan
    verdict: Verdict


@dataclass(frozen=True)
class Exit:
    code: ExitCode
    reason: str


LogLevel = Literal["debug", "info", "warning", "error"]


@dataclass(frozen=True)
class Log:
    event: str
    level: LogLevel = "info"
    fields: Mapping[str, Any] = field(default_factory=dict)


Action = (
    Launch
    | StopEngine
    | SetTimer
    | CancelTimer
    | RunReadyProbe
    | NotifyReady
    | NotifyStatus
    | NotifyStopping
    | NotifyReloading
    | MarkGood
    | MarkBad
    | Exit
    | Log
    | WaitTemporary
    | RollBack
    | CanaryJudged
)
