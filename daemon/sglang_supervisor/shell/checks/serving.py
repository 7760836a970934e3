"""What runs while the engine serves: the probe that gates READY, health checks, the throughput
monitor (periodic probes, regression decisions). Results go to the lifecycle as `Input`s through
the `feed` it is given; what they mean (busy or wedged, retry or give up) is `core.liveness` and
`core.wedge`. It takes the served configuration (`Current`), the lifecycle it reads, and what it
asks of the other parts (`ServingHooks`), never the Supervisor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from sglang_supervisor.core.events import DecodeStats
from sglang_supervisor.core.inputs import (
    DecodeProgress,
    HealthFailed,
    HealthOk,
    Input,
    PassiveThroughput,
    ProbeFailed,
    ProbeOk,
    RegressionDecision,
)
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.liveness import (
    READY_PROBE_RETRY_S,
    ReadyStep,
    health_round,
    keep_scraping,
    ready_probe_next,
    ready_probe_wait_s,
    serving_probe_check,
)
from sglang_supervisor.core.phases import UP_PHASES, Phase
from sglang_supervisor.core.profiles import RenderedCommand
from sglang_supervisor.core.regression import Decision, KeepFaster, RestartSame, RetryPrimary, TryNextProfile
from sglang_supervisor.core.wedge import Check
from sglang_supervisor.engine.argv import decode_log_interval, tp_size
from sglang_supervisor.engine.sglang import health_path
from sglang_supervisor.shell.checks.enginehttp import EngineAnswerError
from sglang_supervisor.shell.checks.fidelitycheck import FidelityChecker
from sglang_supervisor.shell.checks.monitor import ThroughputMonitor
from sglang_supervisor.shell.checks.probe import (
    ProbeResult,
    check_health,
    decode_counters,
    read_engine_metrics,
)
from sglang_supervisor.shell.current import Current
from sglang_supervisor.shell.files import state
from sglang_supervisor.shell.links.grouplink import LeaderLink
from sglang_supervisor.shell.telemetry import gpu
from sglang_supervisor.shell.telemetry.metrics import SupervisorMetrics

log = structlog.get_logger("sglang_supervisor")

# Phases in which the READY gate's probe still means something.
GATE_PHASES = (Phase.WARMING_UP, Phase.CAPTURING_GRAPHS)


@dataclass(frozen=True)
class ServingHooks:
    """What the serving checks ask of the other parts, wired in supervisor.py."""

    feed: Callable[[Input], None]  # results, to the lifecycle
    spawn: Callable[[Callable[[], Any]], None]  # a task of ours (its errors to the TaskGuard)
    supervise: Callable[[asyncio.Future[Any]], object]  # a running task's errors to the TaskGuard
    render: Callable[[str], RenderedCommand]  # a profile's command (the runner's, derived too)
    engine_pid: Callable[[], int | None]  # the running engine's leader
    gpu_set: Callable[[], set[int] | None]  # the GPUs the engine is given (None: all)


class Serving:
    def __init__(self, current: Current, lifecycle: Lifecycle, metrics: SupervisorMetrics,
                 store: state.StateStore, *, fidelity: FidelityChecker, group: LeaderLink | None,
                 hooks: ServingHooks) -> None:
        self.current, self.lifecycle, self.metrics, self.store = current, lifecycle, metrics, store
        self.fidelity, self.group, self.hooks = fidelity, group, hooks
        self.feed = hooks.feed
        self.health_task: asyncio.Task[None] | None = None
        self.monitor: ThroughputMonitor | None = None
        self.ready_monitor: ThroughputMonitor | None = None  # the READY gate's, while it probes
        self.monitor_task: asyncio.Task[None] | None = None
        self.remediation: Any = None  # what the monitor learned, kept across monitors
        self.renew_monitor_at_ready = False  # probe settings changed while the engine started

    # -- the throughput monitor -------------------------------------------------------------------

    def new_monitor(self, profile: str) -> ThroughputMonitor:
        p = self.current.config.probe
        argv = self.hooks.render(profile).argv
        key = state.baseline_key(f"{self.current.fp}/{profile}", p.input_tokens, p.max_new_tokens)
        pid = self.hooks.engine_pid()
        attempt = self.lifecycle.attempt

        def on_probe(result: ProbeResult) -> None:
            if self.lifecycle.attempt != attempt:
                return  # a stopped engine's monitor finishing its last round
            check = serving_probe_check(ok=result.ok, timed_out=result.timed_out)
            if check is Check.PROBE_OK:
                self.feed(ProbeOk(result.decode_tps, result.ttft_s))
            elif check is Check.PROBE_HUNG:
                self.feed(ProbeFailed(result.error or "probe timed out", hung=True))

        def on_passive_tps(tok_s: float) -> None:
            if self.lifecycle.attempt == attempt:
                self.feed(PassiveThroughput(tok_s))

        return ThroughputMonitor(
            self.current.base_url, p, self.metrics, self.store, self.on_decision,
            baseline_key=key, profile=profile, primary=self.current.config.profile_names[0],
            remediation=self.remediation, api_key=self.current.prep.api_key,
            our_pids=lambda: gpu.descendant_pids(pid) if pid is not None else set(),
            gpu_indices=self.hooks.gpu_set(),
            gpus_per_engine=tp_size(argv), decode_log_interval=decode_log_interval(argv),
            on_probe=on_probe, on_passive_tps=on_passive_tps)

    def on_decision(self, decision: Decision, text: str) -> None:
        current = self.lifecycle.profile
        if isinstance(decision, RestartSame):
            self.feed(RegressionDecision("restart_same", text))
        elif isinstance(decision, TryNextProfile):
            self.feed(RegressionDecision("next_profile", text))
        elif isinstance(decision, KeepFaster) and decision.profile != current:
            self.feed(RegressionDecision("switch", text, decision.profile))
        elif isinstance(decision, RetryPrimary):
            self.feed(RegressionDecision("switch", text, self.current.config.profile_names[0]))
        else:
            self.feed(RegressionDecision("keep", text))

    def renew_monitor(self) -> None:
        """New probe settings while serving: replace the throughput monitor (its probe shape,
        interval and baseline key come from them), keeping what remediation learned."""
        old = self.monitor
        profile = self.lifecycle.profile
        if old is None or profile is None or self.lifecycle.phase not in UP_PHASES:
            return
        if self.monitor_task is not None:
            self.monitor_task.cancel()
            self.monitor_task = None
        self.remediation = old.remediation
        old.stop()
        self.hooks.spawn(old.aclose)
        self.monitor = self.new_monitor(profile)
        if self.current.config.probe.enabled:
            self.monitor_task = asyncio.ensure_future(self.monitor.run())
            self.hooks.supervise(self.monitor_task)

    def probe_settings_changed(self) -> None:
        """A reload changed `probe:` and kept the engine: a new monitor now, or at READY."""
        if self.monitor is not None:
            self.renew_monitor()
        elif self.ready_monitor is not None:
            self.renew_monitor_at_ready = True

    # -- the READY gate ---------------------------------------------------------------------------

    async def ready_probe(self, attempt: int) -> None:
        """The probe that gates READY, retried until `ready_probe_s` (the port may need a moment)."""
        profile = self.lifecycle.profile or ""
        if self.group is not None and not await self.group_members_ready(attempt):
            return
        monitor = self.ready_monitor = self.new_monitor(profile)
        try:
            await self._ready_probe_rounds(attempt, profile, monitor)
        finally:
            if self.ready_monitor is monitor:
                self.ready_monitor = None

    async def _ready_probe_rounds(self, attempt: int, profile: str, monitor: ThroughputMonitor) -> None:
        deadline = time.monotonic() + self.current.config.timeouts.ready_probe_s
        last_error, hung = "no probe ran", False
        while time.monotonic() < deadline:
            if self.lifecycle.attempt != attempt or self.lifecycle.phase not in GATE_PHASES:
                await monitor.aclose()
                return
            try:
                result: ProbeResult | None = await asyncio.wait_for(
                    monitor.first_probe(), ready_probe_wait_s(deadline=deadline, now=time.monotonic()))
            except asyncio.TimeoutError:
                result = None
            if result is not None and monitor.stopped:
                await monitor.aclose()  # the engine is being stopped: its answer means nothing
                return
            step = ready_probe_next(answered=result is not None, ok=bool(result and result.ok),
                                    error=result.error if result else None,
                                    timed_out=bool(result and result.timed_out),
                                    now=time.monotonic(), deadline=deadline)
            if step.step is ReadyStep.READY and result is not None and self.lifecycle.canary is not None:
                await self._canary_gate(attempt, profile, monitor, result)
                return
            if step.step is ReadyStep.READY and result is not None:
                # The outputs must agree with the model's reference before READY=1 (fidelity).
                verdict = await self.fidelity.check(profile, result.spec_accept_length, at_ready=True) \
                    if self.lifecycle.attempt == attempt else None
                if self.lifecycle.attempt == attempt and verdict is not None:
                    await monitor.aclose()
                    self.feed(verdict)
                elif self.lifecycle.attempt == attempt and not monitor.stopped:
                    self.monitor = monitor
                    self.feed(ProbeOk(result.decode_tps, result.ttft_s))
                else:
                    await monitor.aclose()
                return
            last_error, hung = step.reason, step.hung
            if step.step is ReadyStep.FAILED:
                break
            log.warning("probe.retry", profile=profile, error=last_error)
            await asyncio.sleep(READY_PROBE_RETRY_S)
        await monitor.aclose()
        if self.lifecycle.attempt == attempt:
            self.feed(ProbeFailed(last_error, hung=hung))

    async def _canary_gate(self, attempt: int, profile: str, monitor: ThroughputMonitor,
                           result: ProbeResult) -> None:
        """An upgrade candidate's ready gate: its fidelity against the model's reference goes
        with its numbers to the canary's verdict (core/canary.judge), which promotes it or rolls
        it back; a mismatch here rejects the candidate, never the profile."""
        word, detail = await self.fidelity.canary_check(profile, result.spec_accept_length)
        if self.lifecycle.attempt == attempt and not monitor.stopped:
            self.monitor = monitor
            self.feed(ProbeOk(result.decode_tps, result.ttft_s, word, detail))
        else:
            await monitor.aclose()

    async def group_members_ready(self, attempt: int) -> bool:
        """READY waits for every worker node's captures (the leader's own ended already)."""
        group = self.group
        assert group is not None
        ok = await group.wait_members(
            attempt, self.current.config.timeouts.ready_probe_s,
            lambda: self.lifecycle.attempt == attempt and self.lifecycle.phase in GATE_PHASES)
        if ok:
            log.info("group.members_ready", generation=attempt, nodes=group.book.nnodes)
        if not ok and self.lifecycle.attempt == attempt and group.book.failed is False:
            missing = ", ".join(map(str, group.book.missing()))
            self.feed(ProbeFailed(f"node(s) {missing} did not report their captures ended within "
                                 "timeouts.ready_probe_s", hung=True))
        return ok

    # -- serving ---------------------------------------------------------------------------------

    def start(self) -> None:
        """READY=1 was sent (also at the end of a reload that kept the engine: the loops may
        already be running)."""
        if self.renew_monitor_at_ready:
            self.renew_monitor_at_ready = False
            self.renew_monitor()
        self.fidelity.start_periodic(self.lifecycle.attempt, self.lifecycle.profile or "")
        if self.health_task is None or self.health_task.done():
            self.health_task = asyncio.ensure_future(self.health_loop(self.lifecycle.attempt))
            self.hooks.supervise(self.health_task)
        if self.monitor is not None and self.current.config.probe.enabled and (
                self.monitor_task is None or self.monitor_task.done()):
            self.monitor_task = asyncio.ensure_future(self.monitor.run())
            self.hooks.supervise(self.monitor_task)

    def stop_tasks(self) -> None:
        self.fidelity.stop()
        for task in (self.health_task, self.monitor_task):
            if task is not None:
                task.cancel()
        self.health_task = self.monitor_task = None
        if self.monitor is not None:
            self.remediation = self.monitor.remediation
            self.monitor.stop()
            self.hooks.spawn(self.monitor.aclose)
            self.monitor = None

    def decode_stats(self, ev: DecodeStats) -> None:
        """The engine's decode log line: the monitor's passive throughput while it serves."""
        if self.monitor is not None:
            self.monitor.feed(ev)

    def quiet_probes(self) -> None:
        """Our stop is about to break the engine's connections: probes and health checks still in
        flight must not report that as the engine failing (a probe.failed ReadError warning)."""
        if self.health_task is not None:
            self.health_task.cancel()  # its next result would be fed to a stopping lifecycle
            self.health_task = None
        for monitor in (self.monitor, self.ready_monitor):
            if monitor is not None:
                monitor.stop()  # its loop ends after the probe in flight, whose result it drops

    async def health_loop(self, attempt: int) -> None:
        """Health checks (bounded: `probe.check_health`), each followed by a look at the engine's
        /metrics decode counters: progress since the last check means busy, not wedged."""
        url = self.current.base_url + health_path(self.current.prep.version)
        client = self.current.client
        assert client is not None
        counters: tuple[float | None, ...] | None = None
        scrape = True  # until the engine shows it has no /metrics (no --enable-metrics)
        while self.lifecycle.attempt == attempt and self.lifecycle.phase in UP_PHASES:
            t = self.current.config.timeouts  # every round: a reload applies new timeouts at once
            await asyncio.sleep(t.health_interval_s)
            result = await check_health(client, url, t.health_timeout_s)
            progressed = False
            if scrape:
                try:
                    m = await read_engine_metrics(client, self.current.base_url, self.current.prep.api_key,
                                                  min(t.health_timeout_s, 5.0))
                except EngineAnswerError as exc:
                    m, scrape = None, keep_scraping(exc.status)
                evidence = health_round(counters, decode_counters(m))
                progressed, counters = evidence.progressed, evidence.counters
            if self.lifecycle.attempt != attempt:
                return
            if progressed:
                self.feed(DecodeProgress())
            self.feed(HealthOk() if result.ok else HealthFailed(result.why))
