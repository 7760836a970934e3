"""Throughput regression policy: pure functions from probe history and observations to a decision.

Rules (issue 4): the baseline is the median of the first probes after a start, per fingerprint
(profile, engine version, GPU, driver, probe shape). A regression is the median of the last k
probes below (1 − δ) × baseline, confirmed by an immediate re-probe. A confirmed regression is
first explained (throttling, heat, power cap, foreign GPU processes, decode without CUDA graphs,
traffic); only an unexplained one is acted on: restart the same profile once (once per cool-down:
a regression that returns soon after the restart counts as "still regressed"), then try the next
profile and keep whichever probes faster, and after a cool-down try the primary again.
Busy is not slow: load is an explanation, never a reason to restart.

Nothing here sleeps, reads a clock or does I/O: the monitor passes `now` and the observations.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Literal

from sglang_supervisor.core.fidelity import accept_collapsed
from sglang_supervisor.core.gpufacts import SLOWDOWN_REASONS, ForeignProcess, GpuInfo

HOT_MARGIN_C = 3.0  # this close to the board's slowdown temperature counts as "hot"
HOT_FALLBACK_C = 85.0  # when the board does not report its slowdown threshold
POWER_CAP_RATIO = 0.97  # drawing this share of the enforced limit counts as "at the power cap"


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What a baseline is valid for. A new driver or engine version starts a new baseline."""

    profile: str
    engine_version: str
    gpu: str
    driver: str
    shape: str

    def key(self) -> str:
        return "|".join((self.profile, self.engine_version, self.gpu, self.driver, self.shape))


class Reason(str, Enum):
    """Why probes can be slow without anything being wrong with the engine. Stable values:
    they are metric label values and appear in events."""

    GPU_THROTTLE = "gpu_throttle"
    GPU_TEMPERATURE = "gpu_temperature"
    GPU_POWER = "gpu_power"
    FOREIGN_GPU_PROCESS = "foreign_gpu_process"
    EAGER_DECODE = "eager_decode"
    BUSY = "busy"
    # The probe's speculative accept length fell far below this start's baseline accept length:
    # the draft path collapsed. Named with both numbers, and (unlike the others) acted on: it is
    # the engine's own fault, the profile's fidelity to the draft (core/fidelity.py).
    ACCEPT_COLLAPSE = "accept_collapse"


# Explanations that name a slowdown but do not excuse it: the regression is still acted on.
ACTED_ON = frozenset({Reason.ACCEPT_COLLAPSE})
ACCEPT_COLLAPSE_RATIO = 0.5  # core/fidelity.accept_collapsed's default share


@dataclass(frozen=True, slots=True)
class Explanation:
    reason: Reason
    detail: str


@dataclass(frozen=True, slots=True)
class Observations:
    """What the monitor saw around the confirming probe."""

    gpus: Sequence[GpuInfo] | None = None  # None: no NVML
    our_gpu_indices: frozenset[int] | None = None  # None: every GPU is ours
    foreign: Sequence[ForeignProcess] = ()
    decode_cuda_graph: bool | None = None  # last `Decode batch ... cuda graph: X` (DecodeStats)
    eager_passes_growth: float | None = None  # growth of sglang:cuda_graph_passes_total{mode="decode_none"}
    running: int | None = None  # engine load during the probe (besides the probe itself)
    queued: int | None = None
    accept_length: float | None = None  # the confirming probe's spec_accept_length
    baseline_accept: float | None = None  # the median accept length of this start's baseline probes


