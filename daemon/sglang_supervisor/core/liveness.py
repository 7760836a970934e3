"""When is the engine hung or wedged, and how far ahead systemd's deadlines are kept: pure.

Every deadline the shell keeps is decided here from facts it passes in (`now` and the times of
the last output, the last extension, ...); the shell only reads the clock and sleeps. The
lifecycle (`policy`) asks for named timers (`SetTimer`); this module says when one of them is due,
so that output moving a stall deadline is a table row, not an asyncio callback.

- Timers: a launch arms a stall and a start deadline; a timer armed with `reset_on_output` (the
  stall timer) is due `seconds` after the later of its arming and the engine's last output; other
  timers are due when their delay ends; what a fired timer means in each phase is `timer_verdict`.
- systemd's start deadline (EXTEND_TIMEOUT_USEC): kept ahead while the engine's log moves during
  a start (a stalled log lets our own stall timer decide first), while a temporary condition is
  waited out, and before a planned stop's drain.
- Health rounds: progress of the engine's decode counters between two rounds makes a failed
  check "busy" (`wedge.judge` turns the evidence into a verdict).
- Probes: a completed generation is good evidence, a timed-out one is a hung probe; the probe
  that gates READY is retried until `timeouts.ready_probe_s`.
- Stops: a planned stop gets the full drain; after a failure or a hang SIGTERM is a formality.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sglang_supervisor.core.actions import SetTimer
from sglang_supervisor.core.inputs import FAILURE_GRACE_TIMER, STALL_TIMER, START_TIMER
from sglang_supervisor.core.phases import STARTING_PHASES, UP_PHASES, Phase
from sglang_supervisor.core.reasons import StopReason
from sglang_supervisor.core.rotation import planned
from sglang_supervisor.core.wedge import Check, counters_grew

# The drain a failed or hung engine gets: a wedged SGLang waits a minute for core dumps.
FAILED_STOP_DRAIN_S = 2.0
# While a start waits out a temporary condition (port or GPU busy): how often it is checked and
# how far ahead systemd's start deadline is kept (restart.temporary_wait_s bounds the wait).
TEMPORARY_POLL_S = 1.0
TEMPORARY_EXTEND_S = 60.0
# Margin added to systemd's deadline on top of our own bounds (log stall, drain, kill).
START_EXTEND_MARGIN_S = 30.0
STOP_EXTEND_MARGIN_S = 5.0
# The most often the start deadline is extended while the log moves.
START_EXTEND_EVERY_MAX_S = 10.0
# The READY gate's probe: the pause between tries, and the shortest wait for one answer.
READY_PROBE_RETRY_S = 0.5
READY_PROBE_MIN_WAIT_S = 0.1


def launch_timers(*, stall_s: float, start_s: float, delay_s: float) -> tuple[SetTimer, SetTimer]:
    """The deadlines a launch arms: the log may stall for `stall_s` (output moves it), and the
    whole start, from the launch (its backoff delay included), may take `start_s`."""
    return (SetTimer(STALL_TIMER, stall_s, reset_on_output=True),
            SetTimer(START_TIMER, start_s + delay_s))


def timer_verdict(name: str, phase: Phase) -> StopReason | None:
    """A lifecycle timer fired while its engine runs (and is not being stopped): why the engine
    is stopped now, or None when that timer means nothing in this phase. A stalled log or an
    overlong start only count while starting; a failure line the engine outlived by
    `failure_grace_s` counts until it is up."""
    if name == STALL_TIMER and phase in STARTING_PHASES:
        return StopReason.HANG
    if name == START_TIMER and phase in STARTING_PHASES:
        return StopReason.START_TIMEOUT
    if name == FAILURE_GRACE_TIMER and phase not in UP_PHASES:
        return StopReason.FAILED
    return None


def timer_due(*, started: float, seconds: float, reset_on_output: bool, last_output: float,
              now: float) -> float | None:
    """A timer's delay ran out (the shell's callback ran): None if it fires now, else the seconds
    until its moved deadline. Output since the timer was armed moves a `reset_on_output` deadline
    instead of re-arming the timer per line."""
    if not reset_on_output:
        return None
    left = max(started, last_output) + seconds - now
    return left if left > 0 else None


def failure_grace_s(stall_s: float) -> float:
    """How long a failure line may wait for the engine to go down before the supervisor stops it:
    a few seconds, never more than the stall bound (nor 15 s)."""
    return max(5.0, min(stall_s, 15.0))


def start_extension(*, starting: bool, now: float, last_extend: float, stall_s: float,
                    drain_s: float) -> float | None:
    """EXTEND_TIMEOUT_USEC (seconds) on engine output while it starts, or None. At most every
    min(10 s, stall_s / 3); far enough for our own stall timer plus a stop to decide first."""
    if not starting or now - last_extend < min(START_EXTEND_EVERY_MAX_S, stall_s / 3):
        return None
    return stall_s + drain_s + START_EXTEND_MARGIN_S


def temporary_extension(*, ready_sent: bool, now: float, last_extend: float) -> float | None:
    """EXTEND_TIMEOUT_USEC (seconds) while a start waits for a busy port or GPU, or None: only
    before READY=1 (after it systemd has no start deadline), every third of the extension."""
    if ready_sent or now - last_extend < TEMPORARY_EXTEND_S / 3:
        return None
    return TEMPORARY_EXTEND_S


def stop_extension(*, gateway_drain_s: float, drain_s: float, kill_s: float) -> float:
    """EXTEND_TIMEOUT_USEC before a planned stop: the gateway drain, the engine's drain, the kill."""
    return gateway_drain_s + drain_s + kill_s + STOP_EXTEND_MARGIN_S


