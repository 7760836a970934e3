"""Throughput monitor: the loop that runs after READY.

It probes only when the engine is idle (busy is not slow), reads passive throughput otherwise,
keeps the per-fingerprint baseline through the state store, asks `regression.evaluate` what to
do and hands acting decisions to the supervisor through `on_decision`. The supervisor acts
(restarts, switches profiles) and keeps `monitor.remediation` across engine restarts.

Long because: ThroughputMonitor is one loop with one state (probe schedule, idle detection, passive
rates, stuck detection, baselines, the remediation carried across restarts), read and written by
every step of the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx
import structlog

from sglang_supervisor.core.events import DecodeStats, EngineEvent
from sglang_supervisor.core.regression import (
    Decision,
    Evaluation,
    Explained,
    KeepFaster,
    NoAction,
    Observations,
    PolicySettings,
    Remediation,
    Reprobe,
    RestartSame,
    RetryPrimary,
    TryNextProfile,
    decision_name,
    evaluate,
    updated_baseline,
)
from sglang_supervisor.engine.api import EngineMetrics
from sglang_supervisor.engine.argv import DEFAULT_DECODE_LOG_INTERVAL
from sglang_supervisor.shell.checks.enginehttp import engine_client
from sglang_supervisor.shell.checks.probe import (
    ProbeResult,
    ProbeShape,
    engine_metrics,
    make_shape,
    probe_once,
    read_get_load,
)
from sglang_supervisor.shell.telemetry import gpu
from sglang_supervisor.shell.telemetry.metrics import SupervisorMetrics

log = structlog.get_logger(__name__)


class ProbeSettingsLike(Protocol):
    """The `probe:` section of the configuration (config.ProbeSettings satisfies it)."""

    enabled: bool
    interval_s: float
    input_tokens: int
    max_new_tokens: int
    timeout_s: float
    baseline_runs: int
    regression_delta: float
    regression_window: int
    cooldown_s: float
    act_on_regression: bool


class _HasValue(Protocol):
    @property
    def value(self) -> float: ...


class BaselineStore(Protocol):
    """What the monitor needs from the supervisor's state file (state.StateStore satisfies it)."""

    def baseline(self, key: str) -> _HasValue | None: ...

    def set_baseline(self, key: str, value: float, now: float) -> object: ...


OnDecision = Callable[[Decision, str], Awaitable[None] | None]

# Decisions after which this engine run is over (the supervisor restarts or switches).
_TERMINAL = (RestartSame, TryNextProfile, RetryPrimary)
# Decisions that act on a confirmed regression: before one, the decode mode must be known.
_ACTING = (RestartSame, TryNextProfile)

# Without the engine's /metrics (no --enable-metrics) the `Decode batch` lines, one every
# `--decode-log-interval` steps (engine/argv.DEFAULT_DECODE_LOG_INTERVAL), are the only sign of
# eager decode, and short probes may run for many probes without one.
# How long to wait after the evidence probe for its Decode line to reach us through the log pump.
DECODE_EVIDENCE_WAIT_S = 2.0


def describe(decision: Decision) -> str:
    if isinstance(decision, Explained):
        return "; ".join(e.detail for e in decision.reasons)
    if isinstance(decision, KeepFaster):
        return f"keep profile {decision.profile}: it probed faster"
    if isinstance(decision, NoAction):
        return decision.why
    return {
        RestartSame: "unexplained throughput regression: restarting the same profile once",
        TryNextProfile: "throughput still regressed after a restart: trying the next profile",
        RetryPrimary: "cool-down over: trying the primary profile again",
        Reprobe: "possible regression: probing again to confirm",
    }[type(decision)]


