"""When is the engine hung or wedged (`core.liveness`): one row per case, no clock, no loop."""

from __future__ import annotations

import pytest

from sglang_supervisor.core.actions import SetTimer
from sglang_supervisor.core.inputs import FAILURE_GRACE_TIMER, STALL_TIMER, START_TIMER, TEMPORARY_TIMER
from sglang_supervisor.core.liveness import (
    NO_ANSWER,
    ReadyProbeNext,
    ReadyStep,
    failure_grace_s,
    health_round,
    keep_scraping,
    launch_timers,
    ready_probe_next,
    ready_probe_wait_s,
    serving_probe_check,
    start_extension,
    stop_drain_s,
    stop_extension,
    temporary_extension,
    timer_due,
    timer_verdict,
)
from sglang_supervisor.core.phases import Phase
from sglang_supervisor.core.reasons import StopReason
from sglang_supervisor.core.wedge import Check


def test_a_launch_arms_a_stall_deadline_that_output_moves_and_a_start_deadline() -> None:
    assert launch_timers(stall_s=600.0, start_s=3600.0, delay_s=0.0) == (
        SetTimer(STALL_TIMER, 600.0, reset_on_output=True), SetTimer(START_TIMER, 3600.0))
    # the backoff before the spawn is part of the start's deadline, not of the stall's
    assert launch_timers(stall_s=10.0, start_s=120.0, delay_s=4.0) == (
        SetTimer(STALL_TIMER, 10.0, reset_on_output=True), SetTimer(START_TIMER, 124.0))


@pytest.mark.parametrize(
    ("timer", "phase", "verdict"),
    [
        # a stalled log is a hang while starting, in every starting phase
        (STALL_TIMER, Phase.LAUNCHING, StopReason.HANG),
        (STALL_TIMER, Phase.LOADING_WEIGHTS, StopReason.HANG),
        (STALL_TIMER, Phase.CAPTURING_GRAPHS, StopReason.HANG),
        (STALL_TIMER, Phase.WARMING_UP, StopReason.HANG),
        # ... and nothing once serving (an idle engine logs nothing: health checks judge it)
        (STALL_TIMER, Phase.SERVING, None),
        (STALL_TIMER, Phase.DEGRADED, None),
        (START_TIMER, Phase.CAPTURING_GRAPHS, StopReason.START_TIMEOUT),
        (START_TIMER, Phase.READY, None),
        # a failure line the engine outlived by the grace: stopped, unless it is up
        (FAILURE_GRACE_TIMER, Phase.LOADING_WEIGHTS, StopReason.FAILED),
        (FAILURE_GRACE_TIMER, Phase.WARMING_UP, StopReason.FAILED),
        (FAILURE_GRACE_TIMER, Phase.SERVING, None),
        (FAILURE_GRACE_TIMER, Phase.DEGRADED, None),
        # the temporary wait's bound is the waiting lifecycle's, not a liveness verdict
        (TEMPORARY_TIMER, Phase.WAITING, None),
        ("no-such-timer", Phase.LAUNCHING, None),
    ],
)
def test_timer_verdict(timer: str, phase: Phase, verdict: StopReason | None) -> None:
    assert timer_verdict(timer, phase) == verdict


@pytest.mark.parametrize(
    ("started", "seconds", "reset", "last_output", "now", "due"),
    [
        # a plain timer (start_s, failure grace, temporary wait) fires when its delay ends
        (100.0, 60.0, False, 150.0, 160.0, None),
        (100.0, 60.0, False, 0.0, 160.0, None),
        # the stall timer without output since it was armed fires
        (100.0, 10.0, True, 90.0, 110.0, None),
        (100.0, 10.0, True, 100.0, 110.0, None),
        # output after arming moves the deadline: re-armed for what is left
        (100.0, 10.0, True, 105.0, 110.0, 5.0),
        (100.0, 10.0, True, 109.5, 110.0, 9.5),
        # output exactly one stall ago is a stall
        (100.0, 10.0, True, 100.5, 110.5, None),
        # a late callback (a busy loop) whose moved deadline passed meanwhile fires
        (100.0, 10.0, True, 105.0, 120.0, None),
    ],
)
def test_timer_due(started: float, seconds: float, reset: bool, last_output: float, now: float,
                   due: float | None) -> None:
    assert timer_due(started=started, seconds=seconds, reset_on_output=reset,
                     last_output=last_output, now=now) == due


@pytest.mark.parametrize(("stall_s", "grace"), [
    (600.0, 15.0), (15.0, 15.0), (10.0, 10.0), (5.0, 5.0), (2.0, 5.0), (0.5, 5.0),
])
def test_failure_grace_is_a_few_seconds_within_the_stall_bound(stall_s: float, grace: float) -> None:
    assert failure_grace_s(stall_s) == grace


@pytest.mark.parametrize(
    ("starting", "now", "last_extend", "stall_s", "drain_s", "extend"),
    [
        # the first output of a start extends: stall + drain + 30 s margin
        (True, 1000.0, 0.0, 600.0, 30.0, 660.0),
        # at most every 10 s for a long stall bound ...
        (True, 1009.9, 1000.0, 600.0, 30.0, None),
        (True, 1010.0, 1000.0, 600.0, 30.0, 660.0),
        # ... and every stall/3 for a short one
        (True, 1003.0, 1000.0, 9.0, 3.0, 42.0),
        (True, 1002.9, 1000.0, 9.0, 3.0, None),
        # serving (or stopping): systemd has no start deadline to keep ahead of
        (False, 1000.0, 0.0, 600.0, 30.0, None),
    ],
)
def test_start_extension(starting: bool, now: float, last_extend: float, stall_s: float,
                         drain_s: float, extend: float | None) -> None:
    assert start_extension(starting=starting, now=now, last_extend=last_extend, stall_s=stall_s,
                           drain_s=drain_s) == extend


