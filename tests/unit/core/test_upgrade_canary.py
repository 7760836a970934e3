"""The upgrade canary (issue 24): the verdict table (core/canary.py), the per-profile plan of an
upgrade (core/upgradeplan.py), and the lifecycle's side driven by hand: a candidate judged at its
READY probe is promoted, or stopped and rolled back through the reload rollback; a candidate that
fails to start rolls back without walking the ladder."""

from __future__ import annotations

import pytest

from lifecycle_driver import LifecycleDriver
from sglang_supervisor.core.actions import (
    Action,
    CanaryJudged,
    Launch,
    Log,
    MarkBad,
    MarkGood,
    NotifyReady,
    RollBack,
    StopEngine,
)
from sglang_supervisor.core.canary import CanaryPlan, Reference, judge, mismatch_detail
from sglang_supervisor.core.config import parse_config
from sglang_supervisor.core.events import CaptureBegan, CaptureEnded, HttpUp, ServerReady, WeightsLoadBegan
from sglang_supervisor.core.inputs import (
    EngineExited,
    FidelityFailed,
    ProbeOk,
    ReloadRequested,
    Settings,
    Start,
)
from sglang_supervisor.core.upgradeplan import candidate_config, plan_text, plan_upgrade
from sglang_supervisor.shell.files.configfile import default_demo_config_path

PLAN = CanaryPlan("0.5.22", "0.5.23", "/opt/sglang-new/bin/python",
                  Reference("0.5.22", "tuned", 100.0, 0.20))


@pytest.mark.parametrize(("tok_s", "ttft_s", "fidelity", "promote", "word"), [
    (100.0, 0.20, "not_checked", True, "min_tps_ratio"),   # as fast
    (98.0, 0.20, "not_checked", True, "0.980"),           # at the tolerance
    (97.9, 0.20, "not_checked", False, "min_tps_ratio"),  # just below it
    (150.0, 0.23, "not_checked", False, "max_ttft_ratio"),  # faster decode, TTFT 15 % worse
    (150.0, None, "not_checked", True, "min_tps_ratio"),  # TTFT not measured: decode decides
    (None, 0.1, "not_checked", False, "measured no tok/s"),
    (150.0, 0.1, "fail", False, "fidelity"),
    (150.0, 0.1, "unavailable", False, "cannot show"),  # no sample: the candidate cannot prove itself
    (150.0, 0.1, "pass", True, "min_tps_ratio"),
    (50.0, 0.1, "pass", False, "min_tps_ratio"),  # right answers do not redeem a slow candidate
    (97.9, 0.20, "fail", False, "fidelity"),  # fidelity is named first when both fail
])
def test_the_verdict(tok_s: float | None, ttft_s: float | None, fidelity: str, promote: bool,
                     word: str) -> None:
    v = judge(PLAN, tok_s, ttft_s, fidelity)
    assert v.promote is promote and word in v.reason, v
    assert v.to_json()["fidelity"] == fidelity


def test_a_fidelity_mismatch_names_the_prompt_and_both_texts_bounded() -> None:
    detail = mismatch_detail("prefix", "greedy tokens agree for 0 of 16", "What is 2+2?",
                             "4" * 1000, "garbage " * 200)
    v = judge(PLAN, 150.0, 0.1, "fail", detail)
    assert not v.promote and v.reason.startswith("fidelity:")
    assert "'What is 2+2?'" in v.reason and "expected '444" in v.reason and "received 'garbage" in v.reason
    assert len(v.reason) < 400


def test_an_unknown_fidelity_word_does_not_promote() -> None:
    v = judge(PLAN, 150.0, 0.1, "maybe")
    assert not v.promote and v.fidelity == "unavailable"


def test_no_reference_promotes_on_a_start_alone_and_says_so() -> None:
    v = judge(CanaryPlan("0.5.22", "0.5.23", "p", None), 10.0, None)
    assert v.promote and "no tok/s" in v.reason and v.tps_ratio is None


def demo():  # type: ignore[no-untyped-def]
    return parse_config(default_demo_config_path().read_text())


