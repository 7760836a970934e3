"""What the lifecycle is given: its settings, and the supervisor's own observations.

The shell feeds two kinds of input to `Lifecycle.handle`: the `EngineEvent`s parsed from the
engine's log (`events.py`) and the observations defined here (the engine exited, a timer fired,
a probe or health check finished, a signal arrived...). `SupervisorInput` is a closed union:
`Lifecycle.handle` matches on it and mypy proves that every member has a case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sglang_supervisor.core.canary import FIDELITY_NOT_CHECKED, CanaryPlan
from sglang_supervisor.core.derive import Derivation
from sglang_supervisor.core.events import EngineEvent
from sglang_supervisor.core.readiness import CaptureKey

# Timer names the shell implements. The stall timer restarts on every byte of engine output.
STALL_TIMER = "stall"
START_TIMER = "start"
FAILURE_GRACE_TIMER = "failure_grace"
TEMPORARY_TIMER = "temporary"  # the bound on waiting for a temporary condition


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
    # The options each profile's command line sets (engine/argv.options_set): after SGLang refuses
    # a flag on this machine, the profiles that pass it too are not tried.
    profile_flags: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Derived profiles (core/derive.py): each profile's effective flags (names without --), the
    # failure classes that derive, and the most derived steps per written rung (0: off).
    profile_args: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    derive_on: frozenset[str] = frozenset()
    derived_steps: int = 0
    # Derived profiles that served on this machine before (in `profiles`, after their base).
    derived: Mapping[str, Derivation] = field(default_factory=dict)


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
    # An upgrade canary's fidelity (core/canary.py): the ready gate's check of the candidate
    # against the model's reference, "pass", "fail", "unavailable" or "not_checked", and what
    # differed (or why no sample), bounded. Outside a canary a mismatch is `FidelityFailed`.
    fidelity: str = FIDELITY_NOT_CHECKED
    fidelity_detail: str = ""


@dataclass(frozen=True)
class ProbeFailed:
    reason: str
    hung: bool  # it timed out (a wedge) rather than got an error


@dataclass(frozen=True)
class FidelityFailed:
    """The engine's outputs disagree with the model's fidelity reference (core/fidelity.judge):
    at the ready gate (never READY) or while serving. Texts are bounded and redacted."""

    reason: str  # core.fidelity.Reason: prefix, logprob, tokens, accept_collapse, shape
    detail: str
    prompt: str | None = None
    expected: str | None = None
    received: str | None = None
    at_ready: bool = True  # the ready gate's check (False: a periodic check while serving)


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
    # An upgrade canary (core/canary.py): the changed command runs a candidate SGLang release,
    # judged at READY against the current release's reference, rolled back when worse.
    canary: CanaryPlan | None = None


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
    | FidelityFailed
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
