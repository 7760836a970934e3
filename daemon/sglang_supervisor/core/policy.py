"""The lifecycle state machine: inputs in, actions out. Pure: no I/O, no clock, no randomness.

The supervisor (imperative shell) feeds two kinds of input: the `EngineEvent`s parsed from the
engine's log (`events.py`) and its own observations defined here (the engine exited, a timer
fired, a probe or health check finished, a signal arrived...). `Lifecycle.handle` answers with
`Action`s that the shell carries out (launch, stop, notify systemd, persist state, log, exit).

Deadlines are actions too: the machine asks for a named timer (`SetTimer`) and the shell feeds
`TimerFired` back, so every decision can be tested without sleeping.

Readiness is three facts together: every expected CUDA graph capture ended on every rank, SGLang
printed its ready line, and the supervisor's own first probe succeeded. "HTTP is up" is not ready:
a warmup request can still fail after the port is bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    DecodeStats,
    EngineCrashed,
    EngineEvent,
    EngineFailed,
    FailureClass,
    HttpUp,
    KVCacheAllocated,
    PrefillGraphDisabled,
    ServerReady,
    WeightsLoadBegan,
    WeightsLoaded,
)
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.wedge import Check, Tally, Verdict, judge


class Phase(str, Enum):
    PREFLIGHT = "preflight"
    LAUNCHING = "launching"
    LOADING_WEIGHTS = "loading_weights"
    CAPTURING_GRAPHS = "capturing_graphs"
    WARMING_UP = "warming_up"
    READY = "ready"
    SERVING = "serving"
    DEGRADED = "degraded"
    RESTARTING = "restarting"
    WAITING = "waiting"  # for a temporary condition (port, GPU memory) to clear
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


STARTING_PHASES = frozenset(
    {Phase.LAUNCHING, Phase.LOADING_WEIGHTS, Phase.CAPTURING_GRAPHS, Phase.WARMING_UP}
)
UP_PHASES = frozenset({Phase.READY, Phase.SERVING, Phase.DEGRADED})

# (owner, phase, rank): one capture that must end before READY. rank None = unprefixed lines (tp=1).
CaptureKey = tuple[str, str, str | None]

# Timer names the shell implements. The stall timer restarts on every byte of engine output.
STALL_TIMER = "stall"
START_TIMER = "start"
FAILURE_GRACE_TIMER = "failure_grace"
TEMPORARY_TIMER = "temporary"  # the bound on waiting for a temporary condition
# Relaunches after the engine itself reported a temporary failure back off (restart.backoff_s,
# doubled each time) up to this; a wait found by our own checks relaunches as soon as it clears.
TEMPORARY_RETRY_MAX_S = 60.0

# Failure classes that only say "something broke": a finer class seen in the same start wins.
GENERIC_FAILURES = frozenset(
    {FailureClass.SCHEDULER_EXCEPTION, FailureClass.CHILD_CRASHED, FailureClass.OTHER}
)
# Exit codes that never go down the ladder: another profile cannot fix them.
CONFIG_FAILURES = frozenset({FailureClass.UNKNOWN_FLAG})
TEMPORARY_FAILURES = frozenset({FailureClass.GPU_BUSY, FailureClass.PORT_IN_USE})

# argparse's exit status: the command line itself was rejected.
ARGPARSE_EXIT = 2

# Restart reasons that are not failures (the others are FailureClass values).
RESTART_REGRESSION = "regression"
RESTART_RELOAD = "reload"

# Passive tok/s (Decode batch lines: several a second under load) refreshes STATUS= at most this
# often; a probe result always does.
STATUS_REFRESH_S = 5.0


# ----------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class Settings:
    """What the machine needs from the configuration and the persisted state."""

    profiles: tuple[str, ...]  # the ladder, in configuration order
    remediation: Mapping[str, str] = field(default_factory=lambda: {"default": "next"})
    last_good: str | None = None  # tried first when still in the ladder
    known_bad: Mapping[str, str] = field(default_factory=dict)  # profile -> failure class
    retry_known_bad: bool = False
    # A better profile than last_good whose back-off ended (wayback.py): tried first; if it fails
    # before READY the next attempt is last_good at once.
    probation: str | None = None
    same_profile_retries: int = 1
    health_failures: int = 3
    stall_s: float = 600.0
    start_s: float = 3600.0
    backoff_s: float = 2.0
    # An engine that printed a fatal signature but did not exit is stopped after this long.
    failure_grace_s: float = 15.0
    # How long a temporary condition (port busy, GPU held by a stranger) may last before exit 75;
    # 0: exit 75 at once.
    temporary_wait_s: float = 0.0


# ----------------------------------------------------------------------------- inputs

@dataclass(frozen=True)
class Start:
    """Preflight passed: choose the first profile and launch it."""


@dataclass(frozen=True)
class Launched:
    """The engine process exists. `expected` are the captures READY waits for."""

    attempt: int
    pid: int
    expected: frozenset[CaptureKey]


@dataclass(frozen=True)
class LaunchFailed:
    """The engine could not be started at all (render problems, missing executable...)."""

    attempt: int
    message: str
    config_error: bool


@dataclass(frozen=True)
class EngineExited:
    attempt: int
    returncode: int | None  # None: it never started (a pending launch was cancelled)
    we_stopped: bool
    clean: bool = False  # the returncode is a clean stop for this engine version


@dataclass(frozen=True)
class TimerFired:
    name: str


@dataclass(frozen=True)
class ProbeOk:
    tok_s: float | None
    ttft_s: float | None = None


@dataclass(frozen=True)
class ProbeFailed:
    reason: str
    hung: bool  # it timed out (a wedge) rather than got an error


@dataclass(frozen=True)
class PassiveThroughput:
    """Tokens/s the engine generated for its own traffic (from its /metrics counters)."""

    tok_s: float


@dataclass(frozen=True)
class HealthOk:
    pass


@dataclass(frozen=True)
class HealthFailed:
    reason: str


@dataclass(frozen=True)
class DecodeProgress:
    """The engine's /metrics counters (generated tokens, decode passes) grew since the last
    scrape: it is decoding, whatever its /health says."""


@dataclass(frozen=True)
class StopRequested:
    signal: str


@dataclass(frozen=True)
class ReloadRequested:
    """The configuration was re-read successfully. `changed`: the rendered command differs."""

    changed: bool
    settings: Settings | None = None


RegressionKind = Literal["restart_same", "next_profile", "switch", "keep"]


@dataclass(frozen=True)
class RegressionDecision:
    """The throughput monitor's verdict. `profile` names the target of `switch`."""

    kind: RegressionKind
    reason: str = ""
    profile: str | None = None


