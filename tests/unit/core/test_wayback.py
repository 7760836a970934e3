"""The way back from a fallback (wayback.py): back-off per failure class and count, and the plan a
start follows, table-driven; then the lifecycle's probation (core/lifecycle) and the state it leaves."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sglang_supervisor.core.actions import Launch, Log, MarkBad, MarkGood
from sglang_supervisor.core.events import EngineFailed, FailureClass, ServerReady
from sglang_supervisor.core.failover import ladder_order
from sglang_supervisor.core.inputs import EngineExited, Launched, ProbeOk, Settings, Start
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.wayback import Plan, Policy, backoff_s, is_transient, plan
from sglang_supervisor.shell.files.state import State, with_bad, with_good

H = 3600.0
DAY = 24 * H
WEEK = 7 * DAY
POLICY = Policy(known_bad_ttl_s=WEEK, transient_retry_s=H)
LADDER = ("tuned", "no-prefill-graph", "low-mem", "no-spec")


@dataclass(frozen=True)
class Rec:
    failure_class: str
    at: float
    count: int = 1


@pytest.mark.parametrize(("failure", "count", "expected"), [
    ("capture_oom", 1, WEEK),  # the same command repeats it: a week
    ("capture_oom", 2, 2 * WEEK),  # failed again on probation: twice as long
    ("capture_oom", 3, 4 * WEEK),
    ("capture_oom", 4, 4 * WEEK),  # capped at 4 x known_bad_ttl_s
    ("capture_oom", 10**6, 4 * WEEK),
    ("hang", 1, H),  # may be transient: an hour
    ("hang", 3, 4 * H),
    ("wedged", 2, 2 * H),
    ("nccl_timeout", 1, H),
    ("scheduler_died", 1, H),  # the host's OOM killer, often
    ("other", 1, H),
    ("from_a_newer_release", 1, H),  # unknown class: the shorter wait
    ("hang", 20, 4 * WEEK),  # transient doubling reaches the same cap
])
def test_backoff_by_class_and_failures_in_a_row(failure: str, count: int, expected: float) -> None:
    assert backoff_s(failure, count, POLICY) == expected


def test_known_bad_ttl_zero_remembers_nothing() -> None:
    assert backoff_s("capture_oom", 3, Policy(0.0, H)) == 0.0
    assert backoff_s("hang", 1, Policy(0.0, H)) == 0.0


def test_deterministic_classes() -> None:
    assert not is_transient("capture_oom") and not is_transient("unknown_flag")
    assert is_transient("hang") and is_transient("gpu_busy")


NOW = 100 * WEEK


@pytest.mark.parametrize(("last_good", "bad", "expected"), [
    # nothing remembered: the ladder from the top, no probation
    (None, {}, Plan(None, None, {}, {})),
    # tuned served last: no way back needed
    ("tuned", {}, Plan("tuned", None, {}, {})),
    # the fallback serves, tuned's capture OOM was yesterday: stay on the fallback
    ("no-prefill-graph", {"tuned": Rec("capture_oom", NOW - DAY)},
     Plan("no-prefill-graph", None, {"tuned": "capture_oom"}, {"tuned": NOW - DAY + WEEK})),
    # ... eight days ago: its entry expired, tuned is tried again on probation
    ("no-prefill-graph", {"tuned": Rec("capture_oom", NOW - 8 * DAY)},
     Plan("no-prefill-graph", "tuned", {}, {})),
    # failed twice in a row (the last probation too): two weeks
    ("no-prefill-graph", {"tuned": Rec("capture_oom", NOW - 8 * DAY, 2)},
     Plan("no-prefill-graph", None, {"tuned": "capture_oom"}, {"tuned": NOW - 8 * DAY + 2 * WEEK})),
    # a hang two hours ago may have been transient: tried again
    ("low-mem", {"tuned": Rec("hang", NOW - 2 * H), "no-prefill-graph": Rec("capture_oom", NOW - H)},
     Plan("low-mem", "tuned", {"no-prefill-graph": "capture_oom"},
          {"no-prefill-graph": NOW - H + WEEK})),
    # the best is still waiting, the next better one never failed: that one is on probation
    ("low-mem", {"tuned": Rec("capture_oom", NOW - H)},
     Plan("low-mem", "no-prefill-graph", {"tuned": "capture_oom"}, {"tuned": NOW - H + WEEK})),
    # the clock was stepped back a year: the record still expires
    ("no-prefill-graph", {"tuned": Rec("capture_oom", NOW + 365 * DAY)},
     Plan("no-prefill-graph", "tuned", {}, {})),
    # last good was removed from the configuration: plain ladder order
    ("gone", {"tuned": Rec("capture_oom", NOW - H)},
     Plan(None, None, {"tuned": "capture_oom"}, {"tuned": NOW - H + WEEK})),
    # records of profiles no longer in the ladder are ignored
    ("no-prefill-graph", {"old": Rec("hang", NOW)}, Plan("no-prefill-graph", "tuned", {}, {})),
])
def test_plan(last_good: str | None, bad: dict[str, Rec], expected: Plan) -> None:
    assert plan(LADDER, last_good, bad, NOW, POLICY) == expected


def test_profiles_tune_measured_slower_get_no_probation() -> None:
    # tune ranked no-prefill-graph first and tuned after it (served, slower): run starts the winner.
    assert plan(LADDER, "no-prefill-graph", {}, NOW, POLICY, measured_slower=["tuned"]) == Plan(
        "no-prefill-graph", None, {}, {})
    # a better profile tune did not rank (it failed there, or was not tuned) still gets its probation
    assert plan(LADDER, "low-mem", {}, NOW, POLICY, measured_slower=["tuned"]).probation == "no-prefill-graph"


# ----------------------------------------------------------------- the lifecycle's probation

def settings_from(p: Plan) -> Settings:
    return Settings(profiles=LADDER, remediation={"capture_oom": "low-mem", "default": "next"},
                    last_good=p.last_good, known_bad=dict(p.backoff), probation=p.probation)


def launches(actions: list) -> list[tuple[str, str]]:
    return [(a.profile, a.reason) for a in actions if isinstance(a, Launch)]


def test_probation_order_is_candidate_then_last_good_then_the_ladder() -> None:
    s = settings_from(Plan("low-mem", "tuned", {}, {}))
    assert ladder_order(s) == ("tuned", "low-mem", "no-prefill-graph", "no-spec")


def test_a_failed_probation_goes_back_to_last_good_at_once_and_waits_longer() -> None:
    """The whole way: fallback serving, entry expires, probation fails, back to last good; the
    record's count grew, so the next start keeps the fallback for twice the TTL."""
    state = with_bad(State(), "fp", "tuned", "capture_oom", NOW - 8 * DAY)
    state = with_good(state, "fp", "no-prefill-graph", NOW - 8 * DAY)
    fs = state.fingerprints["fp"]
    p = plan(LADDER, fs.last_good.profile if fs.last_good else None, fs.bad, NOW, POLICY)
    lc = Lifecycle(settings_from(p))
    acts = lc.handle(Start(), 1.0)
    assert launches(acts) == [("tuned", "probation")]
    assert "profile.probation" in [a.event for a in acts if isinstance(a, Log)]
    lc.handle(Launched(1, 10, frozenset()), 2.0)
    lc.handle(EngineFailed(3, None, FailureClass.CAPTURE_OOM, "OOM"), 3.0)
    acts = lc.handle(EngineExited(1, 1, False), 4.0)
    assert MarkBad("tuned", FailureClass.CAPTURE_OOM) in acts
    # not remediation's low-mem, not the ladder's next: last good at once
    assert [p for p, _ in launches(acts)] == ["no-prefill-graph"]
    state = with_bad(state, "fp", "tuned", "capture_oom", NOW)
    rec = state.fingerprints["fp"].bad["tuned"]
    assert rec.count == 2 and backoff_s(rec.failure_class, rec.count, POLICY) == 2 * WEEK
    later = plan(LADDER, "no-prefill-graph", state.fingerprints["fp"].bad, NOW + 8 * DAY, POLICY)
    assert later.probation is None and "tuned" in later.backoff  # a week later: still waiting
    again = plan(LADDER, "no-prefill-graph", state.fingerprints["fp"].bad, NOW + 15 * DAY, POLICY)
    assert again.probation == "tuned"