class ThroughputMonitor:
    def __init__(
        self,
        base_url: str,
        settings: ProbeSettingsLike,
        metrics: SupervisorMetrics | None,
        store: BaselineStore,
        on_decision: OnDecision,
        *,
        baseline_key: str,
        profile: str,
        primary: str,
        remediation: Remediation | None = None,
        api_key: str | None = None,
        our_pids: Callable[[], set[int]] | None = None,
        gpu_indices: set[int] | None = None,
        gpus_per_engine: int = 1,
        nvml: gpu.Nvml | None = None,
        clock: Callable[[], float] = time.time,
        client: httpx.AsyncClient | None = None,
        on_probe: Callable[[ProbeResult], None] | None = None,
        on_passive_tps: Callable[[float], None] | None = None,
        decode_log_interval: int = DEFAULT_DECODE_LOG_INTERVAL,
    ):
        """Long because: its signature alone is twenty collaborators and settings, one a line, and
        the body declares every field of the loop's state (baseline, samples, idle and stuck
        detection, passive rates, STATUS= hooks) in one place; there is no step to name.
        """
        self.base_url = base_url.rstrip("/")
        self.settings = settings
        self.metrics = metrics
        self.store = store
        self.on_decision = on_decision
        self.baseline_key = baseline_key
        self.profile = profile
        self.primary = primary
        self.remediation = remediation or Remediation()
        self.shape: ProbeShape = make_shape(settings.input_tokens, settings.max_new_tokens)
        self._api_key = api_key
        self._our_pids = our_pids
        self._gpu_indices = gpu_indices
        self._gpus_per_engine = max(1, gpus_per_engine)
        self._nvml = nvml or gpu.default()
        self._clock = clock
        self._client = client
        self._own_client = client is None
        # Every periodic probe's result and every passive rate, for the supervisor's STATUS= line.
        self._on_probe = on_probe
        self._on_passive_tps = on_passive_tps
        stored = store.baseline(baseline_key)
        self.baseline: float | None = stored.value if stored is not None else None
        # This start's speculative accept length at its baseline probes (same weights, same probe):
        # what a collapse is measured against (regression.Reason.ACCEPT_COLLAPSE).
        self.accept_samples: list[float] = []
        self.baseline_accept: float | None = None
        self.samples: list[float] = []
        self.last_probe: ProbeResult | None = None
        self.last_evaluation: Evaluation | None = None
        self.consecutive_failures = 0
        self.probes_skipped_busy = 0
        self.decode_cuda_graph: bool | None = None
        self._decode_seen_at: float | None = None  # monotonic time of the last line with the flag
        self._decode_log_interval = max(1, decode_log_interval)
        self._eager_passes: float | None = None
        self._gen_tokens: tuple[float, float] | None = None  # (monotonic t, generation_tokens_total)
        # generation_tokens_total at the previous tick that found the engine busy: busy twice in a
        # row without a token in between is not busy but stuck (requests that never finish).
        self._busy_tokens: float | None = None
        self._last_explained: tuple[str, ...] = ()
        self._stopped = asyncio.Event()
        if metrics is not None:
            metrics.set_baseline(self.baseline)

    # --- inputs ---------------------------------------------------------------------------------

    def feed(self, event: EngineEvent) -> None:
        """Engine log events: `Decode batch` lines give passive tok/s and the CUDA-graph flag."""
        if not isinstance(event, DecodeStats):
            return
        if event.cuda_graph is not None:
            self.decode_cuda_graph = event.cuda_graph
            self._decode_seen_at = time.monotonic()
        # The supervisor's lifecycle reads these lines itself; only the gauge is ours to set.
        if event.gen_throughput is not None and (event.running_req or 0) > 0 and self.metrics is not None:
            self.metrics.set_passive_tps(event.gen_throughput)

    def stop(self) -> None:
        self._stopped.set()

    def status(self) -> dict[str, Any]:
        ev = self.last_evaluation
        return {
            "profile": self.profile,
            "shape": self.shape.name,
            "baseline_tps": self.baseline,
            "samples": len(self.samples),
            "median_tps": ev.median_tps if ev else None,
            "ratio": ev.ratio if ev else None,
            "last_probe": self.last_probe.to_dict() if self.last_probe else None,
            "remediation": self.remediation.stage,
            "probes_skipped_busy": self.probes_skipped_busy,
            "spec_accept_length": self.last_probe.spec_accept_length if self.last_probe else None,
            "baseline_spec_accept_length": self.baseline_accept,
            "explained_by": [e.detail for e in ev.explanations] if ev else [],
        }

    # --- probing --------------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            t = self.settings.timeout_s
            self._client = engine_client(httpx.Timeout(t, connect=min(t, 10.0)))
        return self._client

    async def aclose(self) -> None:
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _scrape(self) -> EngineMetrics | None:
        return await engine_metrics(self._http(), self.base_url, self._api_key)

    async def _load(self) -> tuple[int, int] | None:
        m = await self._scrape()
        if m is not None:
            self._note_counters(m)
            if m.running is not None and m.queued is not None:
                return m.running, m.queued
        load = await read_get_load(self._http(), self.base_url, self._api_key)
        return (load.running, load.queued) if load is not None else None

    def _note_counters(self, m: EngineMetrics) -> None:
        now = time.monotonic()
        if m.generation_tokens_total is not None:
            prev = self._gen_tokens
            self._gen_tokens = (now, m.generation_tokens_total)
            if prev is not None and now > prev[0] and (m.running or 0) > 0 and self.metrics is not None:
                rate = max(0.0, (m.generation_tokens_total - prev[1]) / (now - prev[0]))
                self.metrics.set_passive_tps(rate)
                if self._on_passive_tps is not None:
                    self._on_passive_tps(rate)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    async def _probe(self, sample: bool = True) -> ProbeResult:
        result = await probe_once(self._http(), self.base_url, self.shape, self._api_key,
                                  self.settings.timeout_s)
        if self.stopped:
            # Stopped while the probe ran: the supervisor is stopping the engine on purpose, so a
            # broken connection is our doing, not a failure (nor a sample, nor a metric).
            log.debug("probe.after_stop", ok=result.ok, error=result.error)
            return result
        self.last_probe = result
        if self.metrics is not None:
            self.metrics.observe_probe(result)
            spent = result.completion_tokens + (result.prompt_tokens or 0)
            self.metrics.probe_cost(spent, (result.e2e_s or 0.0) * self._gpus_per_engine)
        if result.ok and result.decode_tps is not None:
            self.consecutive_failures = 0
            if sample:
                self.samples.append(result.decode_tps)
                self._update_baseline()
                if result.spec_accept_length is not None and len(self.samples) <= self.settings.baseline_runs:
                    self.accept_samples.append(result.spec_accept_length)
                    self.baseline_accept = statistics.median(self.accept_samples)
                    if self.metrics is not None:
                        self.metrics.set_baseline_accept(self.baseline_accept)
        else:
            self.consecutive_failures += 1
            log.warning("probe.failed", error=result.error, timed_out=result.timed_out,
                        problem=result.problem, consecutive=self.consecutive_failures)
        return result

    async def _periodic_probe(self, sample: bool = True) -> ProbeResult:
        result = await self._probe(sample)
        if self._on_probe is not None and not self.stopped:
            self._on_probe(result)
        return result

    def _update_baseline(self) -> None:
        new = updated_baseline(self.baseline, self.samples, self.settings.baseline_runs)
        if new != self.baseline and new is not None and len(self.samples) == self.settings.baseline_runs:
            self.baseline = new
            self.store.set_baseline(self.baseline_key, new, self._clock())
            log.info("probe.baseline", tps=round(new, 2), key=self.baseline_key)
            if self.metrics is not None:
                self.metrics.set_baseline(new)

    async def first_probe(self) -> ProbeResult:
        """The probe that gates READY, counted as the first sample. No warm-up request of our own:
        SGLang runs its warmup generation before it prints its ready line."""
        return await self._probe()

    async def _observe_during(self, probe: Awaitable[ProbeResult]) -> tuple[ProbeResult, Observations]:
        """Re-probe while sampling load and GPU state midway: throttling shows while the GPU works."""
        delay = (self.last_probe.e2e_s or 0.1) / 2 if self.last_probe else 0.05
        task = asyncio.ensure_future(probe)
        await asyncio.sleep(delay)
        load = await self._load()
        probe_in_flight = not task.done()  # then the engine counts the probe itself as running
        gpus = self._nvml.snapshot()
        result = await task
        foreign: list[gpu.ForeignProcess] = []
        if gpus is not None and self._our_pids is not None:
            foreign = gpu.find_foreign(gpus, self._our_pids(), self._gpu_indices)
        m = await self._scrape()
        growth = None
        if m is not None and m.decode_eager_passes is not None:
            growth = m.decode_eager_passes - (self._eager_passes or 0.0)
            self._eager_passes = m.decode_eager_passes
        running = queued = None
        if load is not None:
            running, queued = max(0, load[0] - (1 if probe_in_flight else 0)), load[1]
        obs = Observations(
            gpus=gpus,
            our_gpu_indices=frozenset(self._gpu_indices) if self._gpu_indices is not None else None,
            foreign=foreign,
            decode_cuda_graph=self.decode_cuda_graph,
            eager_passes_growth=growth,
            running=running,
            queued=queued,
            accept_length=result.spec_accept_length,
            baseline_accept=self.baseline_accept,
        )
        return result, obs

    def _decode_mode_unknown(self, obs: Observations, since: float) -> bool:
        """Neither the engine's decode_none counter nor a `Decode batch` line since `since` says
        whether decode still runs CUDA graphs."""
        seen = self._decode_seen_at
        return obs.eager_passes_growth is None and (seen is None or seen < since)

    async def _decode_evidence(self, obs: Observations, since: float) -> Observations:
        """Before restarting an engine (minutes) spend one longer probe (seconds) so that at least
        one `Decode batch` line is logged: eager decode must be explained, not restarted blindly.
        The probe is not a throughput sample (another shape); its cost is accounted."""
        # Twice the tokens the interval needs at the measured accept length: a short probe
        # under-measures it (its last verify step is cut short), and too few steps log nothing.
        accept = (self.last_probe.spec_accept_length if self.last_probe else None) or 1.0
        tokens = math.ceil(self._decode_log_interval * max(accept, 1.0) * 2) + 2
        shape = make_shape(self.shape.input_tokens, max(self.shape.max_new_tokens, tokens))
        log.info("probe.decode_evidence", max_new_tokens=shape.max_new_tokens,
                 why="no decode-mode evidence since the regression was suspected")
        result = await probe_once(self._http(), self.base_url, shape, self._api_key, self.settings.timeout_s)
        if self.metrics is not None:
            spent = result.completion_tokens + (result.prompt_tokens or 0)
            self.metrics.probe_cost(spent, (result.e2e_s or 0.0) * self._gpus_per_engine)
        deadline = time.monotonic() + DECODE_EVIDENCE_WAIT_S
        while self._decode_mode_unknown(obs, since) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return dataclasses.replace(obs, decode_cuda_graph=self.decode_cuda_graph)

    def _evaluate(self, confirmed: bool, obs: Observations) -> Evaluation:
        s = self.settings
        return evaluate(
            profile=self.profile, primary=self.primary, samples=self.samples, baseline=self.baseline,
            confirmed=confirmed, observations=obs, state=self.remediation,
            settings=PolicySettings(s.regression_delta, s.regression_window, s.baseline_runs, s.cooldown_s,
                                    s.act_on_regression),
            now=self._clock(),
        )

    async def tick(self) -> Decision | None:
        """One round: skip when busy, else probe, confirm, explain, decide. Returns the decision
        (None when no probe ran or it failed)."""
        load = await self._load()
        if load is not None and (load[0] > 0 or load[1] > 0):
            tokens = self._gen_tokens[1] if self._gen_tokens is not None else None
            stuck = tokens is not None and tokens == self._busy_tokens
            self._busy_tokens = tokens
            if not stuck:
                self.probes_skipped_busy += 1
                log.debug("probe.skipped_busy", running=load[0], queued=load[1])
                return None
            # Requests "running" for a whole interval without one token generated: the engine is
            # not busy but stuck. Probe anyway (a hung probe feeds the wedge verdict); its rate is
            # no sample, the engine may still be loaded.
            log.warning("probe.busy_without_progress", running=load[0], queued=load[1])
            await self._periodic_probe(sample=False)
            return None
        self._busy_tokens = None
        if self._eager_passes is None:
            m = await self._scrape()
            self._eager_passes = m.decode_eager_passes if m is not None else None
        result = await self._periodic_probe()
        if not result.ok or self.stopped:
            return None
        ev = self._evaluate(False, Observations())
        if isinstance(ev.decision, Reprobe):
            # Once a slowdown is explained and reported, every window re-suspects it until it ends
            # (a minute of a foreign job is a dozen windows): say it at info level only once.
            (log.debug if self._last_explained else log.info)(
                "probe.regression_suspected", median_tps=ev.median_tps, baseline_tps=self.baseline)
            confirm_started = time.monotonic()
            result, obs = await self._observe_during(self._periodic_probe())
            if not result.ok or self.stopped:
                return None
            ev = self._evaluate(True, obs)
            if isinstance(ev.decision, _ACTING) and self._decode_mode_unknown(obs, confirm_started):
                obs = await self._decode_evidence(obs, confirm_started)
                if self.stopped:
                    return None
                ev = self._evaluate(True, obs)
        self.last_evaluation = ev
        if self.metrics is not None:
            self.metrics.set_ratio(ev.ratio)  # one number for /metrics and /status
        self.remediation = ev.state
        await self._deliver(ev)
        return ev.decision

    async def _deliver(self, ev: Evaluation) -> None:
        d = ev.decision
        reasons = tuple(e.reason.value for e in ev.explanations)
        if self.metrics is not None and not isinstance(d, NoAction):
            self.metrics.decision(decision_name(d), reasons)
        elif self.metrics is not None:
            self.metrics.set_explanations(())
        if isinstance(d, NoAction):
            if self._last_explained:
                # The end of an explained slowdown, reported once as its start was.
                log.info("throughput.recovered", median_tps=ev.median_tps, baseline_tps=self.baseline,
                         ratio=ev.ratio, explained_by=list(self._last_explained))
            self._last_explained = ()
            return
        if isinstance(d, Explained) and reasons == self._last_explained:
            return  # the same explanation again: already reported
        self._last_explained = reasons
        text = describe(d)
        log.warning("throughput.decision", decision=decision_name(d), detail=text, median_tps=ev.median_tps,
                    baseline_tps=self.baseline, ratio=ev.ratio, named=[e.detail for e in ev.explanations],
                    spec_accept_length=self.last_probe.spec_accept_length if self.last_probe else None,
                    baseline_spec_accept_length=self.baseline_accept)
        outcome = self.on_decision(d, text)
        if inspect.isawaitable(outcome):
            await outcome
        if isinstance(d, _TERMINAL) or (isinstance(d, KeepFaster) and d.profile != self.profile):
            self._stopped.set()

    def _evaluate_readys_probe(self) -> None:
        """The ratio of READY's own probe for /status and /metrics, without a request of ours.
        Only a quiet verdict is kept: a suspicion needs probes of its own, an interval on."""
        if not self.samples:
            return
        ev = self._evaluate(False, Observations())
        if isinstance(ev.decision, NoAction):
            self.last_evaluation = ev
            if self.metrics is not None:
                self.metrics.set_ratio(ev.ratio)

    async def run(self) -> None:
        """Probe every `interval_s` (every second until the baseline has its probes), the first
        one interval after READY's own probe, until stopped or
        until a decision ends this engine run. Never raises for engine trouble."""
        if not self.settings.enabled:
            return
        try:
            self._evaluate_readys_probe()
            while not self._stopped.is_set():
                # Wait first: run() starts at READY, right after the probe that gated it, when
                # the first user requests arrive; a probe at once would measure (and slow) them.
                collecting = len(self.samples) < self.settings.baseline_runs
                wait = min(self.settings.interval_s, 1.0) if collecting else self.settings.interval_s
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), wait)
                if self._stopped.is_set():
                    break
                await self.tick()
        finally:
            await self.aclose()