def explain(obs: Observations) -> tuple[Explanation, ...]:
    out: list[Explanation] = []
    for g in obs.gpus or ():
        if obs.our_gpu_indices is not None and g.index not in obs.our_gpu_indices:
            continue
        slow = sorted(SLOWDOWN_REASONS.intersection(g.throttle_reasons))
        if slow:
            out.append(Explanation(Reason.GPU_THROTTLE, f"GPU {g.index} clocks held back: {', '.join(slow)}"))
        if g.temperature_c is not None:
            limit = (g.temperature_slowdown_c - HOT_MARGIN_C) if g.temperature_slowdown_c else HOT_FALLBACK_C
            if g.temperature_c >= limit:
                out.append(Explanation(Reason.GPU_TEMPERATURE, f"GPU {g.index} at {g.temperature_c:.0f} °C"))
        if g.power_w is not None and g.power_limit_w and g.power_w >= POWER_CAP_RATIO * g.power_limit_w:
            detail = f"GPU {g.index} draws {g.power_w:.0f} W of its {g.power_limit_w:.0f} W limit"
            out.append(Explanation(Reason.GPU_POWER, detail))
    foreign = [f for f in obs.foreign if obs.our_gpu_indices is None or f.gpu_index in obs.our_gpu_indices]
    if foreign:
        desc = ", ".join(
            f"pid {f.pid}{f' ({f.command})' if f.command else ''} on GPU {f.gpu_index}" for f in foreign[:5]
        )
        out.append(Explanation(Reason.FOREIGN_GPU_PROCESS, f"other processes share our GPUs: {desc}"))
    if obs.decode_cuda_graph is False:
        detail = "decode batches run without CUDA graphs (cuda graph: False)"
        out.append(Explanation(Reason.EAGER_DECODE, detail))
    elif obs.eager_passes_growth:
        out.append(Explanation(
            Reason.EAGER_DECODE,
            f"{obs.eager_passes_growth:.0f} decode passes ran without a CUDA graph (decode_none)",
        ))
    if accept_collapsed(obs.baseline_accept, obs.accept_length, ACCEPT_COLLAPSE_RATIO):
        out.append(Explanation(Reason.ACCEPT_COLLAPSE, (
            f"speculative acceptance collapsed: accept length {obs.accept_length:.2f} against "
            f"{obs.baseline_accept:.2f} at the baseline (the draft path, not the GPU)")))
    if (obs.running or 0) + (obs.queued or 0) > 0:
        detail = f"the engine was serving traffic ({obs.running or 0} running, {obs.queued or 0} queued)"
        out.append(Explanation(Reason.BUSY, detail))
    return tuple(out)


# --- decisions ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NoAction:
    why: str = ""


@dataclass(frozen=True, slots=True)
class Reprobe:
    """Probe again right away: a regression must be confirmed before anything else."""


@dataclass(frozen=True, slots=True)
class Explained:
    reasons: tuple[Explanation, ...]


@dataclass(frozen=True, slots=True)
class RestartSame:
    """Restart the engine with the same profile (once)."""


@dataclass(frozen=True, slots=True)
class TryNextProfile:
    """Restart with the next profile of the ladder; its probes are then compared with this one."""


@dataclass(frozen=True, slots=True)
class KeepFaster:
    """Settle on `profile` (the faster of the regressed profile and its successor)."""

    profile: str


@dataclass(frozen=True, slots=True)
class RetryPrimary:
    """The cool-down since leaving the primary profile is over: start it again."""


Decision = NoAction | Reprobe | Explained | RestartSame | TryNextProfile | KeepFaster | RetryPrimary


_DECISION_NAMES: dict[type, str] = {
    NoAction: "no_action", Reprobe: "reprobe", Explained: "explained", RestartSame: "restart_same",
    TryNextProfile: "try_next_profile", KeepFaster: "keep_faster", RetryPrimary: "retry_primary",
}
DECISION_NAMES: tuple[str, ...] = tuple(_DECISION_NAMES.values())


def decision_name(d: Decision) -> str:
    """Stable snake_case name (metric label, event field)."""
    return _DECISION_NAMES[type(d)]


Stage = Literal["idle", "restarted_same", "trying_next", "settled"]


@dataclass(frozen=True, slots=True)
class Remediation:
    """Where we are on the remediation ladder. It outlives engine restarts: the owner of the
    supervisor's state keeps it and hands it back with every evaluation."""

    stage: Stage = "idle"
    regressed_profile: str | None = None
    regressed_tps: float | None = None  # what the regressed profile measured when we left it
    settled_at: float | None = None  # when we settled on a profile other than the primary
    # When the same-profile restart (or the primary's retry) was decided. A restart that restores
    # throughput only for a while does not earn another one: until `cooldown_s` has passed, a
    # new regression of that profile moves down the ladder instead of restarting it again.
    restarted_at: float | None = None


