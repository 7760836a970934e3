"""rotation: /readyz and /livez verdicts, planned stops, backoff, drain progress, the persisted
registration."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_supervisor.core.rotation import (
    PLANNED_STOPS,
    Registration,
    backoff_s,
    drain_result,
    drained,
    liveness,
    parse_registration,
    planned,
    readiness,
    retry_pause_s,
)


def snap(phase: str, **extra: Any) -> dict[str, Any]:
    return {"phase": phase, "profile": "tuned", "captures_ended": 0, "captures_expected": 0,
            "attempts": [], **extra}


def test_ready_only_while_serving_and_not_draining() -> None:
    assert readiness(snap("serving")).ready
    assert readiness(snap("ready")).ready
    assert not readiness(snap("serving"), draining=True).ready
    assert readiness(snap("serving"), draining=True).reason == "draining"
    for phase in ("preflight", "launching", "loading_weights", "warming_up", "restarting",
                  "stopping", "stopped", "failed", "degraded"):
        assert not readiness(snap(phase)).ready, phase


def test_not_ready_reasons_name_what_is_going_on() -> None:
    assert readiness(snap("capturing_graphs", captures_ended=3, captures_expected=8)).reason == \
        "capturing_graphs 3/8"
    fallback = snap("loading_weights", profile="no-prefill-graph",
                    attempts=[{"reason": "fallback after capture_oom"}])
    assert readiness(fallback).reason == "fallback no-prefill-graph after capture_oom"
    # SIGTERM: the phase turns to stopping at once, before any drain began.
    assert readiness(snap("stopping")).reason == "draining"
    assert readiness(snap("degraded")).reason.startswith("degraded")
    assert readiness({}).reason == "unknown"


def test_liveness_is_the_loop_heartbeat() -> None:
    assert liveness(0.5, stale_s=15).ready
    dead = liveness(40, stale_s=15)
    assert not dead.ready and "40 s" in dead.reason


def test_planned_stops_are_the_graceful_ones() -> None:
    # canary_rejected: an upgrade candidate that serves but measured worse is drained as well
    assert {"signal", "reload", "regression", "canary_rejected"} == PLANNED_STOPS
    assert planned("signal") and planned("reload") and planned("regression")
    for failure in ("wedged", "hang", "start_timeout", "probe_hung", "probe_failed", "gpu_busy", "failed"):
        assert not planned(failure)


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_s(n, first_s=0.5, max_s=4) for n in range(0, 7)] == [0, 0.5, 1, 2, 4, 4, 4]
    assert backoff_s(10_000, max_s=30) == 30


def test_drained_needs_zero_twice_in_a_row_and_never_trusts_unknown() -> None:
    assert drained(0, 0) == (False, 1)
    assert drained(0, 1) == (True, 2)
    assert drained(2, 1) == (False, 0)
    assert drained(None, 1) == (False, 0)


def test_registration_round_trip_and_damaged_files() -> None:
    r = Registration("http://gw:30080", "http://10.0.0.2:30000", "266e4c64-98d9-488e-ae16-e4ab2644efa4")
    assert parse_registration(r.to_json()) == r
    for bad in ("", "{", "[]", '{"gateway_url": "x"}',
                '{"gateway_url": "", "engine_url": "e", "worker_id": "w"}',
                '{"gateway_url": 1, "engine_url": "e", "worker_id": "w"}', "x" * 5000):
        assert parse_registration(bad) is None, bad


@pytest.mark.parametrize("text", [b"\xff\xfe", b"null"])
def test_registration_garbage_bytes(text: bytes) -> None:
    assert parse_registration(text) is None


def test_a_retry_is_paused_only_when_the_pause_fits_in_what_is_left() -> None:
    assert retry_pause_s(1, 5.0, max_s=30) == 0.25
    assert retry_pause_s(3, 5.0, max_s=30) == 1.0
    assert retry_pause_s(3, 5.0, max_s=0.5) == 0.5
    assert retry_pause_s(3, 1.0, max_s=30) is None  # 1 s pause would use up the 1 s left
    assert retry_pause_s(1, 0.0, max_s=30) is None


def test_drained_is_said_only_when_the_gateway_let_go() -> None:
    assert drain_result(deregistered=True, still_listed=False, load_result="drained") == "drained"
    assert drain_result(deregistered=True, still_listed=None, load_result="drained") == "drained"
    assert drain_result(deregistered=True, still_listed=False, load_result="timeout") == "timeout"
    assert drain_result(deregistered=True, still_listed=True, load_result="drained") == "still_listed"
    assert drain_result(deregistered=False, still_listed=None,
                        load_result="drained") == "deregister_failed"