def test_the_plan_names_renames_and_new_defaults_per_profile() -> None:
    plan = plan_upgrade(demo(), "0.5.13", "0.5.23")
    tuned = plan.tuned
    assert tuned.profile == "tuned" and tuned.expressible and not plan.blocked
    assert any("--mamba-radix-cache-strategy" in r for r in tuned.renamed)
    assert any("SGLANG_ENABLE_SPEC_V2" in d for d in tuned.dropped)
    assert any(d.startswith("prefill CUDA graph") for d in tuned.defaults)
    assert "the canary may start" in plan_text(plan)[-1]


def test_a_tuned_profile_the_candidate_refuses_blocks_the_upgrade_with_the_fix() -> None:
    config = demo()
    tuned = config.profiles[0].model_copy(update={"args": {"cuda-graph-backend-prefill": "tc_piecewise"}})
    config = config.model_copy(update={"profiles": [tuned, *config.profiles[1:]]})
    plan = plan_upgrade(config, "0.5.21", "0.5.22")
    assert plan.blocked and "tc_piecewise" in (plan.blocked_reason or "")
    text = plan_text(plan)
    assert "  profile tuned: REFUSED" in text and any(t.startswith("      fix: ") for t in text)
    # the real parser's refusals count as well
    parsed = plan_upgrade(demo(), "0.5.23", "0.5.23", {"tuned": ["unrecognized arguments: --x"]})
    assert parsed.blocked and "unrecognized arguments" in (parsed.blocked_reason or "")


def test_the_candidate_runs_the_same_command_from_its_own_venv() -> None:
    config = demo()
    c = candidate_config(config, "/opt/sglang-new/bin/python")
    assert c.engine.command == ["/opt/sglang-new/bin/python", "-m", "sglang_supervisor.simulator"]
    assert c.engine.interpreter == "/opt/sglang-new/bin/python" and c.engine.version == "auto"
    assert c.profiles == config.profiles
    cli = config.model_copy(update={"engine": config.engine.model_copy(
        update={"command": ["/opt/sglang/bin/sglang", "serve"]})})
    assert candidate_config(cli, "/opt/sglang-new/bin/python").engine.command == [
        "/opt/sglang-new/bin/sglang", "serve"]


# -- the lifecycle ------------------------------------------------------------------------------

LADDER = ("tuned", "no-prefill-graph", "eager")
CAPTURES = frozenset({("target", "decode", "TP0")})


class Run(LifecycleDriver):
    def __init__(self) -> None:
        super().__init__(Settings(profiles=LADDER, remediation={"default": "next"}))

    def launched(self, acts: list[Action]) -> Launch:
        return self.answer_launch(acts, CAPTURES)

    def to_probe(self, tok_s: float) -> list[Action]:
        return self.feed(WeightsLoadBegan(1, "TP0", 1.0),
                         CaptureBegan(2, "TP0", "target", "decode", "full"),
                         CaptureEnded(3, "TP0", "target", "decode", 1.0, 0.5),
                         HttpUp(4, None, "127.0.0.1", 30000), ServerReady(5, None),
                         ProbeOk(tok_s, 0.2))

    def candidate_started(self) -> Launch:
        self.launched(self.feed(Start()))
        self.to_probe(100.0)
        acts = self.feed(ReloadRequested(True, Settings(profiles=LADDER,
                                                        remediation={"default": "next"}), PLAN))
        assert StopEngine("reload") in acts
        return self.launched(acts + self.feed(EngineExited(self.lc.attempt, -9, True)))


def kinds(acts: list[Action], kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in acts if isinstance(a, kind)]


def test_a_candidate_as_fast_is_promoted_at_ready() -> None:
    run = Run()
    assert run.candidate_started().profile == "tuned"
    acts = run.to_probe(120.0)
    judged = kinds(acts, CanaryJudged)
    assert len(judged) == 1 and judged[0].verdict.promote and judged[0].profile == "tuned"
    assert kinds(acts, MarkGood) and NotifyReady() in acts and not kinds(acts, StopEngine)
    assert run.lc.rollback_to is None


def test_a_slower_candidate_is_stopped_and_the_current_release_comes_back() -> None:
    run = Run()
    run.candidate_started()
    acts = run.to_probe(50.0)
    judged = kinds(acts, CanaryJudged)
    assert len(judged) == 1 and not judged[0].verdict.promote
    assert StopEngine("canary_rejected") in acts
    assert not kinds(acts, MarkGood) and NotifyReady() not in acts  # never READY on the candidate
    back = run.feed(EngineExited(run.lc.attempt, 0, True))
    roll = kinds(back, RollBack)
    assert len(roll) == 1 and roll[0].failure_class == "canary_rejected"
    assert "min_tps_ratio" in roll[0].message
    assert kinds(back, Launch)[-1].profile == "tuned"
    logs = [a for a in back if isinstance(a, Log) and a.event == "supervisor.reload_rolled_back"]
    assert "upgrade candidate" in logs[0].fields["hint"]


