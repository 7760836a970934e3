"""The lifecycle state machine, driven by hand-written input sequences. Time is an input."""

from __future__ import annotations

import pytest

from lifecycle_driver import LifecycleDriver
from sglang_supervisor.core.actions import (
    Action,
    Exit,
    Launch,
    Log,
    MarkBad,
    MarkGood,
    NotifyReady,
    NotifyReloading,
    NotifyStatus,
    NotifyStopping,
    RunReadyProbe,
    SetTimer,
    StopEngine,
)
from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    DecodeStats,
    EngineCrashed,
    EngineFailed,
    FailureClass,
    HttpUp,
    LogOnStdout,
    PrefillGraphDisabled,
    ServerReady,
    WeightsLoadBegan,
)
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.failover import (
    choose_next,
    ladder_order,
    reported_only,
    skipped_known_bad,
)
from sglang_supervisor.core.failures import classify_failure
from sglang_supervisor.core.inputs import (
    FAILURE_GRACE_TIMER,
    STALL_TIMER,
    DecodeProgress,
    EngineExited,
    GpuBusy,
    HealthFailed,
    HealthOk,
    Launched,
    LaunchFailed,
    PassiveThroughput,
    PortBusy,
    ProbeFailed,
    ProbeOk,
    RegressionDecision,
    ReloadRequested,
    Settings,
    Start,
    StopRequested,
    TimerFired,
)
from sglang_supervisor.core.lifecycle_base import STATUS_REFRESH_S
from sglang_supervisor.core.phases import Phase

LADDER = ("primary", "no-prefill-graph", "low-mem", "eager")
TP2 = frozenset({("target", "prefill", "TP0"), ("target", "prefill", "TP1"),
                 ("target", "decode", "TP0"), ("target", "decode", "TP1")})


def fail(cls: FailureClass, msg: str = "boom") -> EngineFailed:
    return EngineFailed(line_no=10, rank="TP0", failure=cls, message=msg)


