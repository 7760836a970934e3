"""Temporary conditions (port busy, GPU held by a stranger) are waited out, bounded, never blamed."""

from __future__ import annotations

from lifecycle_driver import LifecycleDriver
from sglang_supervisor.core.actions import (
    Action,
    CancelTimer,
    Exit,
    Launch,
    MarkBad,
    NotifyStatus,
    SetTimer,
    StopEngine,
    WaitTemporary,
)
from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    EngineFailed,
    FailureClass,
    HttpUp,
    ServerReady,
)
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.inputs import (
    TEMPORARY_TIMER,
    EngineExited,
    GpuBusy,
    Launched,
    PortBusy,
    ProbeOk,
    Settings,
    Start,
    StopRequested,
    TemporaryCleared,
    TimerFired,
)
from sglang_supervisor.core.phases import Phase

LADDER = ("primary", "no-prefill-graph", "eager")


def fail(cls: FailureClass, msg: str = "boom") -> EngineFailed:
    return EngineFailed(line_no=10, rank=None, failure=cls, message=msg)


def of(actions: list[Action], kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


class Driver(LifecycleDriver):
    def __init__(self, **kw: object) -> None:
        super().__init__(Settings(profiles=LADDER, **kw))  # type: ignore[arg-type]

    def start(self) -> None:
        self.relaunched(self.feed(Start()))

    def relaunched(self, acts: list[Action]) -> None:
        self.answer_launch(acts, frozenset())

    def to_ready(self) -> None:
        self.feed(CaptureBegan(2, None, "target", "decode", "full"),
                  CaptureEnded(3, None, "target", "decode", 1.0, 0.5),
                  HttpUp(4, None, "127.0.0.1", 30000), ServerReady(5, None), ProbeOk(50.0))

    def exit_engine(self, rc: int | None, we_stopped: bool = False) -> list[Action]:
        return self.feed(EngineExited(self.lc.attempt, rc, we_stopped))


def waiting(**kw: object) -> Driver:
    kw.setdefault("temporary_wait_s", 600.0)
    kw.setdefault("backoff_s", 2.0)
    return Driver(**kw)


def test_port_busy_at_preflight_waits_then_starts_the_ladder() -> None:
    d = waiting()
    acts = d.feed(PortBusy("127.0.0.1:30000 is already in use"))
    wait = of(acts, WaitTemporary)[0]
    assert (wait.what, wait.delay_s) == ("port", 0.0)  # our own check: relaunch as soon as free
    assert SetTimer(TEMPORARY_TIMER, 600.0) in acts
    assert d.lc.phase == Phase.WAITING and not of(acts, Exit) and not of(acts, Launch)
    status = of(acts, NotifyStatus)[-1].text
    assert "waiting" in status and "127.0.0.1:30000" in status and "exit 75 after 600 s" in status
    acts = d.feed(TemporaryCleared(wait.seq))
    assert CancelTimer(TEMPORARY_TIMER) in acts
    assert of(acts, Launch)[0].profile == "primary" and of(acts, Launch)[0].restart is None


def test_a_wait_that_never_clears_exits_75_without_blame() -> None:
    d = waiting()
    d.feed(PortBusy("127.0.0.1:30000 is already in use"))
    acts = d.feed(TimerFired(TEMPORARY_TIMER))
    exit_ = of(acts, Exit)[0]
    assert exit_.code == ExitCode.TEMPORARY and "did not clear within 600 s" in exit_.reason
    assert not of(d.log, MarkBad)


def test_engine_port_race_relaunches_the_same_profile_with_growing_backoff() -> None:
    d = waiting()
    d.start()
    delays = []
    for _ in range(3):
        d.feed(fail(FailureClass.PORT_IN_USE, "[Errno 98] address already in use"))
        acts = d.exit_engine(1)
        assert not of(acts, MarkBad) and not of(acts, Exit)
        wait = of(acts, WaitTemporary)[0]
        delays.append(wait.delay_s)
        acts = d.feed(TemporaryCleared(wait.seq))
        launch = of(acts, Launch)[0]
        assert launch.profile == "primary" and launch.restart == "port_in_use"
        d.feed(Launched(launch.attempt, 200, frozenset()))
    assert delays == [2.0, 4.0, 8.0]
    assert not of(d.log, MarkBad)


def test_the_bound_covers_the_whole_spell_not_each_wait() -> None:
    d = waiting(temporary_wait_s=10.0)
    d.start()
    d.feed(fail(FailureClass.PORT_IN_USE))
    acts = d.exit_engine(1)
    first_timer = next(a for a in acts if isinstance(a, SetTimer) and a.name == TEMPORARY_TIMER)
    d.feed(TemporaryCleared(of(acts, WaitTemporary)[0].seq), dt=4.0)
    d.feed(Launched(d.lc.attempt, 201, frozenset()))
    d.feed(fail(FailureClass.PORT_IN_USE))
    acts = d.exit_engine(1)
    second_timer = next(a for a in acts if isinstance(a, SetTimer) and a.name == TEMPORARY_TIMER)
    assert second_timer.seconds < first_timer.seconds
    d.feed(fail(FailureClass.PORT_IN_USE), dt=20.0)  # past the bound: no more waiting
    d.feed(TemporaryCleared(of(acts, WaitTemporary)[0].seq))
    d.feed(Launched(d.lc.attempt, 202, frozenset()))
    d.feed(fail(FailureClass.PORT_IN_USE), dt=20.0)
    acts = d.exit_engine(1)
    assert of(acts, Exit)[0].code == ExitCode.TEMPORARY
    assert not of(d.log, MarkBad)


def test_ready_ends_the_spell() -> None:
    d = waiting(temporary_wait_s=10.0)
    d.start()
    d.feed(fail(FailureClass.PORT_IN_USE))
    acts = d.exit_engine(1)
    acts = d.feed(TemporaryCleared(of(acts, WaitTemporary)[0].seq))
    d.relaunched(acts)
    d.to_ready()
    d.exit_engine(-9)  # a crash while serving: the same profile again ...
    assert of(d.feed(GpuBusy("pid 4242 holds 70 GiB on GPU0"), dt=100.0), StopEngine)
    acts = d.exit_engine(None, we_stopped=True)  # ... much later: a fresh spell, a fresh bound
    assert SetTimer(TEMPORARY_TIMER, 10.0) in acts and not of(acts, Exit)


def test_gpu_busy_before_a_relaunch_waits_for_the_gpu() -> None:
    d = waiting()
    d.start()
    d.exit_engine(-9)  # a failed start -> relaunch pending
    acts = d.feed(GpuBusy("pid 4242 holds 70 GiB on GPU0"))
    assert of(acts, StopEngine)
    acts = d.exit_engine(None, we_stopped=True)
    wait = of(acts, WaitTemporary)[0]
    assert wait.what == "gpu" and "pid 4242" in wait.detail and not of(acts, Exit)
    target = d.lc.profile
    acts = d.feed(TemporaryCleared(wait.seq))
    assert of(acts, Launch)[0].profile == target


def test_stop_while_waiting_exits_zero_and_a_stale_clear_is_ignored() -> None:
    d = waiting()
    acts = d.feed(PortBusy("busy"))
    seq = of(acts, WaitTemporary)[0].seq
    acts = d.feed(StopRequested("SIGTERM"))
    assert of(acts, Exit)[0].code == ExitCode.OK
    assert d.feed(TemporaryCleared(seq)) == []


def test_zero_wait_keeps_the_immediate_75() -> None:
    d = waiting(temporary_wait_s=0.0)
    acts = d.feed(PortBusy("busy"))
    assert of(acts, Exit)[0].code == ExitCode.TEMPORARY and not of(acts, WaitTemporary)