def test_a_failed_fidelity_check_at_ready_rolls_back_a_faster_candidate() -> None:
    run = Run()
    run.candidate_started()
    run.feed(WeightsLoadBegan(1, "TP0", 1.0), CaptureBegan(2, "TP0", "target", "decode", "full"),
             CaptureEnded(3, "TP0", "target", "decode", 1.0, 0.5),
             HttpUp(4, None, "127.0.0.1", 30000), ServerReady(5, None))
    acts = run.feed(ProbeOk(200.0, 0.1, fidelity="fail"))
    judged = kinds(acts, CanaryJudged)
    assert not judged[0].verdict.promote and judged[0].verdict.fidelity == "fail"
    assert StopEngine("canary_rejected") in acts


def test_a_mismatch_at_the_candidate_gate_rejects_the_candidate_not_the_profile() -> None:
    """An output_mismatch fed at a canary's ready gate is the candidate's verdict: rolled back to
    the same profile on the current release, nothing marked bad, no rung walked."""
    run = Run()
    run.candidate_started()
    run.feed(WeightsLoadBegan(1, "TP0", 1.0), CaptureBegan(2, "TP0", "target", "decode", "full"),
             CaptureEnded(3, "TP0", "target", "decode", 1.0, 0.5),
             HttpUp(4, None, "127.0.0.1", 30000), ServerReady(5, None))
    acts = run.feed(FidelityFailed("prefix", "greedy tokens agree for 0 of 16", "What is 2+2?",
                                   "4", "zzz"))
    [judged] = kinds(acts, CanaryJudged)
    assert not judged.verdict.promote and judged.verdict.fidelity == "fail"
    assert "'What is 2+2?'" in judged.verdict.reason
    assert StopEngine("canary_rejected") in acts and NotifyReady() not in acts
    back = run.feed(EngineExited(run.lc.attempt, 0, True))
    [roll] = kinds(back, RollBack)
    assert roll.failure_class == "canary_rejected" and "fidelity" in roll.message
    assert kinds(back, Launch)[-1].profile == "tuned"  # the same rung, on the current release
    assert not kinds(acts + back, MarkBad)
    assert not [a for a in back if isinstance(a, Log) and a.event == "profile.fallback"]
    # the current release serves again, as the same profile, with no canary
    run.launched(back)
    again = run.to_probe(100.0)
    assert not kinds(again, CanaryJudged) and NotifyReady() in again


def test_a_mismatch_outside_a_canary_still_walks_the_ladder() -> None:
    run = Run()
    run.launched(run.feed(Start()))
    run.feed(WeightsLoadBegan(1, "TP0", 1.0), CaptureBegan(2, "TP0", "target", "decode", "full"),
             CaptureEnded(3, "TP0", "target", "decode", 1.0, 0.5),
             HttpUp(4, None, "127.0.0.1", 30000), ServerReady(5, None))
    acts = run.feed(FidelityFailed("prefix", "greedy tokens agree for 0 of 16"))
    assert StopEngine("output_mismatch") in acts and not kinds(acts, CanaryJudged)
    back = run.feed(EngineExited(run.lc.attempt, 0, True))
    assert kinds(back, Launch)[-1].profile == "no-prefill-graph"


def test_a_candidate_that_fails_to_start_rolls_back_without_walking_the_ladder() -> None:
    run = Run()
    run.candidate_started()
    acts = run.feed(EngineExited(run.lc.attempt, 2, False))  # argparse: rc 2
    assert kinds(acts, RollBack) and not kinds(acts, CanaryJudged)
    assert kinds(acts, Launch)[-1].profile == "tuned"
    assert not [a for a in acts if isinstance(a, Log) and a.event == "profile.fallback"]
    # the current release's READY afterwards is no canary
    run.launched(acts)
    assert not kinds(run.to_probe(100.0), CanaryJudged)
