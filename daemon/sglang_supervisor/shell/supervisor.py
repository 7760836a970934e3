"""The asyncio supervisor: wires the pure lifecycle (`core.lifecycle.Lifecycle`) to its shell
parts and carries out the actions the lifecycle returns, in order.

Parts, one job each: `inbox` (signals, reload requests and timer events, handled one at a time by
the lifecycle loop, `_handle`), `timers`, `runner` (the engine: launch, log pump, exit, stop),
`serving` (READY gate probe, health checks, throughput monitor), `reloader` (SIGHUP), `presence`
(gateway, drain, /readyz, /livez, reaping), `leader` (a multi-node group's node 0), `guard` (our
own tasks' errors), `preflight` (a configuration rendered for one engine version). This module
keeps what joins them: the action executor (`_apply`), /status, start-up and shutdown, and what
an internal error does.

Facts arrive by two paths. Engine output, exits, probe and health results are fed synchronously
on the loop's thread (`feed`: no await inside, so one input is handled whole before the next).
What comes from outside (signals, SIGHUP, timers) goes through the inbox, so that a reload, which
awaits the file and the engine's version, finishes before the next of those is looked at.

Long because: the action executor (one branch per action) and the start-up and shutdown order
stay together, so the order of effects reads in one place; every job of its own is a part.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog
from typing_extensions import assert_never

from sglang_supervisor import __version__
from sglang_supervisor.core import gpufacts, wayback
from sglang_supervisor.core.actions import (
    Action,
    CanaryJudged,
    CancelTimer,
    Exit,
    Launch,
    Log,
    MarkBad,
    MarkGood,
    NotifyReady,
    NotifyReloading,
    NotifyStatus,
    NotifyStopping,
    RollBack,
    RunReadyProbe,
    SetTimer,
    StopEngine,
    WaitTemporary,
)
from sglang_supervisor.core.config import Config
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.exposure import redact_status, status_redacted
from sglang_supervisor.core.group import MemberFailed
from sglang_supervisor.core.inputs import GpuBusy, Input, PortBusy, Settings, Start, StopRequested, TimerFired
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.phases import UP_PHASES, Phase
from sglang_supervisor.core.profiles import RenderedCommand, default_secret_config_path

# The preflight's names are the supervisor's public API (commands/, tests/, bench/ import them here).
from sglang_supervisor.engine.argv import decode_log_interval, tp_size
from sglang_supervisor.shell.checks.enginehttp import engine_client
from sglang_supervisor.shell.checks.fidelitycheck import FidelityChecker
from sglang_supervisor.shell.checks.serving import Serving, ServingHooks
from sglang_supervisor.shell.current import Current
from sglang_supervisor.shell.engineproc.apikey import remove_secret_config
from sglang_supervisor.shell.engineproc.preflight import (
    Prepared,
    capture_keys,
    gateway_key,
    ladder_hash,
    policy_settings,
    port_taken,
    prepare,
    with_remembered,
)
from sglang_supervisor.shell.engineproc.runner import EngineRunner, RunnerParts
from sglang_supervisor.shell.files import state
from sglang_supervisor.shell.files.codestamp import code_stamp
from sglang_supervisor.shell.guard import TaskGuard
from sglang_supervisor.shell.inbox import Inbox, Item, ReloadRequest, TimerDue
from sglang_supervisor.shell.links.grouplink import LeaderLink
from sglang_supervisor.shell.links.leader import LeaderParts, leader_link
from sglang_supervisor.shell.links.presence import Presence
from sglang_supervisor.shell.reloader import Reloader, ReloadHooks
from sglang_supervisor.shell.telemetry import gpu
from sglang_supervisor.shell.telemetry.logsetup import set_redactions
from sglang_supervisor.shell.telemetry.metrics import MetricsServer, MetricsServerError, SupervisorMetrics
from sglang_supervisor.shell.telemetry.notify import Notifier
from sglang_supervisor.shell.timers import Timers
from sglang_supervisor.shell.upgrades import Upgrades

__all__ = ["Options", "Prepared", "Supervisor", "capture_keys", "decode_log_interval",
           "gateway_key", "ladder_hash", "policy_settings", "port_taken", "prepare",
           "run_supervisor", "tp_size"]

log = structlog.get_logger("sglang_supervisor")

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

PHASE_TO_METRIC = {
    Phase.PREFLIGHT: "starting", Phase.LAUNCHING: "starting", Phase.LOADING_WEIGHTS: "loading",
    Phase.CAPTURING_GRAPHS: "capturing", Phase.WARMING_UP: "warming", Phase.READY: "ready",
    Phase.SERVING: "ready", Phase.DEGRADED: "degraded", Phase.RESTARTING: "restarting",
    Phase.WAITING: "backoff",
    Phase.STOPPING: "stopping", Phase.STOPPED: "stopped", Phase.FAILED: "failed",
}


@dataclass
class Options:
    config_path: str | None = None
    retry_known_bad: bool = False
    exit_after_ready: bool = False
    # Engine lines at this syslog priority or more urgent are forwarded (6 = everything).
    forward_max_priority: int = 6
    metrics_address: str | None = None  # overrides config.metrics.address
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    on_metrics_url: Callable[[str], None] | None = None


class Supervisor:
    def __init__(self, prepared: Prepared, options: Options, notifier: Notifier | None = None) -> None:
        # The served configuration, its fingerprint, the client and loop: shared with the parts.
        self.current = Current(prepared, "")
        self.opts = options
        self.notifier = notifier or Notifier(options.environ)
        self.metrics = SupervisorMetrics()
        self.store = state.StateStore(self.config.state_dir, self.config.name)
        # Set by the first exception inside the supervisor: from then on the lifecycle is not fed
        # (the engine's exit that our own stop causes must not be blamed on its profile).
        self._internal_failure = False
        self.metrics.internal_errors.inc(self.store.snapshot().internal_errors)
        self.below_best_since: float | None = None  # wall clock; persisted per fingerprint
        self.plan: wayback.Plan | None = None  # this start's way back, for /status
        self.code_at_start = code_stamp()  # /status's code_stale: an upgrade replaced our files
        self.metrics.code_stale.set_function(lambda: 0.0 if code_stamp() == self.code_at_start else 1.0)
        self.metrics.below_best.set_function(self._below_best_seconds)
        self.current.fp = self.fingerprint()
        self.lifecycle = Lifecycle(self.settings(first_run=True))
        self._done: asyncio.Future[Exit] | None = None
        self._guard = TaskGuard(self._internal_error)  # our own tasks' errors
        self.inbox = Inbox()
        self.timers = Timers(self.inbox.put)
        self.fidelity = FidelityChecker(self.current, self.lifecycle, self.metrics,
                                        render=self._render,
                                        feed=self._feed_late, supervise=self._guard.supervise)
        # release memory, the upgrade canary, in-place upgrades
        self.upgrades = Upgrades(self.current, self.lifecycle, self.metrics)
        self._metrics_server: MetricsServer | None = None
        # Multi-node leader (node 0 of a group): the link its worker nodes call (grouplink.py).
        self.group: LeaderLink | None = leader_link(self.current, self.metrics.registry, LeaderParts(
            self.lifecycle, self.timers, engine=lambda: self.runner.engine, feed=self._feed_late,
            exit=self.exit, stop_for_member=self._stop_for_member))
        # gateway, drain, /readyz, /livez, reaping
        self.presence = Presence(self.current, self.lifecycle, self.metrics.registry, self.notifier,
                                 engine_pid=self._engine_pid)
        # READY gate, health checks, the throughput monitor
        self.serving = Serving(self.current, self.lifecycle, self.metrics, self.store,
                               fidelity=self.fidelity, group=self.group, hooks=ServingHooks(
                                   feed=self._feed_late, spawn=self.spawn_task,
                                   supervise=self._guard.supervise,
                                   render=self._render,
                                   engine_pid=self._engine_pid, gpu_set=self._gpu_set))
        # the engine: launch, log, exit, stop
        self.runner = EngineRunner(self.current, RunnerParts(
            self.lifecycle, self.notifier, self.metrics, probes=self.serving, gateway=self.presence,
            group=self.group, note_output=self.timers.note_output, feed=self._feed_late,
            spawn=self.spawn_task, supervise=self._guard.supervise),
            environ=options.environ, forward_max_priority=options.forward_max_priority)
        self.reloader = Reloader(self.current, self.lifecycle, self.upgrades, self.notifier, self.metrics,
                                 config_path=options.config_path, hooks=ReloadHooks(
                                     feed=self._feed_late, settings=lambda: self.settings(first_run=False),
                                     fingerprint=self.fingerprint, still_serving=self._still_serving,
                                     probe_settings_changed=self.serving.probe_settings_changed))

    # -- setup ----------------------------------------------------------------------------

    def fingerprint(self, prep: Prepared | None = None) -> str:
        """The deployment's fingerprint (model, engine version, GPUs, driver, commands) for the
        running configuration, or for `prep` (a reload's, before it is applied). Reads NVML."""
        prep = prep or self.prep
        gpus = gpu.snapshot() or []
        return state.fingerprint(
            prep.config.engine.model_path, prep.version, [g.name for g in gpus],
            next((g.driver for g in gpus if g.driver), "") or "", ladder_hash(prep.renders))

    def settings(self, first_run: bool) -> Settings:
        now = time.time()
        fs = self.store.fingerprint_state(self.fp)
        last_good = fs.last_good.profile if fs.last_good is not None else None
        r = self.config.restart
        # Falls back to `tune`'s winner; no probation for what tune measured serving slower.
        derived = {n: d for n, d in fs.derived.items() if d.base in self.config.profile_names}
        plan = wayback.start_plan(with_remembered(self.config.profile_names, derived), last_good,
                                  ranking=fs.ranking.profiles if fs.ranking is not None else None,
                                  bad=fs.bad, now=now,
                                  policy=wayback.Policy(r.known_bad_ttl_s, r.transient_retry_s))
        self.below_best_since = fs.below_best_since
        self.plan = plan
        return policy_settings(
            self.config, last_good=plan.last_good, known_bad=plan.backoff,
            probation=plan.probation if first_run else None,
            retry_known_bad=self.opts.retry_known_bad and first_run, renders=self.prep.renders,
            derived=derived)

    def _below_best_seconds(self) -> float:
        """For the metric: how long this deployment has served below the ladder's best profile
        (across restarts: the start of the spell is in the state file)."""
        since = self.below_best_since
        return 0.0 if since is None else max(0.0, time.time() - since)

    @property
    def prep(self) -> Prepared:
        return self.current.prep

    @property
    def config(self) -> Config:
        return self.current.config

    @property
    def fp(self) -> str:
        return self.current.fp

    @property
    def client(self) -> httpx.AsyncClient | None:
        return self.current.client

    @property
    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return self.current.loop

    @_loop.setter
    def _loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.current.loop = loop  # run() sets it; so do tests that drive parts without run()

    @property
    def base_url(self) -> str:
        return self.current.base_url

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.current.running_loop()

    @property
    def loop_or_none(self) -> asyncio.AbstractEventLoop | None:
        return self.current.loop

    # Looked up at each call: the runner is built after the parts that ask it.
    def _render(self, profile: str) -> RenderedCommand:
        return self.runner.render(profile)

    def _gpu_set(self) -> set[int] | None:
        return self.runner.gpu_set()

    def _engine_pid(self) -> int | None:
        eng = self.runner.engine
        return eng.proc.pid if eng is not None else None

    def _way_back(self) -> dict[str, Any] | None:
        """This start's plan back to the best profile: the last good one, the profile on
        probation, and when each profile in back-off may be tried again (wall clock)."""
        plan = self.plan
        if plan is None:
            return None
        return {"last_good": plan.last_good, "probation": plan.probation,
                "backoff": dict(plan.backoff), "retry_at": {k: round(v, 1) for k, v in plan.retry_at.items()}}

    def status(self) -> dict[str, Any]:
        """The `/status` document: names and numbers only, never the API key or argv."""
        snap = self.lifecycle.snapshot(time.monotonic())
        eng = self.runner.engine
        monitor = self.serving.monitor
        snap.update({
            "name": self.config.name,
            "engine_version": self.prep.version,
            "fingerprint": self.fp,
            "engine_pid": eng.proc.pid if eng else None,
            "engine_log": self.config.engine.log_file,
            "engine_log_errors": eng.pump.log_errors if eng else 0,
            "engine_log_writable": self.runner.log_spell is None,
            "forward_dropped": eng.pump.stats.forward_dropped if eng else 0,
            "throughput": monitor.status() if monitor else None,
            "fidelity": self.fidelity.status(),
            "last_reload": self.reloader.last,
            "upgrade": self.upgrades.status(),
            "below_best_profile_seconds": round(self._below_best_seconds(), 1),
            "readyz": self.presence.readiness().reason,
            "gateway": self.presence.status(),
            "supervisor_version": __version__,
            "code_stale": code_stamp() != self.code_at_start,
            "way_back": self._way_back(),
            "gpus": gpufacts.engine_gpus(gpu.snapshot(), gpu.descendant_pids(eng.proc.pid))
            if eng else [],
        })
        if self.group is not None:
            book = self.group.book
            snap["group"] = {"generation": book.generation, "nnodes": book.nnodes,
                             "serving_nodes": sorted(book.serving), "missing_nodes": book.missing(),
                             "failed": book.failed, "rejected_reports": self.group.rejected}
        return snap

    # -- main -----------------------------------------------------------------------------

    def _stop_signal(self, name: str) -> None:
        self.inbox.put(StopRequested(name))
        # A reload still reading its file holds the inbox; nothing of it is applied yet, so the
        # stop need not wait up to READ_TIMEOUT_S for a file on a hung mount.
        self.reloader.abandon_read(f"{name} arrived while the file was being read")

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.current.loop = loop
        self._done = loop.create_future()
        loop.set_exception_handler(self._guard.loop_exception)
        # The gateway's key too: a gateway (or a proxy before it) may quote it in an error page;
        # and the group link's secret, should anything ever echo it.
        group_secret = self.prep.group_secret.decode("ascii") if self.prep.group_secret else None
        if keys := [k for k in (self.prep.api_key, self.prep.gateway_key, group_secret) if k]:
            set_redactions(keys)
        for sig, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
            loop.add_signal_handler(sig, self._stop_signal, name)
        loop.add_signal_handler(signal.SIGHUP, self.inbox.put, ReloadRequest())
        self.current.client = engine_client()  # the engine's port: plain HTTP
        self.presence.start()
        await self._start_metrics()
        if self.group is not None:
            try:
                await self.group.start()
            except OSError as exc:
                log.error("group.link_unavailable", error=str(exc))
                await self._shutdown()
                for sig in HANDLED_SIGNALS:
                    loop.remove_signal_handler(sig)
                return int(ExitCode.TEMPORARY)
        self.spawn_task(lambda: self.inbox.serve(self._handle))
        watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
        heartbeat = asyncio.create_task(self.presence.beat(), name="heartbeat")
        log.info("supervisor.start", name=self.config.name, engine_version=self.prep.version,
                 profiles=",".join(self.config.profile_names), fingerprint=self.fp,
                 state_dir=self.config.state_dir, engine_log=self.config.engine.log_file)
        foreign = self.runner.foreign()
        busy_port = port_taken(self.config.engine.host, self.config.engine.port)
        if foreign:
            self.feed(GpuBusy(foreign))
        elif busy_port:
            self.feed(PortBusy(busy_port))
        else:
            self.feed(Start())
        try:
            result = await self._done
        finally:
            watchdog.cancel()
            heartbeat.cancel()
            # The handlers stay until the engine is gone: a second SIGTERM (Ctrl-C twice) during
            # the shutdown must not kill us with the default action and leave the engine behind.
            try:
                await self._shutdown()
            finally:
                for sig in HANDLED_SIGNALS:
                    loop.remove_signal_handler(sig)
        return int(result.code)

    async def _shutdown(self) -> None:
        self.serving.stop_tasks()
        await self.runner.shutdown()
        self._guard.cancel_all()
        self.timers.cancel_all()
        await self.presence.aclose()
        if self._metrics_server is not None:
            with contextlib.suppress(Exception):
                await self._metrics_server.stop()
        if self.group is not None:
            await self.group.stop()
        if self.client is not None:
            await self.client.aclose()
        with contextlib.suppress(OSError):
            remove_secret_config(default_secret_config_path(self.config, os.environ))
        # The heartbeat's reaping ended with it: as PID 1, take what died during the stop.
        await asyncio.to_thread(self.presence.reap_all)

    async def _start_metrics(self) -> None:
        if not self.config.metrics.enabled:
            return
        address = self.opts.metrics_address or self.config.metrics.address
        redact = status_redacted(self.config.metrics.status_detail, address)
        server = MetricsServer(address, self.metrics, lambda: redact_status(self.status(), redact=redact),
                               readiness=self.presence.readiness, liveness=self.presence.liveness)
        try:
            await server.start()
        except MetricsServerError as exc:
            log.error("metrics.unavailable", error=str(exc))
            return
        self._metrics_server = server
        if self.opts.on_metrics_url is not None:
            self.opts.on_metrics_url(server.url)

    async def _watchdog(self) -> None:
        """WATCHDOG=1 from the loop itself: if the loop stalls, systemd notices."""
        interval = self.notifier.watchdog_interval()
        if interval is None:
            return
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    # -- tasks and our own errors ------------------------------------------------------------------

    def spawn_task(self, fn: Callable[[], Any]) -> None:
        self._guard.spawn(fn)

    def supervise(self, task: asyncio.Future[Any]) -> asyncio.Future[Any]:
        return self._guard.supervise(task)

    def _internal_error(self, exc: BaseException | None, where: str | None = None) -> None:
        """A bug of ours (or a value we could not use): the supervisor's fault, never the
        profile's. Logged and counted, the engine is stopped and we exit 1 (systemd restarts us);
        nothing is remembered against the profile that was running."""
        log.error("supervisor.internal_error", error=repr(exc)[:500], where=where,
                  profile=self.lifecycle.profile, phase=self.lifecycle.phase.value,
                  exc_info=exc if isinstance(exc, Exception) else None,
                  hint="a fault of the supervisor, not of the engine or its profile; please report")
        if not self._internal_failure:
            self._internal_failure = True
            self.metrics.internal_errors.inc()
            with contextlib.suppress(Exception):
                self.store.count_internal_error()
            with contextlib.suppress(Exception):
                self.notifier.status(f"internal error ({type(exc).__name__}): stopping; "
                                     "the supervisor's fault, no profile blamed")
        if self._done is not None and not self._done.done():
            self._done.set_result(Exit(ExitCode.FAILURE, f"internal error: {exc!r}"[:500]))

    # -- the lifecycle loop and the policy bridge ---------------------------------------------------

    async def _handle(self, item: Item) -> None:
        """One item of the inbox, handled to the end before the next (inbox.py)."""
        match item:
            case StopRequested():
                self.feed(item)
            case ReloadRequest(requests=requests):
                if not self._internal_failure:
                    await self.reloader.reload(requests)
            case TimerDue(name=name):
                if self.timers.due(item):
                    self.feed(TimerFired(name))
            case _:
                assert_never(item)

    def _feed_late(self, inp: Input) -> None:
        """`feed` looked up at each call, for the parts: a test may replace `feed` on the instance."""
        self.feed(inp)

    def _stop_for_member(self, f: MemberFailed) -> None:
        """A worker node failed: the probes go quiet and the leader's engine is killed at once."""
        self.serving.quiet_probes()
        self.runner.stop_for_member(f)

    def feed(self, inp: Input) -> None:
        if self._internal_failure:
            return  # shutting down after our own error: nothing is decided (or blamed) any more
        actions = self.lifecycle.handle(inp, time.monotonic())
        for action in actions:
            self._apply(action)

    def _apply(self, a: Action) -> None:
        """Carry out one action of the lifecycle; mypy proves every kind of action is handled."""
        match a:
            case Log():
                fields = {k: v for k, v in a.fields.items() if v is not None}
                getattr(log, a.level)(a.event, **fields)
            case NotifyStatus():
                self.notifier.status(self.reloader.with_note(a.text))
                self.metrics.set_state(PHASE_TO_METRIC.get(self.lifecycle.phase, "other"))
                self.metrics.set_engine_up(self.lifecycle.phase in UP_PHASES)
            case Launch():
                self._launch(a)
            case StopEngine():
                self.runner.stop(a.reason)
            case SetTimer():
                self.timers.set(a)
            case CancelTimer():
                self.timers.cancel(a.name)
            case WaitTemporary():
                self.spawn_task(lambda: self.runner.wait_temporary(a))
            case RunReadyProbe():
                self.spawn_task(lambda: self.serving.ready_probe(a.attempt))
            case NotifyReady():
                self._on_ready()
            case NotifyStopping():
                self.notifier.stopping(self.lifecycle.status_text())
                self.serving.stop_tasks()
            case NotifyReloading():
                self.notifier.reloading(self.reloader.with_note(self.lifecycle.status_text()))
            case MarkGood():
                self._mark_good(a)
            case MarkBad():
                self.store.mark_bad(self.fp, a.profile, a.failure_class.value, time.time())
                self.metrics.start_attempt(a.profile, a.failure_class.value)
            case Exit():
                self.exit(a)
            case RollBack():
                self.upgrades.rolled_back(a)
                self.reloader.roll_back(a)
            case CanaryJudged():
                self.upgrades.judged(a)
            case _:
                assert_never(a)

    def _launch(self, a: Launch) -> None:
        if a.restart is not None:
            self.metrics.restart(a.restart)
        if a.restart is not None and self.config.group and self.config.group.restart == "external":
            # LeaderWorkerSet recreates the whole group: no relaunch of our own.
            self.exit(Exit(ExitCode.GROUP_FAILED, f"group failed ({a.restart}); "
                           "restart: external leaves the restart to the orchestrator"))
            return
        self.runner.start_launch(a)

    def _mark_good(self, a: MarkGood) -> None:
        self.store.mark_serving(self.fp, a.profile, time.time(),
                                below_best=a.profile != self.config.profile_names[0],
                                derived=self.runner.derived.get(a.profile))
        self.below_best_since = self.store.fingerprint_state(self.fp).below_best_since
        self.metrics.start_attempt(a.profile, "ready")
        self.upgrades.on_ready(a.profile, self.lifecycle.tok_s, self.lifecycle.ttft_s,
                               fidelity=self.fidelity.ready_word(a.profile))
        if a.seconds is not None:
            self.metrics.startup_seconds(a.seconds)
        self.publish_active(a.profile)

    def _still_serving(self, profile: str) -> None:
        """A reload changed the fingerprint, not the engine's command: the engine running on is
        the last good one of the new ladder too (else a restart of the supervisor would forget
        it), and /metrics names the new fingerprint."""
        self.store.mark_serving(self.fp, profile, time.time(),
                                below_best=profile != self.config.profile_names[0])
        self.below_best_since = self.store.fingerprint_state(self.fp).below_best_since
        self.publish_active(profile)

    def exit(self, a: Exit) -> None:
        """The run ends with `a` (the first exit decided wins)."""
        if self._done is not None and not self._done.done():
            self._done.set_result(a)

    def _on_ready(self) -> None:
        self.notifier.ready(self.reloader.with_note(self.lifecycle.status_text()))
        self.presence.on_ready()
        self.runner.note_ready()
        self.serving.start()
        if self.opts.exit_after_ready:
            self.loop.call_soon(self.inbox.put, StopRequested("exit-after-ready"))

    def publish_active(self, profile: str) -> None:
        names = self.config.profile_names
        self.metrics.set_active_profile(profile, self.prep.version, self.fp,
                                        names.index(profile) if profile in names else 0)


async def run_supervisor(prepared: Prepared, options: Options, notifier: Notifier | None = None
                         ) -> int:
    sup = Supervisor(prepared, options, notifier)
    return await sup.run()