def of(actions: list[Action], kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


def events(actions: list[Action]) -> list[str]:
    return [a.event for a in actions if isinstance(a, Log)]


class Driver(LifecycleDriver):
    def __init__(self, **kw: object) -> None:
        kw.setdefault("profiles", LADDER)
        kw.setdefault("remediation", {"prefill_graph_failed": "no-prefill-graph",
                                      "capture_oom": "low-mem", "default": "next"})
        super().__init__(Settings(**kw))  # type: ignore[arg-type]

    def start(self, expected: frozenset = TP2) -> Launch:
        return self.answer_launch(self.feed(Start()), expected)

    def relaunched(self, acts: list[Action], expected: frozenset = TP2) -> Launch:
        return self.answer_launch(acts, expected)

    def capture_all(self, ranks: tuple[str, ...] = ("TP0", "TP1")) -> list[Action]:
        out = self.feed(WeightsLoadBegan(1, "TP0", 10.0))
        for phase in ("prefill", "decode"):
            for r in ranks:
                out += self.feed(CaptureBegan(2, r, "target", phase, "full"),
                                 CaptureEnded(3, r, "target", phase, 1.0, 0.5))
        return out

    def to_ready(self, tok_s: float = 50.0) -> list[Action]:
        out = self.capture_all()
        out += self.feed(HttpUp(4, None, "127.0.0.1", 30000), ServerReady(5, None))
        out += self.feed(ProbeOk(tok_s))
        return out

    def exit_engine(self, rc: int | None, we_stopped: bool = False) -> list[Action]:
        return self.feed(EngineExited(self.lc.attempt, rc, we_stopped))


# ------------------------------------------------------------------ pure helpers

@pytest.mark.parametrize(
    ("rc", "failures", "verdict", "expected"),
    [
        (2, [], None, FailureClass.UNKNOWN_FLAG),
        (-9, [], None, FailureClass.OTHER),
        (-9, [fail(FailureClass.SCHEDULER_EXCEPTION), fail(FailureClass.CAPTURE_OOM)], None,
         FailureClass.CAPTURE_OOM),
        (-9, [fail(FailureClass.PREFILL_GRAPH_FAILED), fail(FailureClass.CAPTURE_OOM)], None,
         FailureClass.PREFILL_GRAPH_FAILED),
        (-9, [fail(FailureClass.CHILD_CRASHED)], None, FailureClass.CHILD_CRASHED),
        (-9, [fail(FailureClass.CHILD_CRASHED)], FailureClass.HANG, FailureClass.HANG),
        (-9, [fail(FailureClass.NCCL_TIMEOUT)], FailureClass.HANG, FailureClass.NCCL_TIMEOUT),
        (-9, [], FailureClass.WEDGED, FailureClass.WEDGED),
        (1, [fail(FailureClass.KV_CACHE_OOM)], None, FailureClass.KV_CACHE_OOM),
    ],
)
def test_classify_failure(rc, failures, verdict, expected) -> None:
    assert classify_failure(rc, failures, verdict) == expected


@pytest.mark.parametrize(
    ("failure", "current", "excluded", "rules", "expected"),
    [
        (FailureClass.PREFILL_GRAPH_FAILED, "primary", {"primary"},
         {"prefill_graph_failed": "no-prefill-graph"}, "no-prefill-graph"),
        (FailureClass.CAPTURE_OOM, "primary", {"primary"}, {"capture_oom": "low-mem"}, "low-mem"),
        (FailureClass.HANG, "primary", {"primary"}, {"default": "next"}, "no-prefill-graph"),
        (FailureClass.HANG, "low-mem", {"low-mem"}, {}, "eager"),
        # a named target already tried falls through to the next untried profile
        (FailureClass.CAPTURE_OOM, "eager", {"eager", "low-mem"}, {"capture_oom": "low-mem"},
         "primary"),
        (FailureClass.OTHER, "primary", set(LADDER), {}, None),
        (FailureClass.WATCHDOG_TIMEOUT, "primary", {"primary"}, {"watchdog_timeout": "stop"}, None),
    ],
)
def test_choose_next(failure, current, excluded, rules, expected) -> None:
    target, why = choose_next(failure, current, LADDER, rules, excluded)
    assert target == expected
    assert why


def test_ladder_starts_with_last_good_and_skips_known_bad() -> None:
    s = Settings(profiles=LADDER, last_good="low-mem", known_bad={"primary": "capture_oom"})
    assert ladder_order(s) == ("low-mem", "primary", "no-prefill-graph", "eager")
    assert skipped_known_bad(s) == {"primary": "capture_oom"}
    assert skipped_known_bad(Settings(profiles=LADDER, known_bad={"primary": "x"},
                                      retry_known_bad=True)) == {}
    every = {p: "hang" for p in LADDER}
    assert skipped_known_bad(Settings(profiles=LADDER, known_bad=every)) == {}


# ------------------------------------------------------------------ start paths

def test_capture_success_reaches_ready_only_after_probe() -> None:
    d = Driver()
    launch = d.start()
    assert (launch.profile, launch.attempt, launch.delay_s) == ("primary", 1, 0.0)
    assert SetTimer(STALL_TIMER, 600.0, reset_on_output=True) in d.log
    acts = d.capture_all()
    assert d.lc.phase == Phase.CAPTURING_GRAPHS
    assert events(acts).count("engine.capture_end") == 4
    acts = d.feed(HttpUp(4, None, "127.0.0.1", 30000))
    assert d.lc.phase == Phase.WARMING_UP and not of(acts, NotifyReady)
    acts = d.feed(ServerReady(5, None))
    assert of(acts, RunReadyProbe) == [RunReadyProbe(1)] and not of(acts, NotifyReady)
    acts = d.feed(ProbeOk(42.5, 0.1))
    # launched at t=1, six inputs of 1 s each later the probe passed
    assert of(acts, NotifyReady) and of(acts, MarkGood) == [MarkGood("primary", d.now - 1.0)]
    assert "supervisor.ready" in events(acts)
    assert d.lc.phase == Phase.SERVING
    assert "tok/s=42.5" in d.lc.status_text()
    assert d.lc.snapshot(d.now)["attempts"][0]["outcome"] == "ready"


def test_ready_line_without_every_rank_capture_is_a_capture_failure() -> None:
    d = Driver()
    d.start()
    d.feed(CaptureBegan(2, "TP0", "target", "decode", "full"),
           CaptureEnded(3, "TP0", "target", "decode", 1.0, 0.5),
           CaptureEnded(3, "TP0", "target", "prefill", 1.0, 0.5),
           CaptureEnded(3, "TP1", "target", "prefill", 1.0, 0.5))
    acts = d.feed(ServerReady(5, None))
    assert not of(acts, RunReadyProbe)
    assert of(acts, StopEngine) == [StopEngine("capture_missing")]
    acts = d.exit_engine(-9, we_stopped=True)
    assert MarkBad("primary", FailureClass.CAPTURE_FAILED) in acts
    assert of(acts, Launch)[0].profile == "no-prefill-graph"


@pytest.mark.parametrize(("disabled_on", "ready"), [
    (("TP0", "TP1"), True),
    ((None,), True),  # the unprefixed main process speaks for every rank
    (("TP0",), False),  # TP1 still owes its prefill graph
])
def test_prefill_graph_disabled_drops_the_prefill_expectation(disabled_on, ready) -> None:
    d = Driver()
    d.start()
    d.feed(*[PrefillGraphDisabled(2, r, "model not supported") for r in disabled_on])
    d.feed(CaptureEnded(3, "TP0", "target", "decode", 1.0, 0.5),
           CaptureEnded(3, "TP1", "target", "decode", 1.0, 0.5))
    acts = d.feed(ServerReady(5, None))
    assert bool(of(acts, RunReadyProbe)) is ready
    assert bool(of(acts, StopEngine)) is not ready


@pytest.mark.parametrize(
    ("failure", "next_profile"),
    [
        (FailureClass.PREFILL_GRAPH_FAILED, "no-prefill-graph"),
        (FailureClass.CAPTURE_OOM, "low-mem"),
        (FailureClass.CAPTURE_FAILED, "no-prefill-graph"),
        (FailureClass.DRAFT_CAPTURE_FAILED, "no-prefill-graph"),
        (FailureClass.KV_CACHE_OOM, "no-prefill-graph"),
        (FailureClass.SCHEDULER_DIED, "no-prefill-graph"),
    ],
)
def test_failed_start_follows_remediation(failure, next_profile) -> None:
    d = Driver()
    d.start()
    d.feed(CaptureBegan(2, "TP0", "target", "decode", "full"))
    acts = d.feed(fail(failure))
    assert SetTimer(FAILURE_GRACE_TIMER, 15.0) in acts
    acts = d.exit_engine(-9)
    assert MarkBad("primary", failure) in acts
    launch = of(acts, Launch)[0]
    assert (launch.profile, launch.attempt, launch.delay_s) == (next_profile, 2, 2.0)
    assert "profile.fallback" in events(acts)
    snap = d.lc.snapshot(d.now)["attempts"]
    assert snap[0]["outcome"] == "failed" and snap[0]["failure_class"] == failure.value


def member_report(cls: FailureClass, node: int = 1) -> EngineFailed:
    return EngineFailed(line_no=0, rank=f"node{node}", failure=cls, message=f"node {node}: boom",
                        node=node)


def test_a_worker_report_alone_falls_back_but_marks_nothing_bad() -> None:
    """Issue 29.1: a signed report is a peer's claim; the group moves on, the state keeps no blame."""
    d = Driver()
    d.start()
    d.feed(member_report(FailureClass.CAPTURE_OOM))
    acts = d.exit_engine(-9, we_stopped=True)
    assert not of(acts, MarkBad)
    assert of(acts, Launch)[0].profile == "low-mem"  # the remediation rule still applies
    warned = [a for a in of(acts, Log) if a.event == "profile.bad_not_remembered"]
    assert warned and warned[0].fields["node_rank"] == 1
    assert warned[0].fields["failure_class"] == "capture_oom"


def test_a_worker_report_the_leaders_engine_agrees_with_marks_the_profile_bad() -> None:
    d = Driver()
    d.start()
    d.feed(member_report(FailureClass.CAPTURE_OOM), fail(FailureClass.CAPTURE_OOM))
    acts = d.exit_engine(-9, we_stopped=True)
    assert MarkBad("primary", FailureClass.CAPTURE_OOM) in acts
    assert "profile.bad_not_remembered" not in events(acts)


@pytest.mark.parametrize(("lines", "expected"), [
    ([], None),
    ([fail(FailureClass.CAPTURE_OOM)], None),
    ([member_report(FailureClass.CAPTURE_OOM, 2)], 2),
    ([member_report(FailureClass.CAPTURE_OOM, 2), fail(FailureClass.HANG)], 2),
    ([member_report(FailureClass.CAPTURE_OOM, 2), fail(FailureClass.CAPTURE_OOM)], None),
])
def test_reported_only(lines: list[EngineFailed], expected: int | None) -> None:
    witness = lines[0] if lines else None
    assert reported_only(FailureClass.CAPTURE_OOM, witness, lines) == expected


def test_failure_line_without_exit_is_stopped_after_grace() -> None:
    d = Driver()
    d.start()
    d.feed(fail(FailureClass.NCCL_TIMEOUT))
    acts = d.feed(TimerFired(FAILURE_GRACE_TIMER))
    assert of(acts, StopEngine) == [StopEngine("failed")]
    acts = d.exit_engine(-9, we_stopped=True)
    assert MarkBad("primary", FailureClass.NCCL_TIMEOUT) in acts


def test_unknown_flag_exits_78_without_retry() -> None:
    d = Driver()
    d.start()
    acts = d.feed(fail(FailureClass.UNKNOWN_FLAG, "unrecognized arguments: --foo"))
    acts = d.exit_engine(2)
    assert of(acts, Exit)[0].code == ExitCode.CONFIG
    assert not of(acts, Launch) and not of(acts, MarkBad)
    assert d.lc.phase == Phase.FAILED
    assert d.feed(ProbeOk(1.0)) == []  # a finished machine ignores late inputs


def test_rc2_alone_is_unknown_flag() -> None:
    d = Driver()
    d.start()
    assert of(d.exit_engine(2), Exit)[0].code == ExitCode.CONFIG


def test_launch_failure_config_error_exits_78() -> None:
    d = Driver()
    d.start()
    acts = d.feed(LaunchFailed(1, "profile 'primary': flag --x has no equivalent", True))
    assert of(acts, Exit)[0].code == ExitCode.CONFIG


def test_stall_during_capture_is_a_hang_and_falls_back() -> None:
    d = Driver()
    d.start()
    d.feed(CaptureBegan(2, "TP0", "target", "decode", "full"))
    acts = d.feed(TimerFired(STALL_TIMER))
    assert "engine.hang" in events(acts) and of(acts, StopEngine) == [StopEngine("hang")]
    acts = d.exit_engine(-9, we_stopped=True)
    assert MarkBad("primary", FailureClass.HANG) in acts
    assert of(acts, Launch)[0].profile == "no-prefill-graph"


def test_start_timeout_is_a_hang() -> None:
    d = Driver()
    d.start()
    acts = d.feed(TimerFired("start"))
    assert of(acts, StopEngine) == [StopEngine("start_timeout")]
    assert MarkBad("primary", FailureClass.HANG) in d.exit_engine(-9, we_stopped=True)


def test_ready_probe_hang_is_wedged() -> None:
    d = Driver()
    d.start()
    d.capture_all()
    d.feed(ServerReady(5, None))
    acts = d.feed(ProbeFailed("timeout", hung=True))
    assert of(acts, StopEngine) == [StopEngine("probe_hung")]
    acts = d.exit_engine(-9, we_stopped=True)
    assert MarkBad("primary", FailureClass.WEDGED) in acts
    assert not of(d.log, NotifyReady)


def test_every_profile_failing_exits_69() -> None:
    d = Driver()
    d.start()
    for _ in LADDER:
        acts = d.exit_engine(-9)
        if of(acts, Launch):
            d.relaunched(acts)
    exits = of(d.log, Exit)
    assert exits and exits[0].code == ExitCode.ALL_PROFILES_FAILED
    assert [a.profile for a in of(d.log, Launch)] == list(LADDER)


def test_gpu_busy_exits_75() -> None:
    d = Driver()
    d.start()
    d.exit_engine(-9)  # a failed start -> relaunch pending
    acts = d.feed(GpuBusy("pid 4242 holds 70 GiB on GPU0"))
    assert of(acts, StopEngine)
    acts = d.exit_engine(None, we_stopped=True)
    assert of(acts, Exit)[0].code == ExitCode.TEMPORARY


def test_port_busy_before_start_exits_75_without_blame() -> None:
    d = Driver()
    acts = d.feed(PortBusy("127.0.0.1:30000 is taken by pid 99"))
    assert of(acts, Exit)[0].code == ExitCode.TEMPORARY
    assert not of(acts, MarkBad) and not of(acts, Launch)


def test_engine_port_in_use_line_exits_75() -> None:
    d = Driver()
    d.start()
    d.feed(fail(FailureClass.PORT_IN_USE, "[Errno 98] address already in use"))
    acts = d.exit_engine(1)
    assert of(acts, Exit)[0].code == ExitCode.TEMPORARY and not of(acts, MarkBad)


# ------------------------------------------------------------------ after ready

def test_crash_after_ready_retries_same_profile_once_then_next() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    acts = d.feed(EngineCrashed(50, None, "Subprocess scheduler_0 crashed"))
    acts = d.exit_engine(-9)
    launch = of(acts, Launch)[0]
    assert launch.profile == "primary" and not of(acts, MarkBad)
    assert "profile.retry_same" in events(acts)
    d.relaunched(acts)
    d.to_ready()
    acts = d.exit_engine(-9)
    assert MarkBad("primary", FailureClass.OTHER) in acts
    assert of(acts, Launch)[0].profile == "no-prefill-graph"
    outcomes = [a["outcome"] for a in d.lc.snapshot(d.now)["attempts"]]
    assert outcomes == ["crashed", "crashed", "running"]


def test_wedged_while_serving_after_health_failures() -> None:
    d = Driver(health_failures=2)
    d.start()
    d.to_ready()
    acts = d.feed(HealthFailed("timeout after 30s"))
    assert d.lc.phase == Phase.DEGRADED and not of(acts, StopEngine)
    d.feed(HealthOk())
    assert d.lc.phase == Phase.SERVING
    d.feed(HealthFailed("timeout"))
    acts = d.feed(HealthFailed("timeout"))
    assert of(acts, StopEngine) == [StopEngine("wedged")]
    acts = d.exit_engine(-9, we_stopped=True)
    assert of(acts, Launch)[0].profile == "primary"  # same profile once


def _decode_line() -> DecodeStats:
    return DecodeStats(50, "TP0", running_req=8, queue_req=0, gen_throughput=900.0, cuda_graph=True,
                       accept_len=None)


@pytest.mark.parametrize("progress", ["log", "metrics"])
def test_busy_is_not_wedged(progress: str) -> None:
    """/health timing out under load while decode steps continue (SGLang #22511): no restart."""
    d = Driver(health_failures=2)
    d.start()
    d.to_ready()
    d.feed(HealthFailed("no answer within 5 s"))  # one failure without progress: degraded
    assert d.lc.phase == Phase.DEGRADED
    for _ in range(10):
        d.feed(_decode_line() if progress == "log" else DecodeProgress())
        acts = d.feed(HealthFailed("no answer within 5 s"))
        assert not of(acts, StopEngine)
        assert "health.busy" in events(acts)
    assert d.lc.phase == Phase.SERVING
    # the engine freezes: no more decode lines, the failures count again
    d.feed(HealthFailed("no answer within 5 s"))
    acts = d.feed(HealthFailed("no answer within 5 s"))
    assert of(acts, StopEngine) == [StopEngine("wedged")]


def test_alive_but_not_serving_is_wedged_despite_good_health() -> None:
    d = Driver(health_failures=3)
    d.start()
    d.to_ready()
    for _ in range(2):
        acts = d.feed(ProbeFailed("no complete answer within 5 s", hung=True), HealthOk(), HealthOk())
        assert not of(acts, StopEngine)
    assert d.lc.phase == Phase.DEGRADED  # good /health does not end it while generations hang
    acts = d.feed(ProbeFailed("no complete answer within 5 s", hung=True))
    assert of(acts, StopEngine) == [StopEngine("wedged")]
    assert "alive but not serving" in str([a for a in acts if isinstance(a, Log)])
    acts = d.exit_engine(-9, we_stopped=True)
    assert of(acts, Launch)[0].profile == "primary"  # the wedge path: the same profile first
    assert not of(acts, MarkBad)


def test_completed_probe_clears_hung_probes() -> None:
    d = Driver(health_failures=2)
    d.start()
    d.to_ready()
    d.feed(ProbeFailed("no complete answer", hung=True), ProbeOk(40.0))
    assert d.lc.phase == Phase.SERVING
    acts = d.feed(ProbeFailed("no complete answer", hung=True))
    assert not of(acts, StopEngine)


def test_regression_switch_relaunches_named_profile() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    acts = d.feed(RegressionDecision("switch", "faster", profile="low-mem"))
    assert of(acts, StopEngine) == [StopEngine("regression")]
    acts = d.exit_engine(-9, we_stopped=True)
    assert of(acts, Launch)[0].profile == "low-mem" and not of(acts, MarkBad)
    assert d.feed(RegressionDecision("keep")) and not of(d.log[-1:], StopEngine)


# ------------------------------------------------------------------ stop and reload

@pytest.mark.parametrize("phase_inputs", [
    [],
    [WeightsLoadBegan(1, None, 1.0)],
    [CaptureBegan(2, None, "target", "decode", "full")],
    [HttpUp(4, None, "127.0.0.1", 1)],
])
def test_stop_during_start_exits_zero(phase_inputs) -> None:
    d = Driver()
    d.start(expected=frozenset({("target", "decode", None)}))
    d.feed(*phase_inputs)
    acts = d.feed(StopRequested("SIGTERM"))
    assert of(acts, NotifyStopping) and of(acts, StopEngine) == [StopEngine("signal")]
    assert d.lc.phase == Phase.STOPPING
    acts = d.exit_engine(-9, we_stopped=True)
    assert of(acts, Exit) == [Exit(ExitCode.OK, "stopped by signal")]
    assert not of(acts, MarkBad) and not of(acts, Launch)


def test_stop_while_serving_and_during_fallback() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    d.feed(StopRequested("SIGINT"))
    assert of(d.exit_engine(-9, we_stopped=True), Exit)[0].code == ExitCode.OK
    assert d.lc.snapshot(d.now)["attempts"][0]["outcome"] == "ready"

    d = Driver()
    d.start()
    d.feed(TimerFired(STALL_TIMER))  # stopping for a hang...
    acts = d.feed(StopRequested("SIGTERM"))  # ...when the operator stops us
    assert of(d.exit_engine(-9, we_stopped=True), Exit)[0].code == ExitCode.OK
    assert of(acts, NotifyStopping)


def test_reload_unchanged_keeps_engine_and_reconfirms_ready() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    acts = d.feed(ReloadRequested(changed=False))
    assert of(acts, NotifyReloading) and of(acts, NotifyReady) and not of(acts, StopEngine)


def test_reload_changed_restarts_same_profile_and_regates_ready() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    new = Settings(profiles=LADDER, same_profile_retries=0)
    acts = d.feed(ReloadRequested(changed=True, settings=new))
    assert of(acts, NotifyReloading) and of(acts, StopEngine) == [StopEngine("reload")]
    assert not of(acts, NotifyReady)
    acts = d.exit_engine(-9, we_stopped=True)
    assert of(acts, Launch)[0].profile == "primary"
    d.relaunched(acts)
    assert of(d.to_ready(), NotifyReady)
    assert d.lc.settings.same_profile_retries == 0


def test_known_bad_skipped_and_last_good_first() -> None:
    d = Driver(last_good="low-mem", known_bad={"primary": "capture_oom"})
    acts = d.feed(Start())
    assert of(acts, Launch)[0].profile == "low-mem"
    assert "profile.known_bad_skipped" in events(acts)
    d.feed(Launched(1, 1, TP2))
    acts = d.exit_engine(-9)
    assert of(acts, Launch)[0].profile == "no-prefill-graph"  # primary stays skipped


def statuses(actions: list[Action]) -> list[str]:
    return [a.text for a in actions if isinstance(a, NotifyStatus)]


def test_every_periodic_probe_refreshes_status_tok_s() -> None:
    d = Driver()
    d.start()
    d.to_ready(tok_s=50.0)
    assert statuses(d.feed(ProbeOk(61.25))) == ["serving profile=primary tok/s=61.2"]
    assert statuses(d.feed(ProbeOk(48.0), dt=0.1)) == ["serving profile=primary tok/s=48.0"]
    assert d.lc.snapshot(d.now)["tok_s"] == 48.0


def test_passive_throughput_refreshes_status_at_most_every_few_seconds() -> None:
    d = Driver()
    d.start()
    d.to_ready(tok_s=50.0)
    decode = DecodeStats(line_no=9, rank="TP0", running_req=8, queue_req=0, gen_throughput=3900.0,
                         cuda_graph=True, accept_len=None)
    assert statuses(d.feed(decode)) == ["serving profile=primary tok/s=3900.0"]
    # Within the refresh interval the figure is kept but STATUS= is not re-sent per line...
    assert statuses(d.feed(PassiveThroughput(4100.0), dt=STATUS_REFRESH_S / 4)) == []
    assert d.lc.tok_s == 4100.0
    # ...until the interval has passed.
    assert statuses(d.feed(PassiveThroughput(4200.0), dt=STATUS_REFRESH_S)) == [
        "serving profile=primary tok/s=4200.0"]
    # An idle engine's decode line (no running request) says nothing about speed.
    idle = DecodeStats(line_no=10, rank="TP0", running_req=0, queue_req=0, gen_throughput=0.0,
                       cuda_graph=True, accept_len=None)
    assert statuses(d.feed(idle, dt=STATUS_REFRESH_S)) == [] and d.lc.tok_s == 4200.0


def test_passive_throughput_before_ready_is_kept_quietly() -> None:
    d = Driver()
    d.start()
    assert statuses(d.feed(PassiveThroughput(10.0))) == []
    assert d.lc.tok_s == 10.0 and d.lc.phase == Phase.LAUNCHING


def test_a_probe_that_completes_ends_a_degraded_spell() -> None:
    d = Driver(health_failures=3)
    d.start()
    d.to_ready()
    d.feed(ProbeFailed("no complete answer within 5 s", hung=True))
    assert d.lc.phase == Phase.DEGRADED
    acts = d.feed(ProbeOk(55.0))
    assert d.lc.phase == Phase.SERVING and "health.recovered" in events(acts)
    assert statuses(acts)[-1] == "serving profile=primary tok/s=55.0"


# ------------------------------------------------------------------ restart accounting

def restarts(actions: list[Action]) -> list[str | None]:
    return [a.restart for a in of(actions, Launch)]


def test_every_relaunch_names_its_restart_reason() -> None:
    d = Driver(health_failures=1)
    assert d.start().restart is None  # the first start is no restart
    # A failed start falls back: the failure class is the reason.
    d.feed(fail(FailureClass.CAPTURE_OOM))
    acts = d.exit_engine(-9)
    assert restarts(acts) == ["capture_oom"]
    d.relaunched(acts)
    # A crash after READY retries the same profile: counted too (no MarkBad there).
    d.to_ready()
    d.feed(EngineCrashed(50, None, "Subprocess scheduler_0 crashed"))
    acts = d.exit_engine(-9)
    assert restarts(acts) == ["child_crashed"] and not of(acts, MarkBad)
    d.relaunched(acts)
    # A wedge (health checks) and a hang (stall) are the supervisor's own verdicts.
    d.to_ready()
    d.feed(HealthFailed("no answer"))
    acts = d.exit_engine(-9, we_stopped=True)
    assert restarts(acts) == ["wedged"]
    d.relaunched(acts)
    d.feed(TimerFired(STALL_TIMER))
    acts = d.exit_engine(-9, we_stopped=True)
    assert restarts(acts) == ["hang"]


@pytest.mark.parametrize("decision", [
    RegressionDecision("restart_same", "slower"),
    RegressionDecision("next_profile", "still slower"),
    RegressionDecision("switch", "cool-down over", profile="primary"),
])
def test_throughput_restarts_count_as_regression(decision) -> None:
    d = Driver()
    d.start()
    d.to_ready()
    d.feed(decision)
    assert restarts(d.exit_engine(-9, we_stopped=True)) == ["regression"]


def test_reload_restart_counts_as_reload_and_an_exhausted_ladder_counts_nothing() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    d.feed(ReloadRequested(changed=True))
    assert restarts(d.exit_engine(-9, we_stopped=True)) == ["reload"]

    d = Driver(profiles=("primary",))
    d.start()
    acts = d.exit_engine(-9)
    assert of(acts, MarkBad) and not of(acts, Launch)  # marked bad, but nothing restarts


def test_a_crash_line_reported_as_crash_and_as_signature_is_one_failure() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    line = "Subprocess scheduler_0 (pid=1) crashed with exit code -9. Triggering SIGQUIT for cleanup..."
    acts = d.feed(EngineCrashed(240, None, line),
                  EngineFailed(240, None, FailureClass.CHILD_CRASHED, line),
                  EngineCrashed(241, None, "SIGQUIT received. It usually means one child failed."))
    lines = [a.fields["line"] for a in acts if isinstance(a, Log) and a.event == "engine.failure_line"]
    assert lines == [240, 241]


def test_no_status_says_ready_before_ready_is_sent() -> None:
    # systemd shows the last STATUS= while the unit is activating: "ready" must arrive with READY=1.
    d = Driver()
    d.start()
    d.capture_all()
    d.feed(HttpUp(4, None, "127.0.0.1", 30000), ServerReady(5, None))
    acts = d.feed(ProbeOk(50.0))
    ready_at = next(i for i, a in enumerate(acts) if isinstance(a, NotifyReady))
    before = [a.text for a in acts[:ready_at] if isinstance(a, NotifyStatus)]
    assert not any(t.startswith(("ready", "serving")) for t in before), before


# ------------------------------------------------------------------ corroboration (issue 12)
# A log line can be text a user sent. Decisions that end the service or blame a profile need
# the engine's lifecycle to agree: it failed to start, exited, or stopped answering.

@pytest.mark.parametrize("cls", [FailureClass.UNKNOWN_FLAG, FailureClass.PORT_IN_USE,
                                 FailureClass.CUDA_ERROR, FailureClass.CAPTURE_FAILED])
def test_a_failure_line_while_serving_stops_nothing(cls: FailureClass) -> None:
    d = Driver()
    d.start()
    d.to_ready()
    acts = d.feed(fail(cls, "echoed by a prompt"))
    assert not of(acts, SetTimer) and not of(acts, StopEngine)
    assert [a.fields["while_serving"] for a in acts if isinstance(a, Log)
            and a.event == "engine.failure_line"] == [True]
    acts = d.feed(TimerFired(FAILURE_GRACE_TIMER), HealthOk(), ProbeOk(50.0), dt=60.0)
    assert not of(acts, StopEngine) and not of(acts, Exit) and not of(acts, MarkBad)
    assert d.lc.phase == Phase.SERVING


def test_a_failure_line_while_warming_up_stops_nothing_the_ready_probe_decides() -> None:
    # HTTP is up before READY: a request can be echoed (SGLang prints request dict keys raw, so
    # a forged line can start a record). The line alone starts no grace stop and blames nothing.
    d = Driver()
    d.start()
    d.capture_all()
    d.feed(HttpUp(4, None, "127.0.0.1", 30000))
    acts = d.feed(fail(FailureClass.CUDA_ERROR, "forged behind a dict key"))
    assert not of(acts, SetTimer) and not of(acts, StopEngine)
    acts = d.feed(ServerReady(5, None))
    assert of(acts, RunReadyProbe)
    acts = d.feed(ProbeOk(50.0))
    assert of(acts, NotifyReady) and not of(acts, MarkBad)


def test_unknown_flag_line_while_serving_then_a_crash_is_no_exit_78() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    d.feed(fail(FailureClass.UNKNOWN_FLAG, "error: unrecognized arguments: --user"))
    acts = d.exit_engine(-9)  # the engine dies right after, for whatever reason
    assert not of(acts, Exit)
    assert "engine.failure_line_uncorroborated" in events(acts)
    assert of(acts, Launch)[0].profile == "primary"  # the usual retry after a crash


def test_port_in_use_line_after_ready_is_no_exit_75() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    d.feed(fail(FailureClass.PORT_IN_USE, "OSError: [Errno 98] Address already in use"))
    assert not of(d.exit_engine(1), Exit)


def test_rc2_after_ready_is_not_an_unknown_flag() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    acts = d.exit_engine(2)
    assert not of(acts, Exit) and of(acts, Launch)


def test_unknown_flag_line_during_start_needs_rc2_or_no_progress() -> None:
    # The line, then the engine loads weights and dies of something else: no exit 78.
    d = Driver()
    d.start()
    d.feed(fail(FailureClass.UNKNOWN_FLAG, "error: unrecognized arguments: --x"))
    d.feed(WeightsLoadBegan(3, "TP0", 10.0))
    acts = d.exit_engine(1)
    assert not of(acts, Exit) and MarkBad("primary", FailureClass.OTHER) in acts
    # Before any weight was loaded the line is the cause, whatever the exit status.
    d = Driver()
    d.start()
    d.feed(fail(FailureClass.UNKNOWN_FLAG, "tc_piecewise was removed"))
    assert of(d.exit_engine(1), Exit)[0].code == ExitCode.CONFIG


def test_a_failure_line_the_engine_survived_blames_nothing_later() -> None:
    d = Driver()
    d.start()
    d.to_ready()
    d.feed(fail(FailureClass.CUDA_ERROR, "CUDA error: echoed"))
    acts = d.feed(HealthOk(), dt=30.0)  # answered 30 s after the line (> failure_grace_s)
    assert "engine.failure_line_refuted" in events(acts)
    d.exit_engine(-9)
    d.relaunched(d.log)
    d.to_ready()
    acts = d.exit_engine(-9)
    assert MarkBad("primary", FailureClass.OTHER) in acts  # not CUDA_ERROR


def test_a_failure_line_right_before_the_exit_is_the_witness() -> None:
    d = Driver(same_profile_retries=0)
    d.start()
    d.to_ready()
    d.feed(fail(FailureClass.CUDA_ERROR, "RuntimeError: CUDA error: an illegal memory access"))
    acts = d.feed(HealthOk(), dt=2.0)  # in flight before the line: within the grace, no refutal
    assert "engine.failure_line_refuted" not in events(acts)
    assert MarkBad("primary", FailureClass.CUDA_ERROR) in d.exit_engine(-9)


def test_a_failure_line_then_a_wedge_names_the_failure() -> None:
    d = Driver(same_profile_retries=0)
    d.start()
    d.to_ready()
    d.feed(fail(FailureClass.NCCL_TIMEOUT, "Watchdog caught collective operation timeout"))
    acts = d.feed(HealthFailed("timeout"), HealthFailed("timeout"), HealthFailed("timeout"), dt=5.0)
    assert of(acts, StopEngine) == [StopEngine("wedged")]
    assert MarkBad("primary", FailureClass.NCCL_TIMEOUT) in d.exit_engine(-9, we_stopped=True)


@pytest.mark.parametrize(("rc", "we_stopped", "clean"), [
    (-9, False, False),  # an unrequested SIGKILL is never a clean stop, whatever the version
    (-9, True, True),    # 0.5.17 SIGKILLs itself after the drain we asked for
    (0, False, True),
    (0, True, True),
])
def test_engine_exited_says_clean_only_for_a_clean_stop(rc: int, we_stopped: bool,
                                                        clean: bool) -> None:
    d = Driver()
    d.start()
    d.to_ready()
    if we_stopped:
        d.feed(StopRequested("SIGTERM"))
    # the shell marks -9 clean for a release whose drain ends in -9; only our stop makes it so
    acts = d.feed(EngineExited(d.lc.attempt, rc, we_stopped, clean=True))
    exited = [a for a in acts if isinstance(a, Log) and a.event == "engine.exited"]
    assert len(exited) == 1 and exited[0].fields["clean"] is clean


@pytest.mark.parametrize("timer", [STALL_TIMER, "start"])
def test_log_on_stdout_is_a_configuration_problem_not_a_hang(timer: str) -> None:
    """SGLang's own lines came on stdout, stderr silent: the stall or start timeout that follows
    is no hang of the profile; another profile would not start either."""
    d = Driver()
    d.start()
    assert d.feed(LogOnStdout(0, None)) == []
    acts = d.feed(TimerFired(timer))
    logged = [a for a in acts if isinstance(a, Log) and a.event == "engine.log_on_stdout"]
    assert len(logged) == 1 and logged[0].level == "error"
    assert "SGLANG_LOGGING_CONFIG_PATH" in logged[0].fields["fix"]
    assert "engine.hang" not in events(acts) and "engine.start_timeout" not in events(acts)
    assert of(acts, StopEngine) == [StopEngine("log_on_stdout")]
    acts = d.exit_engine(-9, we_stopped=True)
    assert not of(acts, MarkBad) and not of(acts, Launch)
    assert of(acts, Exit) == [Exit(ExitCode.CONFIG, "SGLang's log goes to stdout")]



def test_status_names_the_fallback_and_why_while_serving_below_the_best_profile() -> None:
    d = Driver()
    d.start()
    d.feed(CaptureBegan(2, "TP0", "target", "decode", "full"))
    d.feed(TimerFired(STALL_TIMER))
    d.relaunched(d.exit_engine(-9, we_stopped=True))
    assert "fallback" not in d.lc.status_text()  # only once it serves
    d.to_ready(tok_s=40.0)
    assert d.lc.status_text() == "serving profile=no-prefill-graph (fallback from primary: hang) tok/s=40.0"
    # a later run that skips the best profile as known bad says so too; the best itself says nothing
    skipped = Driver(known_bad={"primary": "capture_oom"})
    skipped.start()
    skipped.to_ready()
    assert "(fallback from primary: capture_oom)" in skipped.lc.status_text()
    best = Driver()
    best.start()
    best.to_ready()
    assert "fallback" not in best.lc.status_text()
