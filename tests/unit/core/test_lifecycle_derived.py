"""Derived profiles through the lifecycle (issue 25): the smallest change first, then the ladder."""

from __future__ import annotations

from sglang_supervisor.core.actions import Action, Launch, Log, MarkBad
from sglang_supervisor.core.events import EngineFailed, FailureClass, ServerArgsSeen
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


def _fail_after_dump(lc: Lifecycle, dump: dict[str, str], failures: list[EngineFailed],
                     t: float) -> list[Action]:
    launch = lc.attempt
    lc.handle(Launched(launch, 42, frozenset()), t)
    lc.handle(ServerArgsSeen(3, None, dump), t + 0.05)
    for f in failures:
        lc.handle(f, t + 0.1)
    return lc.handle(EngineExited(launch, -9, False), t + 0.2)


RESOLVED_0517 = {"cuda_graph_max_bs_decode": "None", "cuda_graph_config": (
    "CudaGraphConfig(decode=PhaseConfig(backend='full', max_bs=256, bs=[1, 2, 4]), "
    "prefill=PhaseConfig(backend='breakable', max_bs=8192, bs=[4, 8]))")}


def test_a_capture_oom_of_a_profile_without_the_max_halves_sglangs_resolved_value() -> None:
    """Issue 25 A: `no-prefill-graph` sets no max batch size; SGLang's dump said 256."""
    lc = Lifecycle(settings(profile_args={"no-prefill-graph": {"tp-size": 2}},
                            profiles=("no-prefill-graph", "eager")))
    lc.handle(Start(), 0.0)
    acts = _fail_after_dump(lc, RESOLVED_0517, [EngineFailed(
        7, None, FC.CAPTURE_OOM, "Capture cuda graph failed: CUDA out of memory")], 1.0)
    [launch] = launches(acts)
    assert launch.profile == "no-prefill-graph-graph-bs-128" and launch.derived is not None
    assert dict(launch.derived.args) == {"cuda-graph-max-bs-decode": 128}
    # Without a dump (or one that resolves nothing) the ladder decides, as before.
    lc = Lifecycle(settings(profile_args={"no-prefill-graph": {}}, profiles=("no-prefill-graph", "eager")))
    lc.handle(Start(), 0.0)
    acts = _fail_after_dump(lc, {"cuda_graph_max_bs": "None"}, [EngineFailed(
        7, None, FC.CAPTURE_OOM, "Capture cuda graph failed: CUDA out of memory")], 1.0)
    assert [a.profile for a in launches(acts)] == ["eager"]


def test_a_prefill_graph_oom_trims_the_prefill_graph_instead_of_dropping_it() -> None:
    """Issue 25 B: SGLang's prefill runner says which backend failed; the OOM text comes on
    another line of the same attempt (tests/fixtures/.../prefill_capture_oom.log)."""
    on = frozenset({"flag_refused", "capture_oom", "prefill_graph_failed"})
    lc = Lifecycle(settings(derive_on=on, profile_args={"tuned": {}}))
    lc.handle(Start(), 0.0)
    lines = [EngineFailed(5, None, FC.PREFILL_GRAPH_FAILED,
                          "Fail when using backend: breakable for prefill runner."),
             EngineFailed(9, None, FC.PREFILL_GRAPH_FAILED,
                          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB.")]
    acts = _fail_after_dump(lc, RESOLVED_0517, lines, 1.0)
    [launch] = launches(acts)
    assert launch.profile == "tuned-prefill-tokens-4096" and launch.derived is not None
    assert dict(launch.derived.args) == {"cuda-graph-max-bs-prefill": 4096}
    # A prefill graph failure that is no OOM goes to the rung without the prefill graph.
    lc = Lifecycle(settings(derive_on=on, profile_args={"tuned": {}}))
    lc.handle(Start(), 0.0)
    acts = _fail_after_dump(lc, RESOLVED_0517, lines[:1], 1.0)
    assert [a.profile for a in launches(acts)] == ["no-prefill-graph"]


def test_derivation_comes_before_a_remediation_rule_naming_a_profile_and_is_switched_per_class() -> None:
    """Issue 25 E (docs/CONFIG.md, remediation): `capture_oom: low-mem` is where the ladder goes
    once derivation gives up; taking the class out of `restart.derive` makes the rule the first
    answer for that class alone; a `stop` rule never derives."""
    oom = "Capture cuda graph failed: CUDA out of memory"
    rules = {"capture_oom": "low-mem", "flag_refused": "no-spec"}
    lc = Lifecycle(settings(remediation=rules, derived_steps=1))
    lc.handle(Start(), 0.0)
    assert [a.profile for a in launches(fail(lc, FC.CAPTURE_OOM, oom, 1.0))] == ["tuned-graph-bs-16"]
    # The bound reached: the rule, from the written rung.
    assert [a.profile for a in launches(fail(lc, FC.CAPTURE_OOM, oom, 3.0))] == ["low-mem"]

    lc = Lifecycle(settings(remediation=rules, derive_on=frozenset({"flag_refused"})))
    lc.handle(Start(), 0.0)
    assert [a.profile for a in launches(fail(lc, FC.CAPTURE_OOM, oom, 1.0))] == ["low-mem"]
    lc = Lifecycle(settings(remediation=rules, derive_on=frozenset({"flag_refused"})))
    lc.handle(Start(), 0.0)
    assert [a.profile for a in launches(fail(lc, FC.FLAG_REFUSED, SBO_LINE, 1.0))] == ["tuned-no-sbo"]

    lc = Lifecycle(settings(remediation={"capture_oom": "stop"}))
    lc.handle(Start(), 0.0)
    acts = fail(lc, FC.CAPTURE_OOM, oom, 1.0)
    assert launches(acts) == [] and not [a for a in acts if isinstance(a, Log)
                                          and a.event == "profile.derived"]