@dataclass(frozen=True)
class GpuBusy:
    """A foreign process holds the GPU memory the engine needs."""

    detail: str


@dataclass(frozen=True)
class PortBusy:
    """Something else listens on the engine's port: starting would only fail minutes later."""

    detail: str


@dataclass(frozen=True)
class TemporaryCleared:
    """The condition `WaitTemporary(seq=...)` waits for is gone (the shell checked)."""

    seq: int


SupervisorInput = (
    Start
    | Launched
    | LaunchFailed
    | EngineExited
    | TimerFired
    | ProbeOk
    | ProbeFailed
    | PassiveThroughput
    | HealthOk
    | HealthFailed
    | DecodeProgress
    | StopRequested
    | ReloadRequested
    | RegressionDecision
    | GpuBusy
    | PortBusy
    | TemporaryCleared
)
Input = SupervisorInput | EngineEvent


# ----------------------------------------------------------------------------- actions

@dataclass(frozen=True)
class Launch:
    profile: str
    attempt: int
    reason: str
    delay_s: float  # backoff before spawning (after the GPU release wait)
    # Set when this launch replaces an engine of this run: the bounded `reason` label of the
    # restarts counter (a FailureClass value, RESTART_REGRESSION or RESTART_RELOAD).
    restart: str | None = None


@dataclass(frozen=True)
class StopEngine:
    reason: str


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
    the first time after `delay_s`. The policy's TEMPORARY_TIMER bounds the wait."""

    what: str
    detail: str
    delay_s: float
    seq: int


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
)


# ----------------------------------------------------------------------------- pure helpers

def classify_failure(
    returncode: int | None,
    failures: Iterable[EngineFailed],
    verdict: FailureClass | None = None,
    *,
    after_ready: bool = False,
) -> FailureClass:
    """Why a start or a run failed.

    The engine's own signature is the best witness (the first specific one: later lines are
    fallout); then the supervisor's verdict (hang, wedged); then a generic signature; then the
    exit code (argparse's 2, only before READY: a serving engine parses no command line); else
    OTHER.
    """
    seen = list(failures)
    specific = [f.failure for f in seen if f.failure not in GENERIC_FAILURES]
    if specific:
        return specific[0]
    if verdict is not None:
        return verdict
    if seen:
        return seen[0].failure
    if returncode == ARGPARSE_EXIT and not after_ready:
        return FailureClass.UNKNOWN_FLAG
    return FailureClass.OTHER


def corroborated(
    failures: Iterable[EngineFailed],
    *,
    returncode: int | None,
    after_ready: bool,
    launching: bool,
) -> tuple[list[EngineFailed], list[EngineFailed]]:
    """(failure lines the engine's lifecycle confirms, those it does not).

    A log line can be text a user sent (an echoed prompt the parser did not recognise as one):
    the classes that end the service (exit 78, exit 75) count only when what the engine did fits
    them. A rejected command line ends the engine during start-up, with argparse's exit status 2
    or before any weight was loaded; a port it cannot bind ends it before READY. After READY
    neither can be the cause of anything.
    """
    kept: list[EngineFailed] = []
    dropped: list[EngineFailed] = []
    for f in failures:
        if f.failure in CONFIG_FAILURES:
            ok = not after_ready and (returncode == ARGPARSE_EXIT or launching)
        elif f.failure is FailureClass.PORT_IN_USE:
            ok = not after_ready
        else:
            ok = True
        (kept if ok else dropped).append(f)
    return kept, dropped


def ladder_order(settings: Settings) -> tuple[str, ...]:
    """Configuration order, with the last known good profile first."""
    order = list(settings.profiles)
    if settings.last_good in order:
        order.remove(settings.last_good)
        order.insert(0, settings.last_good)
        if settings.probation in order and settings.probation != settings.last_good:
            order.remove(settings.probation)
            order.insert(0, settings.probation)
    return tuple(order)


def skipped_known_bad(settings: Settings) -> dict[str, str]:
    """Known-bad profiles this run skips. If every profile is known bad, none is skipped:
    refusing to start at all would pin the service down until the entries expire."""
    if settings.retry_known_bad:
        return {}
    bad = {p: c for p, c in settings.known_bad.items() if p in settings.profiles}
    if len(bad) >= len(settings.profiles):
        return {}
    return bad


def choose_next(
    failure: FailureClass,
    current: str | None,
    order: tuple[str, ...],
    remediation: Mapping[str, str],
    excluded: Iterable[str],
) -> tuple[str | None, str]:
    """The profile to try after `failure`, and why (a rule name for the log).

    A remediation rule maps a failure class (or "default") to a profile name, "next" or "stop".
    A named profile that was already tried or is known bad falls through to "next".
    Returns (None, why) when the ladder is exhausted or the rule says stop.
    """
    out = set(excluded)
    rule = remediation.get(failure.value, remediation.get("default", "next"))
    if rule == "stop":
        return None, f"remediation[{failure.value}]=stop"
    if rule != "next":
        if rule in order and rule not in out and rule != current:
            return rule, f"remediation[{failure.value}]={rule}"
        why = f"remediation[{failure.value}]={rule} already tried or unknown; next"
    else:
        why = "next"
    start = order.index(current) + 1 if current in order else 0
    for name in order[start:] + order[:start]:
        if name not in out and name != current:
            return name, why
    return None, "every profile tried"


