"""Properties of the lifecycle over arbitrary input sequences (hypothesis): whatever the engine,
the timers and the operator do, in whatever order, `handle` answers with actions and never raises;
a run exits once and then answers nothing; attempts count up by one; only configured profiles are
launched; and no profile is ever marked bad for a condition that is not its fault (a busy port or
GPU) or for a command line that no profile can fix."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_supervisor.core.actions import Exit, Launch, MarkBad
from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    DecodeStats,
    EngineCrashed,
    EngineFailed,
    FailureClass,
    HttpUp,
    PrefillGraphDisabled,
    ServerReady,
    WeightsLoadBegan,
)
from sglang_supervisor.core.failover import CONFIG_FAILURES, TEMPORARY_FAILURES
from sglang_supervisor.core.inputs import (
    FAILURE_GRACE_TIMER,
    STALL_TIMER,
    START_TIMER,
    TEMPORARY_TIMER,
    DecodeProgress,
    EngineExited,
    GpuBusy,
    HealthFailed,
    HealthOk,
    Input,
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
    TemporaryCleared,
    TimerFired,
)
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.phases import FINAL_PHASES

LADDER = ("primary", "low-mem", "eager")
RANKS = st.sampled_from([None, "TP0", "TP1"])
OWNERS = st.sampled_from(["target", "draft"])
GRAPHS = st.sampled_from(["prefill", "decode", "piecewise"])
KEYS = st.tuples(OWNERS, GRAPHS, RANKS)
ATTEMPT = st.integers(0, 6)
LINE = st.integers(0, 40)

INPUTS: st.SearchStrategy[Input] = st.one_of(
    st.just(Start()),
    st.builds(Launched, ATTEMPT, st.just(4242), st.frozensets(KEYS, max_size=4)),
    st.builds(LaunchFailed, ATTEMPT, st.just("spawn failed"), st.booleans()),
    st.builds(EngineExited, ATTEMPT, st.sampled_from([None, 0, 1, 2, -9, -6]), st.booleans(),
              st.booleans()),
    st.builds(TimerFired, st.sampled_from([STALL_TIMER, START_TIMER, FAILURE_GRACE_TIMER,
                                           TEMPORARY_TIMER])),
    st.builds(ProbeOk, st.none() | st.floats(0, 1e5), st.none() | st.floats(0, 60)),
    st.builds(ProbeFailed, st.just("timeout"), st.booleans()),
    st.builds(PassiveThroughput, st.floats(0, 1e5)),
    st.just(HealthOk()),
    st.builds(HealthFailed, st.just("503")),
    st.just(DecodeProgress()),
    st.builds(StopRequested, st.just("SIGTERM")),
    st.builds(ReloadRequested, st.booleans()),
    st.builds(RegressionDecision, st.sampled_from(["restart_same", "next_profile", "switch", "keep"]),
              st.just("slower"), st.none() | st.sampled_from([*LADDER, "gone"])),
    st.builds(GpuBusy, st.just("pid 7 holds 20 GiB")),
    st.builds(PortBusy, st.just("pid 8 listens")),
    st.builds(TemporaryCleared, st.integers(0, 4)),
    st.builds(EngineFailed, LINE, RANKS, st.sampled_from(list(FailureClass)), st.just("boom")),
    st.builds(EngineCrashed, LINE, RANKS, st.just("Traceback")),
    st.builds(WeightsLoadBegan, LINE, RANKS, st.none()),
    st.builds(CaptureBegan, LINE, RANKS, OWNERS, GRAPHS, st.none()),
    st.builds(CaptureEnded, LINE, RANKS, OWNERS, GRAPHS, st.none(), st.none()),
    st.builds(PrefillGraphDisabled, LINE, RANKS, st.just("not supported")),
    st.builds(HttpUp, LINE, st.none(), st.just("127.0.0.1"), st.just(30000)),
    st.builds(ServerReady, LINE, st.none()),
    st.builds(DecodeStats, LINE, RANKS, st.none() | st.integers(0, 8), st.none(),
              st.none() | st.floats(0, 1e4), st.none(), st.none()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(INPUTS, st.floats(0.0, 700.0)), max_size=60),
       st.integers(0, 2), st.floats(0.0, 120.0))
def test_any_input_sequence_keeps_the_invariants(steps: list[tuple[Input, float]], retries: int,
                                                 temporary_wait_s: float) -> None:
    lc = Lifecycle(Settings(profiles=LADDER, same_profile_retries=retries,
                            temporary_wait_s=temporary_wait_s,
                            remediation={"capture_oom": "low-mem", "default": "next"}))
    now, exits, attempts = 0.0, 0, 0
    for inp, dt in [(Start(), 0.0), *steps]:
        now += dt
        done_before = lc.exit is not None
        acts = lc.handle(inp, now)
        if done_before:
            assert acts == []  # a finished run answers nothing
        for a in acts:
            if isinstance(a, Exit):
                exits += 1
            elif isinstance(a, Launch):
                attempts += 1
                assert a.attempt == attempts and a.profile in LADDER
            elif isinstance(a, MarkBad):
                assert a.profile in LADDER
                assert a.failure_class not in TEMPORARY_FAILURES | CONFIG_FAILURES
        assert exits <= 1
        assert (lc.phase in FINAL_PHASES) == (lc.exit is not None)
        assert lc.attempt == attempts
    snap = lc.snapshot(now)
    assert [a["attempt"] for a in snap["attempts"]] == list(range(1, attempts + 1))