def test_a_probation_that_reaches_ready_is_the_new_last_good() -> None:
    lc = Lifecycle(settings_from(Plan("no-prefill-graph", "tuned", {}, {})))
    lc.handle(Start(), 1.0)
    lc.handle(Launched(1, 10, frozenset()), 2.0)
    lc.handle(ServerReady(5, None), 3.0)
    acts = lc.handle(ProbeOk(50.0), 4.0)
    assert MarkGood("tuned", 3.0) in acts
    assert "profile.probation_passed" in [a.event for a in acts if isinstance(a, Log)]
    state = with_bad(State(), "fp", "tuned", "capture_oom", 0.0)
    assert "tuned" not in with_good(state, "fp", "tuned", 5.0).fingerprints["fp"].bad


def test_only_the_first_launch_is_a_probation() -> None:
    """After the probation failed and last good failed too, the ladder goes on as usual."""
    lc = Lifecycle(settings_from(Plan("no-prefill-graph", "tuned", {}, {})))
    lc.handle(Start(), 1.0)
    lc.handle(Launched(1, 10, frozenset()), 2.0)
    acts = lc.handle(EngineExited(1, 1, False), 3.0)
    assert [p for p, _ in launches(acts)] == ["no-prefill-graph"]
    lc.handle(Launched(2, 11, frozenset()), 4.0)
    lc.handle(EngineFailed(3, None, FailureClass.CAPTURE_OOM, "OOM"), 5.0)
    acts = lc.handle(EngineExited(2, 1, False), 6.0)
    assert [p for p, _ in launches(acts)] == ["low-mem"]  # remediation applies again