@pytest.mark.parametrize(
    ("ready_sent", "now", "last_extend", "extend"),
    [
        (False, 100.0, float("-inf"), 60.0),  # the first poll of the wait
        (False, 119.9, 100.0, None),  # a third of the extension has not passed
        (False, 120.0, 100.0, 60.0),
        (True, 500.0, float("-inf"), None),  # after READY=1 there is no start deadline
    ],
)
def test_temporary_extension(ready_sent: bool, now: float, last_extend: float,
                             extend: float | None) -> None:
    assert temporary_extension(ready_sent=ready_sent, now=now, last_extend=last_extend) == extend


def test_stop_extension_covers_the_gateway_drain_the_engine_drain_and_the_kill() -> None:
    assert stop_extension(gateway_drain_s=30.0, drain_s=20.0, kill_s=10.0) == 65.0
    assert stop_extension(gateway_drain_s=0.0, drain_s=0.0, kill_s=0.0) == 5.0


@pytest.mark.parametrize(
    ("reason", "drain_s", "drain"),
    [
        ("signal", 30.0, 30.0), ("reload", 30.0, 30.0), ("regression", 30.0, 30.0),
        ("wedged", 30.0, 2.0), ("hang", 30.0, 2.0), ("failed", 30.0, 2.0),
        ("start_timeout", 30.0, 2.0), ("probe_hung", 30.0, 2.0),
        ("wedged", 1.0, 1.0),  # never more than the configured drain
    ],
)
def test_stop_drain(reason: str, drain_s: float, drain: float) -> None:
    assert stop_drain_s(reason, drain_s) == drain


@pytest.mark.parametrize(
    ("before", "after", "progressed", "kept"),
    [
        (None, (10.0, 5.0), False, (10.0, 5.0)),  # the first scrape: nothing to compare with
        ((10.0, 5.0), (11.0, 5.0), True, (11.0, 5.0)),  # tokens generated: busy
        ((10.0, 5.0), (10.0, 6.0), True, (10.0, 6.0)),  # a decode pass
        ((10.0, 5.0), (10.0, 5.0), False, (10.0, 5.0)),  # idle (or wedged)
        ((10.0, 5.0), None, False, (10.0, 5.0)),  # a failed scrape keeps the last counters
        ((10.0, 5.0), (3.0, 1.0), False, (3.0, 1.0)),  # counters went down: an engine restart
        ((10.0, None), (11.0, None), True, (11.0, None)),  # one counter unknown
    ],
)
def test_health_round(before: tuple[float | None, ...] | None, after: tuple[float | None, ...] | None,
                      progressed: bool, kept: tuple[float | None, ...] | None) -> None:
    r = health_round(before, after)
    assert (r.progressed, r.counters) == (progressed, kept)


@pytest.mark.parametrize(("status", "keep"), [(404, False), (500, True), (401, True), (None, True)])
def test_metrics_scraping_stops_only_when_the_engine_has_none(status: int | None, keep: bool) -> None:
    assert keep_scraping(status) is keep


@pytest.mark.parametrize(
    ("ok", "timed_out", "check"),
    [
        (True, False, Check.PROBE_OK),
        (False, True, Check.PROBE_HUNG),
        (False, False, None),  # a refused or malformed answer is the monitor's, not a hang
    ],
)
def test_serving_probe_as_evidence(ok: bool, timed_out: bool, check: Check | None) -> None:
    assert serving_probe_check(ok=ok, timed_out=timed_out) == check


@pytest.mark.parametrize(
    ("answered", "ok", "error", "timed_out", "now", "deadline", "expected"),
    [
        (True, True, None, False, 10.0, 30.0, ReadyProbeNext(ReadyStep.READY)),
        # a refused connection early on: the port may need a moment
        (True, False, "connection refused", False, 10.0, 30.0,
         ReadyProbeNext(ReadyStep.RETRY, "connection refused")),
        (True, False, None, False, 10.0, 30.0, ReadyProbeNext(ReadyStep.RETRY, "probe failed")),
        (True, False, "timed out", True, 10.0, 30.0, ReadyProbeNext(ReadyStep.RETRY, "timed out", True)),
        # no time left for another try: the last error is the reason
        (True, False, "connection refused", False, 29.6, 30.0,
         ReadyProbeNext(ReadyStep.FAILED, "connection refused")),
        (True, False, "timed out", True, 29.9, 30.0,
         ReadyProbeNext(ReadyStep.FAILED, "timed out", hung=True)),
        # the wait for an answer ran out: a hang
        (False, False, None, False, 30.0, 30.0, ReadyProbeNext(ReadyStep.FAILED, NO_ANSWER, True)),
    ],
)
def test_ready_probe_next(answered: bool, ok: bool, error: str | None, timed_out: bool, now: float,
                          deadline: float, expected: ReadyProbeNext) -> None:
    assert ready_probe_next(answered=answered, ok=ok, error=error, timed_out=timed_out, now=now,
                            deadline=deadline) == expected


@pytest.mark.parametrize(("now", "deadline", "wait"), [(10.0, 30.0, 20.0), (29.95, 30.0, 0.1),
                                                        (31.0, 30.0, 0.1)])
def test_ready_probe_wait(now: float, deadline: float, wait: float) -> None:
    assert ready_probe_wait_s(deadline=deadline, now=now) == pytest.approx(wait)
