"""Regression policy: table-driven, pure, no clocks."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_supervisor.core.regression import (
    Evaluation,
    Explained,
    Fingerprint,
    KeepFaster,
    NoAction,
    Observations,
    PolicySettings,
    Reason,
    Remediation,
    Reprobe,
    RestartSame,
    RetryPrimary,
    TryNextProfile,
    decision_name,
    evaluate,
    explain,
    is_regressed,
    updated_baseline,
)
from sglang_supervisor.shell.telemetry.gpu import ForeignProcess, GpuInfo

S = PolicySettings(delta=0.15, window=3, baseline_runs=3, cooldown_s=600.0)
GOOD = [100.0, 101.0, 99.0]
SLOW = [*GOOD, 60.0, 58.0]  # median of the last 3 = 60 < 85


def gpu(**kw: Any) -> GpuInfo:
    base: dict[str, Any] = dict(
        index=0, uuid="GPU-0", name="NVIDIA H200", compute_capability="9.0", driver="580",
        memory_used_bytes=1, memory_total_bytes=2, utilization_ratio=0.5, temperature_c=60.0,
        temperature_slowdown_c=87.0, power_w=300.0, power_limit_w=700.0, sm_clock_hz=1.98e9,
        throttle_reasons=(), processes=(),
    )
    base.update(kw)
    return GpuInfo(**base)


def run(samples: list[float], *, baseline: float | None = 100.0, confirmed: bool = False,
        obs: Observations | None = None, state: Remediation | None = None, profile: str = "fast",
        now: float = 1000.0, settings: PolicySettings = S) -> Evaluation:
    return evaluate(profile=profile, primary="fast", samples=samples, baseline=baseline,
                    confirmed=confirmed, observations=obs or Observations(), state=state or Remediation(),
                    settings=settings, now=now)


@pytest.mark.parametrize(
    ("samples", "baseline", "delta", "window", "expected"),
    [
        ([100, 100, 100], 100, 0.15, 3, False),
        ([100, 100, 84], 100, 0.15, 3, False),  # one slow probe does not move the median
        ([100, 84, 84], 100, 0.15, 3, True),
        ([100, 86, 86], 100, 0.15, 3, False),  # within δ
        ([50, 50], 100, 0.15, 3, False),  # not enough probes for the window
        ([50], 100, 0.15, 1, True),
        ([50, 50, 50], 0, 0.15, 3, False),  # no usable baseline
    ],
)
def test_is_regressed(samples: list[float], baseline: float, delta: float, window: int,
                      expected: bool) -> None:
    assert is_regressed(samples, baseline, delta, window) is expected


@pytest.mark.parametrize(
    ("stored", "samples", "expected"),
    [
        (None, [10, 30, 20], 20),
        (None, [10, 30], None),  # not enough probes yet
        (25, [10, 30, 20], 25),  # a slow start never lowers the reference
        (15, [10, 30, 20, 1], 20),  # a faster start raises it; later probes do not count
    ],
)
def test_updated_baseline(stored: float | None, samples: list[float], expected: float | None) -> None:
    assert updated_baseline(stored, samples, 3) == expected


def test_fingerprint_key_covers_every_field() -> None:
    a = Fingerprint("fast", "0.5.17", "NVIDIA H200", "580.159.04", "v1-in256-out128")
    assert a.key() == "fast|0.5.17|NVIDIA H200|580.159.04|v1-in256-out128"
    assert a.key() != Fingerprint("fast", "0.5.23", "NVIDIA H200", "580.159.04", "v1-in256-out128").key()


@pytest.mark.parametrize(
    ("name", "kwargs", "decision", "stage"),
    [
        ("no baseline yet", dict(samples=[100.0], baseline=None),
         NoAction("collecting the baseline"), "idle"),
        ("fast enough", dict(samples=GOOD), NoAction(), "idle"),
        ("slow, unconfirmed", dict(samples=SLOW), Reprobe(), "idle"),
        ("slow, confirmed, unexplained", dict(samples=SLOW, confirmed=True), RestartSame(), "restarted_same"),
        ("still slow after the restart",
         dict(samples=SLOW, confirmed=True, state=Remediation("restarted_same", "fast", 60.0)),
         TryNextProfile(), "trying_next"),
        ("the restart fixed it",
         dict(samples=GOOD, state=Remediation("restarted_same", "fast", 60.0)),
         NoAction("the restart restored throughput"), "idle"),
        ("too few probes after the restart to call it fixed",
         dict(samples=[60.0, 58.0], state=Remediation("restarted_same", "fast", 60.0)),
         NoAction("not enough probes since the start"), "restarted_same"),
        ("acting disabled",
         dict(samples=SLOW, confirmed=True, settings=PolicySettings(act=False)),
         NoAction("unexplained regression; acting on regressions is disabled"), "idle"),
    ],
)
def test_decision_table(name: str, kwargs: dict[str, Any], decision: object, stage: str) -> None:
    ev = run(**kwargs)
    assert ev.decision == decision, name
    assert ev.state.stage == stage, name


def test_evaluation_carries_ratio_and_median() -> None:
    ev = run(SLOW)
    assert ev.median_tps == 60.0
    assert ev.ratio == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("obs", "reason"),
    [
        (Observations(running=3, queued=0), Reason.BUSY),
        (Observations(running=0, queued=2), Reason.BUSY),
        (Observations(decode_cuda_graph=False), Reason.EAGER_DECODE),
        (Observations(eager_passes_growth=40.0), Reason.EAGER_DECODE),
        (Observations(gpus=[gpu(throttle_reasons=("gpu_idle", "hw_thermal_slowdown"))]), Reason.GPU_THROTTLE),
        (Observations(gpus=[gpu(temperature_c=85.0)]), Reason.GPU_TEMPERATURE),
        (Observations(gpus=[gpu(temperature_c=86.0, temperature_slowdown_c=None)]), Reason.GPU_TEMPERATURE),
        (Observations(gpus=[gpu(power_w=690.0)]), Reason.GPU_POWER),
        (Observations(foreign=[ForeignProcess(0, "GPU-0", 4242, 2**30, "python3")]),
         Reason.FOREIGN_GPU_PROCESS),
    ],
)
def test_explained_regressions_never_restart(obs: Observations, reason: Reason) -> None:
    ev = run(SLOW, confirmed=True, obs=obs)
    assert isinstance(ev.decision, Explained)
    assert [e.reason for e in ev.decision.reasons] == [reason]
    assert ev.state == Remediation()  # nothing escalates while explained


@pytest.mark.parametrize(
    "obs",
    [
        Observations(gpus=[gpu()]),  # a healthy GPU explains nothing
        Observations(gpus=[gpu(throttle_reasons=("gpu_idle", "applications_clocks_setting"))]),
        Observations(gpus=[gpu(index=1, temperature_c=95.0)], our_gpu_indices=frozenset({0})),  # not ours
        Observations(foreign=[ForeignProcess(1, "GPU-1", 4242, 1, None)], our_gpu_indices=frozenset({0})),
        Observations(decode_cuda_graph=True, eager_passes_growth=0.0, running=0, queued=0),
    ],
)
def test_things_that_do_not_explain(obs: Observations) -> None:
    assert explain(obs) == ()
    assert run(SLOW, confirmed=True, obs=obs).decision == RestartSame()


def test_trying_next_measures_then_keeps_the_faster() -> None:
    state = Remediation("trying_next", "fast", 60.0)
    # On the successor, its first probes are collected first.
    ev = run([90.0], baseline=None, profile="safe", state=state)
    assert ev.decision == NoAction("measuring the next profile")
    # The successor is faster than the regressed primary measured: keep it, start the cool-down.
    ev = run([90.0, 91.0, 89.0], baseline=None, profile="safe", state=state, now=5000.0)
    assert ev.decision == KeepFaster("safe")
    assert ev.state.stage == "settled" and ev.state.settled_at == 5000.0
    # The successor is slower: go back to the regressed profile (no cool-down: it is the primary).
    ev = run([40.0, 41.0, 39.0], baseline=None, profile="safe", state=state)
    assert ev.decision == KeepFaster("fast")
    assert ev.state.settled_at is None


def test_retry_primary_after_the_cooldown_only() -> None:
    settled = Remediation("settled", "fast", 60.0, settled_at=1000.0)
    assert run(GOOD, profile="safe", state=settled, now=1599.0).decision == NoAction()
    ev = run(GOOD, profile="safe", state=settled, now=1600.0)
    assert ev.decision == RetryPrimary()
    # Back on the primary: fine for a cool-down → the ladder resets; slow again before that →
    # straight to the next profile.
    assert run(GOOD, state=ev.state, now=1700.0).state == ev.state
    assert run(GOOD, state=ev.state, now=1600.0 + S.cooldown_s).state == Remediation()
    assert run(SLOW, confirmed=True, state=ev.state, now=1700.0).decision == TryNextProfile()


def test_one_same_profile_restart_per_cooldown() -> None:
    restarted = run(SLOW, confirmed=True, now=1000.0)
    assert restarted.decision == RestartSame() and restarted.state.restarted_at == 1000.0
    # After the restart the first probes are fine: watched, not forgotten, within the cool-down...
    ev = run(GOOD, state=restarted.state, now=1100.0)
    assert ev.decision == NoAction("the restart restored throughput; watching it for the cool-down")
    assert ev.state == restarted.state
    # ...so the regression coming back is "still regressed": next profile, not another restart.
    again = run([*GOOD, 60.0, 58.0], confirmed=True, state=ev.state, now=1200.0)
    assert again.decision == TryNextProfile() and again.state.stage == "trying_next"
    # Fine for a whole cool-down: the ladder resets and a later regression restarts once more.
    ev = run(GOOD, state=restarted.state, now=1000.0 + S.cooldown_s)
    assert ev.state == Remediation()
    assert run(SLOW, confirmed=True, state=ev.state, now=2000.0).decision == RestartSame()


def test_a_settled_fallback_that_regresses_starts_over_with_a_restart() -> None:
    settled = Remediation("settled", "fast", 60.0, settled_at=1000.0)
    ev = run(SLOW, confirmed=True, profile="safe", state=settled)
    assert ev.decision == RestartSame()
    assert ev.state.regressed_profile == "safe"


def test_decision_names_are_stable() -> None:
    names = [decision_name(d) for d in (NoAction(), Reprobe(), Explained(()), RestartSame(), TryNextProfile(),
                                        KeepFaster("x"), RetryPrimary())]
    assert names == ["no_action", "reprobe", "explained", "restart_same", "try_next_profile", "keep_faster",
                     "retry_primary"]


def test_a_slowdown_with_acceptance_collapsed_is_named_with_both_numbers_and_acted_on() -> None:
    """Issue 23 item 5: the draft path collapsed (accept 1.05 against 3.2 at this start's
    baseline): named as such, and unlike load or throttling it does not excuse the slowdown."""
    obs = Observations(accept_length=1.05, baseline_accept=3.2)
    [named] = explain(obs)
    assert named.reason is Reason.ACCEPT_COLLAPSE and "1.05" in named.detail and "3.20" in named.detail
    ev = run(SLOW, confirmed=True, obs=obs)
    assert isinstance(ev.decision, RestartSame)
    assert [e.reason for e in ev.explanations] == [Reason.ACCEPT_COLLAPSE]
    # ordinary variation of the accept length names nothing
    assert explain(Observations(accept_length=2.9, baseline_accept=3.2)) == ()
    # with a real excuse too, the slowdown is explained (kept) and both are named
    both = run(SLOW, confirmed=True, obs=Observations(accept_length=1.0, baseline_accept=3.0, running=2))
    assert isinstance(both.decision, Explained)
    assert {e.reason for e in both.explanations} == {Reason.ACCEPT_COLLAPSE, Reason.BUSY}