def stop_drain_s(reason: str, drain_s: float) -> float:
    """The SIGTERM drain a stop for `reason` gives the engine before the group is killed."""
    return drain_s if planned(reason) else min(drain_s, FAILED_STOP_DRAIN_S)


@dataclass(frozen=True, slots=True)
class HealthRound:
    progressed: bool  # the decode counters grew since the previous round: busy, not wedged
    counters: tuple[float | None, ...] | None  # what the next round compares with


def health_round(before: tuple[float | None, ...] | None,
                 after: tuple[float | None, ...] | None) -> HealthRound:
    """One health check's /metrics evidence. A failed scrape (None) keeps the previous counters,
    so that the next good scrape still sees progress made meanwhile."""
    return HealthRound(counters_grew(before, after), after if after is not None else before)


def keep_scraping(status: int | None) -> bool:
    """After a failed /metrics scrape: a 404 says the engine has no metrics (no --enable-metrics),
    so scraping stops; anything else may pass."""
    return status != 404


def serving_probe_check(*, ok: bool, timed_out: bool) -> Check | None:
    """A periodic probe while serving, as wedge evidence: a completed generation, or a hung one
    (an idle engine that cannot finish a short generation may be wedged). Other errors are the
    monitor's own (logged and counted there), never evidence against the engine."""
    if ok:
        return Check.PROBE_OK
    return Check.PROBE_HUNG if timed_out else None


class ReadyStep(str, Enum):
    READY = "ready"
    RETRY = "retry"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ReadyProbeNext:
    step: ReadyStep
    reason: str = ""  # for RETRY and FAILED: what the last try said
    hung: bool = False  # FAILED: the engine did not answer (a hang, not a refusal)


NO_ANSWER = "no answer within timeouts.ready_probe_s"


def ready_probe_wait_s(*, deadline: float, now: float) -> float:
    """How long the READY gate waits for one probe's answer."""
    return max(READY_PROBE_MIN_WAIT_S, deadline - now)


def ready_probe_next(*, answered: bool, ok: bool, error: str | None, timed_out: bool, now: float,
                     deadline: float) -> ReadyProbeNext:
    """After one try of the probe that gates READY (`answered` False: the wait for it ran out).
    A failed try is retried after READY_PROBE_RETRY_S while that is before the deadline (the
    port may need a moment); the last try's error is the failure's reason."""
    if not answered:
        return ReadyProbeNext(ReadyStep.FAILED, NO_ANSWER, hung=True)
    if ok:
        return ReadyProbeNext(ReadyStep.READY)
    reason = error or "probe failed"
    if now + READY_PROBE_RETRY_S < deadline:
        return ReadyProbeNext(ReadyStep.RETRY, reason, hung=timed_out)
    return ReadyProbeNext(ReadyStep.FAILED, reason, hung=timed_out)
