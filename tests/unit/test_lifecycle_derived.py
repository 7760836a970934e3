"""Derived profiles through the lifecycle (issue 25): the smallest change first, then the ladder."""

from __future__ import annotations

from sglang_supervisor.core.actions import Action, Launch, Log, MarkBad
from sglang_supervisor.core.events import EngineFailed, FailureClass
from sglang_supervisor.core.inputs import EngineExited, Launched, Settings, Start
from sglang_supervisor.core.lifecycle import Lifecycle

FC = FailureClass
ORDER = ("tuned", "no-prefill-graph", "low-mem", "no-spec", "eager")
SBO_LINE = ("ValueError: SBO (single batch overlap) is not supported on SM90 GPUs with latest "
            "sgl-deep-gemm wheel. Please try removing --enable-single-batch-overlap argument.")
ARGS = {"tuned": {"enable-single-batch-overlap": True, "cuda-graph-max-bs-decode": 32, "tp-size": 2}}


def settings(**kw: object) -> Settings:
    base: dict[str, object] = {
        "profiles": ORDER, "profile_args": ARGS, "derive_on": frozenset({"flag_refused", "capture_oom"}),
        "derived_steps": 2}
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


def fail(lc: Lifecycle, failure: FailureClass, message: str, t: float) -> list[Action]:
    launch = lc.attempt
    lc.handle(Launched(launch, 42, frozenset()), t)
    lc.handle(EngineFailed(7, "TP0", failure, message), t + 0.1)
    return lc.handle(EngineExited(launch, -9, False), t + 0.2)


def launches(acts: list[Action]) -> list[Launch]:
    return [a for a in acts if isinstance(a, Launch)]


def test_refused_flag_then_capture_oom_then_the_rung_after_the_base() -> None:
    lc = Lifecycle(settings(derived_steps=2))
    lc.handle(Start(), 0.0)
    acts = fail(lc, FC.FLAG_REFUSED, SBO_LINE, 1.0)
    [launch] = launches(acts)
    assert launch.profile == "tuned-no-sbo" and launch.derived is not None
    assert launch.derived.remove == ("enable-single-batch-overlap",)
    assert [a.profile for a in acts if isinstance(a, MarkBad)] == ["tuned"]
    [log] = [a for a in acts if isinstance(a, Log) and a.event == "profile.derived"]
    assert log.fields["asked_by"] == SBO_LINE and log.fields["step"] == 1
    assert lc.snapshot(2.0)["derived_profiles"]["tuned-no-sbo"]["base"] == "tuned"

    acts = fail(lc, FC.CAPTURE_OOM, "Capture cuda graph failed: CUDA out of memory", 3.0)
    [launch] = launches(acts)
    assert launch.profile == "tuned-no-sbo-graph-bs-16" and launch.derived is not None
    assert dict(launch.derived.args) == {"cuda-graph-max-bs-decode": 16}
    assert launch.derived.remove == ("enable-single-batch-overlap",)  # the first change is kept

    # The bound (2 steps) is reached: the ladder goes on after the written rung, not from its top.
    acts = fail(lc, FC.CAPTURE_OOM, "Capture cuda graph failed: CUDA out of memory", 5.0)
    assert [a.profile for a in launches(acts)] == ["no-prefill-graph"]
    assert [a.profile for a in acts if isinstance(a, MarkBad)] == ["tuned-no-sbo-graph-bs-16"]


def test_derivation_off_walks_the_written_ladder() -> None:
    for off in (settings(derive_on=frozenset()), settings(derived_steps=0)):
        lc = Lifecycle(off)
        lc.handle(Start(), 0.0)
        assert [a.profile for a in launches(fail(lc, FC.FLAG_REFUSED, SBO_LINE, 1.0))] == [
            "no-prefill-graph"]


def test_a_failure_no_rule_answers_walks_the_ladder() -> None:
    lc = Lifecycle(settings())
    lc.handle(Start(), 0.0)
    acts = fail(lc, FC.PREFILL_GRAPH_FAILED, "Fail when using backend: breakable", 1.0)
    assert [(a.profile, a.derived) for a in launches(acts)] == [("no-prefill-graph", None)]