@dataclass(frozen=True, slots=True)
class PolicySettings:
    delta: float = 0.15
    window: int = 3
    baseline_runs: int = 3
    cooldown_s: float = 3600.0
    act: bool = True


@dataclass(frozen=True, slots=True)
class Evaluation:
    decision: Decision
    state: Remediation
    median_tps: float | None = None  # of the last `window` probes
    ratio: float | None = None  # median / baseline
    explanations: tuple[Explanation, ...] = field(default=())


def median_of_first(samples: Sequence[float], runs: int) -> float | None:
    return statistics.median(samples[:runs]) if len(samples) >= runs else None


def updated_baseline(stored: float | None, samples: Sequence[float], runs: int) -> float | None:
    """The baseline after this start's probes: the stored one, or the first-probes median when it
    is new or faster. Never lowered: a start that is already slow must not become the reference."""
    fresh = median_of_first(samples, runs)
    if fresh is None:
        return stored
    return fresh if stored is None or fresh > stored else stored


def is_regressed(samples: Sequence[float], baseline: float, delta: float, window: int) -> bool:
    if len(samples) < window or baseline <= 0:
        return False
    return statistics.median(samples[-window:]) < (1.0 - delta) * baseline


def evaluate(
    *,
    profile: str,
    primary: str,
    samples: Sequence[float],
    baseline: float | None,
    confirmed: bool,
    observations: Observations,
    state: Remediation,
    settings: PolicySettings,
    now: float,
) -> Evaluation:
    """One decision after a probe.

    `samples`: decode tok/s of this start's successful probes, oldest first, including the one just
    taken. `confirmed`: the newest sample is the immediate re-probe asked for by `Reprobe`.

    Long because: one decision table read top to bottom, first match wins (successor being measured,
    no baseline, not regressed, unconfirmed, explained, disabled, act); each row is a few lines and
    their order is the policy, which a split would hide.
    """
    window_median = statistics.median(samples[-settings.window:]) if samples else None
    ratio = window_median / baseline if window_median is not None and baseline else None

    def result(decision: Decision, new_state: Remediation = state,
               explanations: tuple[Explanation, ...] = ()) -> Evaluation:
        return Evaluation(decision, new_state, window_median, ratio, explanations)

    # On the successor profile: measure it, then keep whichever of the two is faster.
    if state.stage == "trying_next" and profile != state.regressed_profile:
        candidate = median_of_first(samples, settings.baseline_runs)
        if candidate is None:
            return result(NoAction("measuring the next profile"))
        keep = profile if candidate >= (state.regressed_tps or 0.0) else (state.regressed_profile or profile)
        settled = Remediation("settled", state.regressed_profile, state.regressed_tps,
                              now if keep != primary else None)
        return result(KeepFaster(keep), settled)

    if baseline is None:
        return result(NoAction("collecting the baseline"))

    if not is_regressed(samples, baseline, settings.delta, settings.window):
        if len(samples) < settings.window:
            return result(NoAction("not enough probes since the start"))
        if state.stage == "restarted_same":
            if state.restarted_at is not None and now - state.restarted_at < settings.cooldown_s:
                return result(NoAction("the restart restored throughput; watching it for the cool-down"))
            return result(NoAction("the restart restored throughput"), Remediation())
        if (state.stage == "settled" and profile != primary and state.settled_at is not None
                and now - state.settled_at >= settings.cooldown_s):
            return result(RetryPrimary(), Remediation("restarted_same", primary, None, None, now))
        return result(NoAction())

    if not confirmed:
        return result(Reprobe())

    explanations = explain(observations)
    if any(e.reason not in ACTED_ON for e in explanations):
        return result(Explained(explanations), state, explanations)
    if not settings.act:
        return result(NoAction("unexplained regression; acting on regressions is disabled"), state,
                      explanations)

    regressed = replace(state, regressed_profile=profile, regressed_tps=window_median, settled_at=None,
                        restarted_at=None)
    if state.stage in ("restarted_same", "trying_next") and state.regressed_profile == profile:
        # The restart did not help, helped only briefly, or the retried primary is still slow:
        # move down the ladder.
        return result(TryNextProfile(), replace(regressed, stage="trying_next"), explanations)
    return result(RestartSame(), replace(regressed, stage="restarted_same", restarted_at=now), explanations)
