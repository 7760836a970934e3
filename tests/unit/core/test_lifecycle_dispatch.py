"""The lifecycle's dispatch and vocabulary: every input and action type is in its union (mypy's
`assert_never` then proves the matches exhaustive), every engine event is decided on, the enums
keep the strings that state files, logs and metric labels carried before, and a launch replaces
the whole per-attempt state."""

from __future__ import annotations

import dataclasses
import inspect
import typing

from sglang_supervisor.core import actions, events, inputs
from sglang_supervisor.core.attempt import Attempt
from sglang_supervisor.core.events import EngineEvent, EngineFailed, FailureClass
from sglang_supervisor.core.inputs import EngineExited, Launched, Settings, Start
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.lifecycle_start import HANDLED_ENGINE_EVENTS, IGNORED_ENGINE_EVENTS
from sglang_supervisor.core.reasons import PLANNED_STOPS, Outcome, RestartCause, StopReason
from sglang_supervisor.core.rotation import planned


def _dataclasses_of(module: object) -> set[type]:
    return {obj for _, obj in inspect.getmembers(module, inspect.isclass)
            if dataclasses.is_dataclass(obj) and obj.__module__ == getattr(module, "__name__", "")}


def test_every_input_type_is_in_the_union() -> None:
    members = set(typing.get_args(inputs.SupervisorInput))
    assert members == _dataclasses_of(inputs) - {inputs.Settings}
    assert len(members) == 18  # FidelityFailed: outputs that disagree with the reference


def test_every_action_type_is_in_the_union() -> None:
    members = set(typing.get_args(actions.Action))
    assert members == _dataclasses_of(actions)
    assert len(members) == 16  # RollBack: a reloaded command that failed before READY;
    # CanaryJudged: an upgrade candidate's verdict at READY (issue 24)


def test_every_engine_event_is_handled_or_knowingly_ignored() -> None:
    every = {c for c in vars(events).values()
             if isinstance(c, type) and issubclass(c, EngineEvent) and c is not EngineEvent}
    handled, ignored = set(HANDLED_ENGINE_EVENTS), set(IGNORED_ENGINE_EVENTS)
    assert handled & ignored == set()
    assert handled | ignored == every, f"decide on: {sorted(c.__name__ for c in every - handled - ignored)}"


def test_the_enums_keep_the_strings_on_disk_and_in_labels() -> None:
    assert [r.value for r in StopReason] == [
        "signal", "reload", "regression", "gpu_busy", "hang", "start_timeout", "wedged",
        "probe_hung", "probe_failed", "capture_missing", "failed", "log_on_stdout",
        "canary_rejected", "output_mismatch"]
    assert [o.value for o in Outcome] == ["running", "ready", "failed", "crashed", "stopped"]
    assert [c.value for c in RestartCause] == ["regression", "reload", "rollback"]
    # They print as their values (a plain (str, Enum) prints "StopReason.SIGNAL" on 3.11).
    assert f"{StopReason.WEDGED}" == str(StopReason.WEDGED) == "wedged"
    assert StopReason.SIGNAL == "signal" and "signal" in PLANNED_STOPS


def test_planned_stops_are_the_drained_ones() -> None:
    assert {r for r in StopReason if r.planned} == {StopReason.SIGNAL, StopReason.RELOAD,
                                                    StopReason.REGRESSION, StopReason.CANARY}
    assert planned(StopReason.RELOAD) and planned("regression") and not planned(StopReason.HANG)


def test_a_launch_replaces_the_whole_attempt() -> None:
    lc = Lifecycle(Settings(profiles=("a", "b")))
    lc.handle(Start(), 0.0)
    lc.handle(Launched(1, 42, frozenset({("target", "decode", None)})), 1.0)
    lc.handle(EngineFailed(9, None, FailureClass.CAPTURE_OOM, "out of memory"), 2.0)
    first = lc.cur
    assert first.failures and first.expected and first.engine_alive
    lc.handle(EngineExited(1, 1, False), 3.0)
    assert lc.cur is not first and lc.attempt == 2 and lc.profile == "b"
    fresh = Attempt(number=2, profile="b", engine_alive=True)
    assert lc.cur == fresh  # nothing of attempt 1 (failures, captures, stop reason) carried over
    assert [a["outcome"] for a in lc.snapshot(4.0)["attempts"]] == ["failed", "running"]


def test_a_failed_attempt_keeps_the_line_of_its_class_for_status() -> None:
    lc = Lifecycle(Settings(profiles=("a", "b")))
    lc.handle(Start(), 0.0)
    lc.handle(Launched(1, 42, frozenset({("target", "decode", None)})), 1.0)
    lc.handle(EngineFailed(7, None, FailureClass.CHILD_CRASHED, "a child said goodbye"), 1.5)
    lc.handle(EngineFailed(9, None, FailureClass.CAPTURE_OOM, "CUDA out of memory " + "x" * 400), 2.0)
    lc.handle(EngineExited(1, 1, False), 3.0)
    first, running = lc.snapshot(4.0)["attempts"]
    assert first["failure_class"] == "capture_oom"
    assert first["failure_line"].startswith("CUDA out of memory") and len(first["failure_line"]) == 300
    assert running["failure_line"] is None
