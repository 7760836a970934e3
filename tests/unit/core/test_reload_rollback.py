"""A reload proves itself or is rolled back (issue 28.1): the lifecycle's side, driven by hand.

A reload that restarts a serving engine arms a rollback to the profile and settings that served;
the new command failing before READY (refused by SGLang, a capture failure, a hang) relaunches the
previous profile under the previous settings, never exit 78. A unit that never served keeps
exit 78; a new command that reaches READY disarms it."""

from __future__ import annotations

from lifecycle_driver import LifecycleDriver
from sglang_supervisor.core.actions import Action, Exit, Launch, Log, MarkBad, RollBack, StopEngine
from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    EngineFailed,
    FailureClass,
    HttpUp,
    ServerReady,
    WeightsLoadBegan,
)
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.inputs import (
    STALL_TIMER,
    EngineExited,
    LaunchFailed,
    ProbeOk,
    ReloadRequested,
    Settings,
    Start,
    TimerFired,
)

OLD = ("tuned", "no-prefill-graph", "eager")
NEW = ("fast", "no-prefill-graph", "eager")
CAPTURES = frozenset({("target", "decode", "TP0")})


class Run(LifecycleDriver):
    def __init__(self) -> None:
        super().__init__(Settings(profiles=OLD, remediation={"default": "next"}))

    def launched(self, acts: list[Action]) -> Launch:
        return self.answer_launch(acts, CAPTURES)

    def to_ready(self) -> list[Action]:
        return self.feed(WeightsLoadBegan(1, "TP0", 1.0), CaptureBegan(2, "TP0", "target", "decode", "full"),
                         CaptureEnded(3, "TP0", "target", "decode", 1.0, 0.5),
                         HttpUp(4, None, "127.0.0.1", 30000), ServerReady(5, None), ProbeOk(50.0))

    def reload(self, settings: Settings) -> list[Action]:
        acts = self.feed(ReloadRequested(changed=True, settings=settings))
        assert StopEngine("reload") in acts
        return acts + self.feed(EngineExited(self.lc.attempt, -9, True))

    def serving_then_reloaded(self) -> Launch:
        self.launched(self.feed(Start()))
        self.to_ready()
        new = Settings(profiles=NEW, remediation={"default": "next"}, stall_s=7.0)
        acts = self.reload(new)
        assert self.lc.rollback_to == "tuned"
        return self.launched(acts)


def kinds(acts: list[Action], kind: type) -> list:
    return [a for a in acts if isinstance(a, kind)]


def test_a_refused_new_command_rolls_back_instead_of_exit_78() -> None:
    run = Run()
    assert run.serving_then_reloaded().profile == "fast"
    acts = run.feed(EngineExited(run.lc.attempt, 2, False))  # argparse: rc 2, unknown_flag
    assert not kinds(acts, Exit) and not kinds(acts, MarkBad)
    [rb] = kinds(acts, RollBack)
    assert (rb.profile, rb.failure_class) == ("tuned", FailureClass.UNKNOWN_FLAG.value)
    [launch] = kinds(acts, Launch)
    assert (launch.profile, launch.restart) == ("tuned", "rollback")
    assert acts.index(rb) < acts.index(launch)  # the shell puts the old config back first
    assert "supervisor.reload_rolled_back" in [a.event for a in kinds(acts, Log)]
    assert run.lc.settings.profiles == OLD and run.lc.settings.stall_s != 7.0
    assert run.lc.rollback_to is None


def test_a_capture_failure_of_the_new_command_rolls_back_not_down_the_ladder() -> None:
    run = Run()
    run.serving_then_reloaded()
    run.feed(EngineFailed(10, "TP0", FailureClass.CAPTURE_FAILED, "Capture cuda graph failed"))
    acts = run.feed(EngineExited(run.lc.attempt, -9, False))
    assert [a.profile for a in kinds(acts, Launch)] == ["tuned"]
    assert kinds(acts, RollBack)[0].failure_class == FailureClass.CAPTURE_FAILED.value
    run.launched(acts)
    assert "supervisor.ready" in [a.event for a in kinds(run.to_ready(), Log)]


def test_a_new_command_that_never_gets_ready_rolls_back() -> None:
    run = Run()
    run.serving_then_reloaded()
    acts = run.feed(TimerFired(STALL_TIMER))
    assert StopEngine("hang") in acts
    acts = run.feed(EngineExited(run.lc.attempt, -9, True))
    assert kinds(acts, RollBack) and kinds(acts, Launch)[0].profile == "tuned"


def test_a_launch_refused_as_a_config_error_rolls_back() -> None:
    run = Run()
    run.serving_then_reloaded()
    acts = run.feed(LaunchFailed(run.lc.attempt, "no such interpreter", config_error=True))
    assert not kinds(acts, Exit)
    assert kinds(acts, RollBack) and kinds(acts, Launch)[0].profile == "tuned"


def test_the_new_command_ready_disarms_the_rollback() -> None:
    run = Run()
    run.serving_then_reloaded()
    acts = run.to_ready()
    assert "supervisor.reload_proven" in [a.event for a in kinds(acts, Log)]
    assert run.lc.rollback_to is None
    acts = run.feed(EngineExited(run.lc.attempt, 2, False))  # later failures: the ladder's again
    assert not kinds(acts, RollBack)


def test_a_unit_that_never_served_still_exits_78() -> None:
    run = Run()
    run.launched(run.feed(Start()))
    acts = run.feed(ReloadRequested(changed=True, settings=Settings(profiles=NEW)))
    acts += run.feed(EngineExited(run.lc.attempt, -9, True))
    assert run.lc.rollback_to is None
    run.launched(acts)
    acts = run.feed(EngineExited(run.lc.attempt, 2, False))
    assert not kinds(acts, RollBack)
    assert [a.code for a in kinds(acts, Exit)] == [ExitCode.CONFIG]


def test_a_second_reload_before_ready_keeps_the_proven_target() -> None:
    run = Run()
    run.serving_then_reloaded()
    acts = run.feed(ReloadRequested(changed=True, settings=Settings(profiles=("other", "eager"))))
    acts += run.feed(EngineExited(run.lc.attempt, -9, True))
    assert run.lc.rollback_to == "tuned"
    run.launched(acts)
    acts = run.feed(EngineExited(run.lc.attempt, 2, False))
    assert kinds(acts, Launch)[0].profile == "tuned" and run.lc.settings.profiles == OLD
