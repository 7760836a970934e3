"""What the lifecycle does about a throughput regression decision:
`regression_action.decide_regression_action`, one row per decision kind and lifecycle situation.

core/regression.py decides whether the engine regressed and which kind of answer it wants
(tests/unit/core/test_regression.py); this table decides which engine runs next. The ladder is
etc/sglang-supervisor/qwen.yaml's.
"""

from __future__ import annotations

import pytest

from sglang_supervisor.core.actions import Launch, Log, StopEngine
from sglang_supervisor.core.events import ServerReady
from sglang_supervisor.core.inputs import (
    EngineExited,
    Launched,
    ProbeOk,
    RegressionDecision,
    RegressionKind,
    Settings,
    Start,
)
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.reasons import StopReason
from sglang_supervisor.core.regression_action import (
    NoTarget,
    Note,
    RegressionAction,
    Relaunch,
    decide_regression_action,
)

ORDER = ("tuned", "no-prefill-graph", "low-mem", "no-spec", "eager")

ROWS: list[tuple[str, RegressionKind, str | None, bool, bool, str, set[str], RegressionAction]] = [
    # (case, kind, requested, serving, stopping, current profile, excluded, action)
    ("keep: log it only", "keep", None, True, False, "tuned", set(), Note()),
    ("restart_same: the same profile again (a fresh engine often recovers)",
     "restart_same", None, True, False, "tuned", set(), Relaunch("tuned")),
    ("switch back to the best profile after its back-off",
     "switch", "tuned", True, False, "low-mem", {"no-prefill-graph"}, Relaunch("tuned")),
    ("switch to a profile no longer in the ladder (reloaded away): nothing to switch to",
     "switch", "fast", True, False, "low-mem", set(), NoTarget()),
    ("next_profile: the next one down the ladder",
     "next_profile", None, True, False, "tuned", set(), Relaunch("no-prefill-graph")),
    ("next_profile skips profiles that failed or are known bad",
     "next_profile", None, True, False, "tuned", {"no-prefill-graph", "low-mem"}, Relaunch("no-spec")),
    ("next_profile from the last profile wraps around",
     "next_profile", None, True, False, "eager", {"no-prefill-graph", "low-mem", "no-spec"},
     Relaunch("tuned")),
    ("next_profile with every other profile failed: keep serving",
     "next_profile", None, True, False, "no-spec", {"tuned", "no-prefill-graph", "low-mem", "eager"},
     NoTarget()),
    ("the engine is still starting: a late decision is only logged",
     "restart_same", None, False, False, "tuned", set(), Note()),
    ("a stop of ours is under way (signal, reload, wedged): it decides, not the monitor",
     "next_profile", None, True, True, "tuned", set(), Note()),
    ("switch while stopping: only logged", "switch", "tuned", True, True, "low-mem", set(), Note()),
]


@pytest.mark.parametrize(("case", "kind", "requested", "serving", "stopping", "profile", "excluded",
                          "action"), ROWS, ids=[r[0] for r in ROWS])
def test_decide_regression_action(case: str, kind: RegressionKind, requested: str | None,
                                  serving: bool, stopping: bool, profile: str, excluded: set[str],
                                  action: RegressionAction) -> None:
    got = decide_regression_action(kind, requested, serving=serving, stopping=stopping,
                                   profile=profile, order=ORDER, excluded=excluded)
    assert got == action


def serving_lifecycle() -> Lifecycle:
    lc = Lifecycle(Settings(profiles=ORDER))
    lc.handle(Start(), 0.0)
    lc.handle(Launched(1, 42, frozenset()), 1.0)
    lc.handle(ServerReady(3, None), 2.0)
    lc.handle(ProbeOk(50.0), 3.0)
    return lc


@pytest.mark.parametrize(("decision", "stops", "relaunch"), [
    (RegressionDecision("keep", "within 5%"), False, None),
    (RegressionDecision("restart_same", "tok/s down 40%"), True, "tuned"),
    (RegressionDecision("next_profile", "tok/s down 40% after restart"), True, "no-prefill-graph"),
    (RegressionDecision("switch", "back-off over", "no-spec"), True, "no-spec"),
    (RegressionDecision("switch", "unknown", "gone"), False, None),
])
def test_the_lifecycle_carries_it_out(decision: RegressionDecision, stops: bool,
                                      relaunch: str | None) -> None:
    """A relaunch is a planned stop (drained) and then the target, after the engine exited."""
    lc = serving_lifecycle()
    acts = lc.handle(decision, 10.0)
    assert any(isinstance(a, Log) and a.event == "regression.decision" for a in acts)
    assert [a.reason for a in acts if isinstance(a, StopEngine)] == (
        [StopReason.REGRESSION] if stops else [])
    assert StopReason.REGRESSION.planned
    if not stops:
        assert lc.phase.value == "serving" and not any(isinstance(a, Launch) for a in acts)
        return
    acts = lc.handle(EngineExited(1, 0, True), 11.0)
    assert [(a.profile, a.restart) for a in acts if isinstance(a, Launch)] == [(relaunch, "regression")]