# ----------------------------------------------------------------------------- the machine

def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class Attempt:
    profile: str
    attempt: int
    reason: str
    started_at: float
    ended_at: float | None = None
    outcome: str = "running"  # running | ready | failed | crashed | stopped
    failure_class: FailureClass | None = None

    def seconds(self, now: float) -> float:
        return round((self.ended_at if self.ended_at is not None else now) - self.started_at, 3)


class Lifecycle:
    """One supervisor run. Feed `handle(input, now)`; carry out the returned actions in order."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.phase = Phase.PREFLIGHT
        self.profile: str | None = None
        self.attempt = 0
        self.attempts: list[Attempt] = []
        self.tok_s: float | None = None
        self.ready_sent = False
        self.exit: Exit | None = None
        self._order = ladder_order(settings)
        self._skipped: dict[str, str] = skipped_known_bad(settings)
        self._probation: str | None = None  # the profile on probation, until READY or failure
        self._failed: set[str] = set()  # profiles that failed in this run
        self._crashes: dict[str, int] = {}  # crash-after-ready count per profile
        self._engine_alive = False
        self._stop_reason: str | None = None  # why we asked the engine to stop
        self._next_profile: str | None = None  # relaunch target after a deliberate stop
        self._expected: set[CaptureKey] = set()
        self._ended: set[CaptureKey] = set()
        self._failures: list[EngineFailed] = []
        self._failure_times: list[float] = []  # when each of _failures arrived
        self._ready_line = False
        self._probing = False
        self._reached_ready = False  # this attempt reached READY
        self._health_misses = 0
        self._wedge = Tally()  # wedge.judge's counts (health misses, hung probes)
        self._progress = False  # decode progress (log or /metrics) since the last check result
        self._reload_pending = False
        self._phase_since = 0.0
        self._tok_status_at = float("-inf")  # when STATUS= last showed a fresh tok/s
        # Waiting for a temporary condition: (class, detail, profile to relaunch or None for the
        # first), the wait's number, when the whole spell must end, temporary failures so far.
        self._waiting: tuple[FailureClass, str, str | None] | None = None
        self._wait_seq = 0
        self._temp_deadline: float | None = None
        self._temp_failures = 0
        self._gpu_busy_detail = "GPU held by a foreign process"

    # -- public ---------------------------------------------------------------------------

    def handle(self, inp: Input, now: float) -> list[Action]:
        if self.phase in (Phase.STOPPED, Phase.FAILED):
            return []
        if isinstance(inp, EngineEvent):
            return self._on_engine_event(inp, now)
        handler = getattr(self, f"_on_{type(inp).__name__}")
        actions: list[Action] = handler(inp, now)
        return actions

    def snapshot(self, now: float) -> dict[str, Any]:
        """Status for `/status` and the demo summary (no secrets: names and numbers only)."""
        return {
            "phase": self.phase.value,
            "profile": self.profile,
            "attempt": self.attempt,
            "ready": self.phase in UP_PHASES,
            "tok_s": self.tok_s,
            "phase_seconds": round(now - self._phase_since, 3),
            "captures_expected": len(self._expected),
            "captures_ended": len(self._ended & self._expected),
            "failed_profiles": sorted(self._failed),
            "skipped_known_bad": dict(self._skipped),
            "waiting_for": ({"failure_class": self._waiting[0].value, "detail": self._waiting[1]}
                            if self._waiting is not None else None),
            "attempts": [
                {
                    "profile": a.profile,
                    "attempt": a.attempt,
                    "reason": a.reason,
                    "outcome": a.outcome,
                    "failure_class": a.failure_class.value if a.failure_class else None,
                    "seconds": a.seconds(now),
                }
                for a in self.attempts
            ],
        }

    @property
    def wait_seq(self) -> int | None:
        """The number of the temporary wait under way (see WaitTemporary), or None."""
        return self._wait_seq if self._waiting is not None else None

    def status_text(self) -> str:
        if self.phase == Phase.WAITING and self._waiting is not None:
            failure, detail, _ = self._waiting
            return (f"waiting: {failure.value}: {detail}; retrying when it clears, exit 75 after "
                    f"{self.settings.temporary_wait_s:g} s")
        parts = [self.phase.value]
        if self.profile:
            parts.append(f"profile={self.profile}")
        if self.tok_s is not None:
            parts.append(f"tok/s={self.tok_s:.1f}")
        if self._expected and self.phase == Phase.CAPTURING_GRAPHS:
            parts.append(f"graphs={len(self._ended & self._expected)}/{len(self._expected)}")
        return " ".join(parts)

    # -- helpers --------------------------------------------------------------------------

    def _set_phase(self, phase: Phase, now: float) -> list[Action]:
        if phase == self.phase:
            return []
        self.phase = phase
        self._phase_since = now
        return [NotifyStatus(self.status_text())]

    def _current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def _close_attempt(self, now: float, outcome: str, failure: FailureClass | None) -> None:
        cur = self._current()
        if cur is None or cur.ended_at is not None:
            return
        cur.ended_at = now
        # An attempt that reached READY keeps that outcome when it is later stopped on purpose.
        if not (cur.outcome == "ready" and outcome == "stopped"):
            cur.outcome = outcome
        cur.failure_class = failure

    def _exit(self, code: ExitCode, reason: str, now: float) -> list[Action]:
        self.exit = Exit(code, reason)
        acts: list[Action] = []
        if code == ExitCode.OK:
            acts += self._set_phase(Phase.STOPPED, now)
        else:
            acts += self._set_phase(Phase.FAILED, now)
        level: LogLevel = "info" if code == ExitCode.OK else "error"
        acts.append(Log("supervisor.exit", level, {"code": int(code), "reason": reason}))
        acts.append(self.exit)
        return acts

    def _stopped_by_signal(self, now: float) -> list[Action]:
        self._close_attempt(now, "stopped", None)
        return self._exit(ExitCode.OK, "stopped by signal", now)

    def _cancel_timers(self) -> list[Action]:
        return [CancelTimer(STALL_TIMER), CancelTimer(START_TIMER), CancelTimer(FAILURE_GRACE_TIMER)]

    def _launch(self, profile: str, reason: str, now: float, delay_s: float,
                restart: str | None = None) -> list[Action]:
        self.attempt += 1
        self.profile = profile
        self._waiting = None  # a launch (after the wait, or a reload) ends any wait
        self.attempts.append(Attempt(profile, self.attempt, reason, started_at=now))
        self._engine_alive = True
        self._stop_reason = None
        self._next_profile = None
        self._expected = set()
        self._ended = set()
        self._failures = []
        self._failure_times = []
        self._ready_line = False
        self._probing = False
        self._reached_ready = False
        self._health_misses = 0
        self._wedge = Tally()
        self._progress = False
        acts: list[Action] = []
        acts += self._set_phase(Phase.LAUNCHING, now)
        acts.append(Log("engine.launch", "info",
                        {"profile": profile, "attempt": self.attempt, "reason": reason}))
        acts.append(Launch(profile, self.attempt, reason, delay_s, restart))
        acts.append(SetTimer(STALL_TIMER, self.settings.stall_s, reset_on_output=True))
        acts.append(SetTimer(START_TIMER, self.settings.start_s + delay_s))
        return acts

    def _stop(self, reason: str) -> list[Action]:
        if self._stop_reason is not None:
            return []  # already stopping; the first reason decides what happens next
        self._stop_reason = reason
        return [*self._cancel_timers(), Log("engine.stop", "info", {"profile": self.profile,
                                                                    "reason": reason}),
                StopEngine(reason)]

    def _excluded(self) -> set[str]:
        return self._failed | set(self._skipped)

    def _fail_over(self, failure: FailureClass, message: str, now: float,
                   after_ready: bool) -> list[Action]:
        """The current attempt is over because of `failure`: retry, fall back, or exit."""
        profile = self.profile or ""
        acts: list[Action] = []
        self._close_attempt(now, "crashed" if after_ready else "failed", failure)
        acts.append(Log("engine.failed", "error", {
            "profile": profile, "attempt": self.attempt, "failure_class": failure.value,
            "message": message, "after_ready": after_ready,
            "seconds": self.attempts[-1].seconds(now) if self.attempts else 0.0,
        }))
        if failure in CONFIG_FAILURES:
            return acts + self._exit(ExitCode.CONFIG, f"{failure.value}: {message}", now)
        if failure in TEMPORARY_FAILURES:
            # Not the profile's fault: the same profile again once the condition clears.
            return acts + self._wait_temporary(failure, message, now, profile, engine_said=True)
        if after_ready:
            count = self._crashes.get(profile, 0) + 1
            self._crashes[profile] = count
            if count <= self.settings.same_profile_retries:
                acts.append(Log("profile.retry_same", "warning", {
                    "profile": profile, "failure_class": failure.value, "retry": count,
                    "of": self.settings.same_profile_retries}))
                acts += self._set_phase(Phase.RESTARTING, now)
                return acts + self._launch(profile, f"retry after {failure.value}", now,
                                           self.settings.backoff_s, failure.value)
        self._failed.add(profile)
        acts.append(MarkBad(profile, failure))
        target, why = choose_next(failure, profile, self._order, self.settings.remediation,
                                  self._excluded())
        back = self.settings.last_good
        if self._probation == profile and back is not None and back not in self._failed:
            # Probation failed: straight back to what served last, whatever the rule says.
            target, why = back, "probation failed: back to the last good profile"
        self._probation = None
        if target is None:
            return acts + self._exit(
                ExitCode.ALL_PROFILES_FAILED,
                f"no profile left to try after {profile} failed with {failure.value} ({why})", now)
        acts.append(Log("profile.fallback", "warning", {
            "from_profile": profile, "to_profile": target, "failure_class": failure.value,
            "rule": why}))
        acts += self._set_phase(Phase.RESTARTING, now)
        return acts + self._launch(target, f"fallback after {failure.value}", now,
                                   self.settings.backoff_s, failure.value)

    def _ready_gate(self, now: float) -> list[Action]:
        """Start the first probe once every capture ended and the ready line was printed."""
        if self._probing or not self._ready_line or self.phase not in STARTING_PHASES:
            return []
        missing = sorted(self._expected - self._ended, key=str)
        if missing:
            names = ", ".join(f"{o} {p}@{r or 'main'}" for o, p, r in missing)
            self._failures.append(EngineFailed(
                line_no=0, rank=None, failure=FailureClass.CAPTURE_FAILED,
                message=f"ready line without these CUDA graph captures: {names}"))
            self._failure_times.append(now)
            return [Log("engine.capture_missing", "error", {"profile": self.profile,
                                                            "missing": names}),
                    *self._stop("capture_missing")]
        self._probing = True
        return [*self._set_phase(Phase.WARMING_UP, now), RunReadyProbe(self.attempt)]

    # -- engine events --------------------------------------------------------------------

    def _on_engine_event(self, ev: EngineEvent, now: float) -> list[Action]:
        acts: list[Action] = []
        starting = self.phase in STARTING_PHASES
        if isinstance(ev, EngineFailed | EngineCrashed):
            if any(f.line_no == ev.line_no and ev.line_no for f in self._failures):
                # The parser reports a crash line both as EngineCrashed and as its EngineFailed
                # signature: one line, one failure.
                return acts
            failed = ev if isinstance(ev, EngineFailed) else EngineFailed(
                ev.line_no, ev.rank, FailureClass.CHILD_CRASHED, ev.message)
            first = not self._failures
            self._failures.append(failed)
            self._failure_times.append(now)
            serving = self.phase in UP_PHASES
            acts.append(Log("engine.failure_line", "warning" if serving else "error", {
                "profile": self.profile, "failure_class": failed.failure.value,
                "rank": ev.rank, "line": ev.line_no, "message": failed.message,
                "while_serving": serving}))
            # One line never stops an engine users can reach (HTTP up: warming up or serving): it
            # may be text a user sent (SGLang prints request dict keys unescaped). What the engine
            # does next decides (it exits, or its ready probe, health checks and probes fail).
            reachable = serving or self.phase == Phase.WARMING_UP
            if first and self._engine_alive and self._stop_reason is None and not reachable:
                acts.append(SetTimer(FAILURE_GRACE_TIMER, self.settings.failure_grace_s))
            return acts
        if isinstance(ev, DecodeStats):
            self._progress = True  # a `Decode batch` line: decode steps ran since the last one
        if isinstance(ev, DecodeStats) and ev.gen_throughput is not None and ev.running_req:
            return acts + self._throughput(ev.gen_throughput, now, force=False)
        if not starting:
            return acts
        if isinstance(ev, WeightsLoadBegan):
            acts += self._set_phase(Phase.LOADING_WEIGHTS, now)
            acts.append(Log("engine.weights_begin", "info", {"profile": self.profile,
                                                              "rank": ev.rank}))
        elif isinstance(ev, WeightsLoaded):
            acts.append(Log("engine.weights_loaded", "info", {
                "profile": self.profile, "rank": ev.rank, "seconds": ev.elapsed_s,
                "mem_usage_gb": ev.mem_usage_gb}))
        elif isinstance(ev, KVCacheAllocated):
            acts.append(Log("engine.kv_cache", "info", {"profile": self.profile, "rank": ev.rank,
                                                         "tokens": ev.tokens}))
        elif isinstance(ev, CaptureBegan):
            acts += self._set_phase(Phase.CAPTURING_GRAPHS, now)
            acts.append(Log("engine.capture_begin", "info", {
                "profile": self.profile, "owner": ev.owner, "graph": ev.phase, "rank": ev.rank,
                "backend": ev.backend}))
        elif isinstance(ev, CaptureEnded):
            self._ended.add((ev.owner, ev.phase, ev.rank))
            acts.append(Log("engine.capture_end", "info", {
                "profile": self.profile, "owner": ev.owner, "graph": ev.phase, "rank": ev.rank,
                "seconds": ev.elapsed_s, "mem_usage_gb": ev.mem_usage_gb,
                "done": len(self._ended & self._expected), "expected": len(self._expected)}))
            if self.phase == Phase.CAPTURING_GRAPHS:
                acts.append(NotifyStatus(self.status_text()))
        elif isinstance(ev, PrefillGraphDisabled):
            # The engine decided against prefill graphs (target and draft) on that rank, or on
            # every rank when the unprefixed main process said so: do not wait for them.
            self._expected = {k for k in self._expected
                              if not (k[1] in ("prefill", "piecewise")
                                      and (ev.rank is None or k[2] == ev.rank))}
            acts.append(Log("engine.prefill_graph_disabled", "warning",
                            {"profile": self.profile, "reason": ev.reason}))
        elif isinstance(ev, HttpUp):
            acts += self._set_phase(Phase.WARMING_UP, now)
            acts.append(Log("engine.http_up", "info", {"profile": self.profile, "host": ev.host,
                                                        "port": ev.port}))
        elif isinstance(ev, ServerReady):
            self._ready_line = True
            acts.append(Log("engine.ready", "info", {
                "profile": self.profile, "attempt": self.attempt,
                "seconds": self.attempts[-1].seconds(now) if self.attempts else None}))
            acts += self._ready_gate(now)
        return acts

    # -- supervisor inputs ----------------------------------------------------------------

    def _on_Start(self, inp: Start, now: float) -> list[Action]:
        acts: list[Action] = []
        for name, cls in self._skipped.items():
            acts.append(Log("profile.known_bad_skipped", "warning",
                            {"profile": name, "failure_class": cls}))
        if self.settings.known_bad and not self._skipped and not self.settings.retry_known_bad:
            acts.append(Log("profile.known_bad_all", "warning", {
                "profiles": sorted(self.settings.known_bad),
                "hint": "every profile is known bad: trying them all again"}))
        first = next((p for p in self._order if p not in self._skipped), None)
        if first is None:  # unreachable while skipped_known_bad keeps one, kept for safety
            return acts + self._exit(ExitCode.ALL_PROFILES_FAILED, "no profile to start", now)
        reason = "last known good" if first == self.settings.last_good else "first profile"
        if first == self.settings.probation and self.settings.last_good is not None:
            self._probation = first
            reason = "probation"
            acts.append(Log("profile.probation", "warning", {
                "profile": first, "last_good": self.settings.last_good,
                "hint": "a better profile's back-off ended: trying it again; if it fails, back to "
                        "the last good profile at once"}))
        return acts + self._launch(first, reason, now, 0.0)

    def _on_Launched(self, inp: Launched, now: float) -> list[Action]:
        if inp.attempt != self.attempt:
            return []
        self._expected = set(inp.expected)
        return [Log("engine.spawned", "info", {"profile": self.profile, "attempt": inp.attempt,
                                                "pid": inp.pid,
                                                "captures_expected": len(inp.expected)})]

    def _on_LaunchFailed(self, inp: LaunchFailed, now: float) -> list[Action]:
        if inp.attempt != self.attempt:
            return []
        self._engine_alive = False
        acts: list[Action] = list(self._cancel_timers())
        if inp.config_error:
            self._close_attempt(now, "failed", FailureClass.UNKNOWN_FLAG)
            acts.append(Log("engine.launch_failed", "error", {"profile": self.profile,
                                                               "message": inp.message}))
            return acts + self._exit(ExitCode.CONFIG, inp.message, now)
        if self._stop_reason == "signal":
            return acts + self._stopped_by_signal(now)
        return acts + self._fail_over(FailureClass.OTHER, inp.message, now, after_ready=False)

    def _on_EngineExited(self, inp: EngineExited, now: float) -> list[Action]:
        if inp.attempt != self.attempt or not self._engine_alive:
            return []
        self._engine_alive = False
        acts: list[Action] = list(self._cancel_timers())
        acts.append(Log("engine.exited", "info" if inp.we_stopped else "warning", {
            "profile": self.profile, "attempt": inp.attempt, "returncode": inp.returncode,
            "we_stopped": inp.we_stopped, "clean": inp.clean}))
        reason = self._stop_reason
        if reason == "signal":
            return acts + self._stopped_by_signal(now)
        if reason == "gpu_busy":
            self._close_attempt(now, "failed", FailureClass.GPU_BUSY)
            return acts + self._wait_temporary(FailureClass.GPU_BUSY, self._gpu_busy_detail, now,
                                               self.profile, engine_said=False)
        if reason in ("reload", "regression"):
            self._close_attempt(now, "stopped", None)
            target = self._next_profile or self.profile or self._order[0]
            acts += self._set_phase(Phase.RESTARTING, now)
            restart = RESTART_RELOAD if reason == "reload" else RESTART_REGRESSION
            return acts + self._launch(target, reason, now, self.settings.backoff_s, restart)
        verdict = {
            "hang": FailureClass.HANG,
            "start_timeout": FailureClass.HANG,
            "wedged": FailureClass.WEDGED,
            "probe_hung": FailureClass.WEDGED,
            "probe_failed": FailureClass.WARMUP_FAILED,
            "capture_missing": FailureClass.CAPTURE_FAILED,
        }.get(reason or "")
        failures, dropped = corroborated(
            self._failures, returncode=inp.returncode, after_ready=self._reached_ready,
            launching=self.phase == Phase.LAUNCHING)
        for f in dropped:
            acts.append(Log("engine.failure_line_uncorroborated", "warning", {
                "profile": self.profile, "failure_class": f.failure.value, "line": f.line_no,
                "returncode": inp.returncode, "after_ready": self._reached_ready,
                "hint": "the engine did not fail the way this line says; not acted on"}))
        failure = classify_failure(inp.returncode, failures, verdict, after_ready=self._reached_ready)
        witness = next((f for f in failures if f.failure is failure), failures[0] if failures else None)
        if witness is not None:
            message = witness.message
        elif reason is None:
            message = f"engine exited with returncode {inp.returncode}"
        else:
            message = f"stopped by the supervisor: {reason}"
        return acts + self._fail_over(failure, message, now, after_ready=self._reached_ready)

    def _on_TimerFired(self, inp: TimerFired, now: float) -> list[Action]:
        if inp.name == TEMPORARY_TIMER:
            if self._waiting is None or self._engine_alive:
                return []
            failure, detail, _ = self._waiting
            self._waiting = None
            return self._temporary_exit(failure, detail, now)
        if not self._engine_alive or self._stop_reason is not None:
            return []
        if inp.name == STALL_TIMER and self.phase in STARTING_PHASES:
            return [Log("engine.hang", "error", {"profile": self.profile, "phase": self.phase.value,
                                                 "stall_s": self.settings.stall_s}),
                    *self._stop("hang")]
        if inp.name == START_TIMER and self.phase in STARTING_PHASES:
            return [Log("engine.start_timeout", "error", {"profile": self.profile,
                                                          "start_s": self.settings.start_s}),
                    *self._stop("start_timeout")]
        if inp.name == FAILURE_GRACE_TIMER and self.phase not in UP_PHASES:
            return self._stop("failed")
        return []

    def _on_ProbeOk(self, inp: ProbeOk, now: float) -> list[Action]:
        if inp.tok_s is not None:
            self.tok_s = inp.tok_s
        acts: list[Action] = []
        if self._probing and self.phase in STARTING_PHASES:
            self._probing = False
            self._reached_ready = True
            self._temp_deadline, self._temp_failures = None, 0  # a spell of waiting is over
            cur = self._current()
            if cur is not None:
                cur.outcome = "ready"
            acts += self._cancel_timers()
            # No STATUS= of its own: READY=1 carries the status in the same datagram, so systemd
            # never shows "ready" while the unit is still activating.
            acts += [a for a in self._set_phase(Phase.READY, now) if not isinstance(a, NotifyStatus)]
            acts.append(MarkGood(self.profile or "", cur.seconds(now) if cur else None))
            if self._probation == self.profile:
                acts.append(Log("profile.probation_passed", "info", {"profile": self.profile}))
            self._probation = None
            acts.append(Log("supervisor.ready", "info", {
                "profile": self.profile, "attempt": self.attempt, "tok_s": _round(inp.tok_s, 1),
                "ttft_s": _round(inp.ttft_s, 3), "seconds": cur.seconds(now) if cur else None}))
            acts.append(NotifyReady())
            self.ready_sent = True
            self._reload_pending = False
            acts += self._set_phase(Phase.SERVING, now)
            return acts
        if self.phase in UP_PHASES:
            acts.append(Log("probe.ok", "info", {"profile": self.profile,
                                                 "tok_s": _round(inp.tok_s, 1),
                                                 "ttft_s": _round(inp.ttft_s, 3)}))
            # A generation that completed proves more than /health: it ends a degraded spell too.
            acts += self._judge(Check.PROBE_OK, "", now)
            acts += self._throughput(self.tok_s, now, force=True)
        return acts

    def _on_PassiveThroughput(self, inp: PassiveThroughput, now: float) -> list[Action]:
        return self._throughput(inp.tok_s, now, force=False)

    def _throughput(self, tok_s: float | None, now: float, *, force: bool) -> list[Action]:
        """A fresh tok/s figure. While up, STATUS= shows it (`systemctl status` is where an
        operator looks); passive figures at most every STATUS_REFRESH_S."""
        if tok_s is not None:
            self.tok_s = tok_s
        if self.phase not in UP_PHASES or (not force and now - self._tok_status_at < STATUS_REFRESH_S):
            return []
        self._tok_status_at = now
        return [NotifyStatus(self.status_text())]

    def _on_ProbeFailed(self, inp: ProbeFailed, now: float) -> list[Action]:
        if self._probing and self.phase in STARTING_PHASES and self._stop_reason is None:
            self._probing = False
            return [Log("probe.failed", "error", {"profile": self.profile, "reason": inp.reason,
                                                  "hung": inp.hung, "gate": "ready"}),
                    *self._stop("probe_hung" if inp.hung else "probe_failed")]
        if self.phase in UP_PHASES:
            # A probe failing while serving counts like a failed health check, and hung probes
            # have their own count that a good /health does not clear (alive but not serving).
            check = Check.PROBE_HUNG if inp.hung else Check.HEALTH_FAILED
            return self._judge(check, f"probe: {inp.reason}", now)
        return []

    def _on_HealthOk(self, inp: HealthOk, now: float) -> list[Action]:
        return self._judge(Check.HEALTH_OK, "", now)

    def _refute_failures(self, now: float) -> list[Action]:
        """The engine answered more than `failure_grace_s` after a failure line: that line did
        not bring it down, so it explains nothing that happens later. Within the grace the
        answer may predate the failure (an engine takes a few seconds to die)."""
        if self.phase not in UP_PHASES or not self._failures:
            return []
        limit = now - self.settings.failure_grace_s
        timed = list(zip(self._failures, self._failure_times, strict=True))
        gone = [f for f, t in timed if t <= limit]
        if not gone:
            return []
        self._failures = [f for f, t in timed if t > limit]
        self._failure_times = [t for t in self._failure_times if t > limit]
        return [Log("engine.failure_line_refuted", "info", {
            "profile": self.profile, "failure_classes": sorted({f.failure.value for f in gone}),
            "lines": [f.line_no for f in gone], "reason": "the engine kept serving"})]

    def _on_HealthFailed(self, inp: HealthFailed, now: float) -> list[Action]:
        return self._judge(Check.HEALTH_FAILED, inp.reason, now)

    def _on_DecodeProgress(self, inp: DecodeProgress, now: float) -> list[Action]:
        self._progress = True
        return []

    def _judge(self, check: Check, reason: str, now: float) -> list[Action]:
        """One health or probe result through `wedge.judge`: busy is not wedged, alive is not
        serving."""
        progress, self._progress = self._progress, False
        if check in (Check.HEALTH_OK, Check.PROBE_OK):
            refuted = self._refute_failures(now)
            verdict, self._wedge = judge(self._wedge, check, progress=progress,
                                         limit=self.settings.health_failures)
            self._health_misses = self._wedge.misses
            # Hung probes still counted: the engine answers /health but has not served yet.
            if self.phase == Phase.DEGRADED and self._stop_reason is None and not self._wedge.hung_probes:
                return [*refuted, Log("health.recovered", "info", {"profile": self.profile}),
                        *self._set_phase(Phase.SERVING, now)]
            return refuted
        if self.phase not in UP_PHASES or self._stop_reason is not None:
            return []
        verdict, self._wedge = judge(self._wedge, check, progress=progress,
                                     limit=self.settings.health_failures)
        self._health_misses = self._wedge.misses
        if verdict is Verdict.BUSY:
            busy: list[Action] = [Log("health.busy", "info", {
                "profile": self.profile, "reason": reason,
                "why": "the engine made decode progress since the last check: busy, not wedged"})]
            # Progress proves it serves: a degraded spell (earlier failures) is over.
            return busy + (self._set_phase(Phase.SERVING, now) if self.phase == Phase.DEGRADED else [])
        acts: list[Action] = [Log("health.failed", "warning", {
            "profile": self.profile, "reason": reason, "misses": self._wedge.misses,
            "hung_probes": self._wedge.hung_probes, "limit": self.settings.health_failures})]
        if verdict is Verdict.NOT_SERVING:
            acts.append(Log("engine.wedged", "error", {
                "profile": self.profile, "misses": self._wedge.misses,
                "hung_probes": self._wedge.hung_probes,
                "why": "alive but not serving: generations hang with no decode progress"}))
            return acts + self._stop("wedged")
        if verdict is Verdict.WEDGED:
            acts.append(Log("engine.wedged", "error", {"profile": self.profile,
                                                       "misses": self._wedge.misses}))
            return acts + self._stop("wedged")
        return acts + self._set_phase(Phase.DEGRADED, now)

    def _on_StopRequested(self, inp: StopRequested, now: float) -> list[Action]:
        acts: list[Action] = [NotifyStopping(),
                              Log("supervisor.stopping", "info", {"signal": inp.signal,
                                                                  "phase": self.phase.value})]
        acts += self._set_phase(Phase.STOPPING, now)
        if not self._engine_alive:
            return acts + self._exit(ExitCode.OK, f"stopped by {inp.signal}", now)
        # A stop overrides whatever stop was already under way (reload, fallback...).
        self._stop_reason = None
        return acts + self._stop("signal")

    def _on_ReloadRequested(self, inp: ReloadRequested, now: float) -> list[Action]:
        if self.phase == Phase.STOPPING:
            return []
        acts: list[Action] = []
        if self.ready_sent:
            acts.append(NotifyReloading())
        acts.append(Log("supervisor.reload", "info", {"changed": inp.changed,
                                                      "profile": self.profile}))
        if inp.settings is not None:
            self.settings = inp.settings
            self._order = ladder_order(inp.settings)
            self._skipped = skipped_known_bad(inp.settings)
        if not inp.changed:
            if self.ready_sent and self.phase in UP_PHASES:
                acts.append(NotifyReady())
            return acts
        # The command changed: give every profile a fresh chance under the new configuration.
        self._failed.clear()
        self._crashes.clear()
        target = self.profile if self.profile in self._order else self._order[0]
        if not self._engine_alive:
            return acts + self._launch(target, "reload", now, 0.0,
                                       RESTART_RELOAD if self.attempt else None)
        self._next_profile = target
        acts += self._stop("reload")
        if self._stop_reason == "reload":
            acts += self._set_phase(Phase.RESTARTING, now)
        return acts

    def _on_RegressionDecision(self, inp: RegressionDecision, now: float) -> list[Action]:
        fields = {"profile": self.profile, "decision": inp.kind, "reason": inp.reason,
                  "target": inp.profile}
        if inp.kind == "keep" or self.phase not in UP_PHASES or self._stop_reason is not None:
            return [Log("regression.decision", "info", fields)]
        acts: list[Action] = [Log("regression.decision", "warning", fields)]
        if inp.kind == "restart_same":
            target: str | None = self.profile
        elif inp.kind == "switch":
            target = inp.profile if inp.profile in self._order else None
        else:
            target, _ = choose_next(FailureClass.OTHER, self.profile, self._order,
                                    {"default": "next"}, self._excluded())
        if target is None:
            return [*acts, Log("regression.no_target", "warning", fields)]
        self._next_profile = target
        acts += self._stop("regression")
        acts += self._set_phase(Phase.RESTARTING, now)
        return acts

    def _on_GpuBusy(self, inp: GpuBusy, now: float) -> list[Action]:
        acts: list[Action] = [Log("gpu.busy", "error", {"detail": inp.detail})]
        self._gpu_busy_detail = f"GPU held by a foreign process: {inp.detail}"
        if self._engine_alive:
            self._stop_reason = None
            return acts + self._stop("gpu_busy")
        self._close_attempt(now, "failed", FailureClass.GPU_BUSY)
        return acts + self._wait_temporary(FailureClass.GPU_BUSY, self._gpu_busy_detail, now,
                                           self.profile, engine_said=False)

    def _on_PortBusy(self, inp: PortBusy, now: float) -> list[Action]:
        if self._engine_alive:  # only meaningful before a launch: the engine owns its port
            return []
        return [Log("engine.port_in_use", "error", {"detail": inp.detail}),
                *self._wait_temporary(FailureClass.PORT_IN_USE, f"engine port busy: {inp.detail}",
                                      now, self.profile, engine_said=False)]

    def _on_TemporaryCleared(self, inp: TemporaryCleared, now: float) -> list[Action]:
        if self._waiting is None or inp.seq != self._wait_seq or self._engine_alive:
            return []  # a wait that a launch (reload) or a stop already ended
        failure, _, profile = self._waiting
        self._waiting = None
        acts: list[Action] = [CancelTimer(TEMPORARY_TIMER),
                              Log("supervisor.wait_over", "info", {
                                  "failure_class": failure.value, "profile": profile})]
        if profile is None:
            return acts + self._on_Start(Start(), now)
        acts += self._set_phase(Phase.RESTARTING, now)
        return acts + self._launch(profile, f"after {failure.value} cleared", now, 0.0,
                                   failure.value)

    def _temporary_exit(self, failure: FailureClass, detail: str, now: float) -> list[Action]:
        wait_s = self.settings.temporary_wait_s
        why = f" did not clear within {wait_s:g} s" if wait_s > 0 else ""
        return self._exit(ExitCode.TEMPORARY, f"{failure.value}{why}: {detail}", now)

    def _wait_temporary(self, failure: FailureClass, detail: str, now: float,
                        profile: str | None, *, engine_said: bool) -> list[Action]:
        """Wait (bounded by `temporary_wait_s` over the whole spell) for a temporary condition
        to clear, then relaunch `profile` (None: start the ladder); past the bound, exit 75.

        Systemd's start limit would end the unit for good after a few quick 75s: waiting here
        keeps a port held for a minute from needing a person."""
        if self._temp_deadline is None:
            self._temp_deadline = now + self.settings.temporary_wait_s
        left = self._temp_deadline - now
        if left <= 0:
            return self._temporary_exit(failure, detail, now)
        self._temp_failures += 1
        delay = (min(self.settings.backoff_s * 2 ** (self._temp_failures - 1),
                     TEMPORARY_RETRY_MAX_S) if engine_said else 0.0)
        self._wait_seq += 1
        self._waiting = (failure, detail, profile)
        acts: list[Action] = [Log("supervisor.waiting", "warning", {
            "failure_class": failure.value, "detail": detail, "profile": profile,
            "retry_after_s": delay, "exit_in_s": round(left, 3)})]
        acts += self._set_phase(Phase.WAITING, now)
        what = "port" if failure is FailureClass.PORT_IN_USE else "gpu"
        return [*acts, SetTimer(TEMPORARY_TIMER, left),
                WaitTemporary(what, detail, delay, self._wait_seq)]
