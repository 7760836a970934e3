"""The asyncio main loop: wires the pure lifecycle (`policy`) to processes, HTTP, systemd and state.

Everything here is an adapter. Decisions live in `policy.Lifecycle`: this module feeds it inputs
(engine events from the log pump, exits, timers, probe and health results, signals) and carries
out the actions it returns, in order.

Threads: only the log pump reads the engine's pipe (its own thread). The engine is spawned from
the loop's thread, which lives as long as the supervisor (PDEATHSIG is per thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog

from sglang_supervisor.core import reloadplan, wayback
from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.core.config import Config, ConfigError, ConfigProblem, load_config
from sglang_supervisor.core.events import CaptureEnded, DecodeStats, EngineEvent
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.group import MemberFailed, View
from sglang_supervisor.core.logwatch import LineSplitter, LogParser
from sglang_supervisor.core.policy import (
    UP_PHASES,
    Action,
    CancelTimer,
    CaptureKey,
    DecodeProgress,
    EngineExited,
    Exit,
    GpuBusy,
    HealthFailed,
    HealthOk,
    Input,
    Launch,
    Launched,
    LaunchFailed,
    Lifecycle,
    Log,
    MarkBad,
    MarkGood,
    NotifyReady,
    NotifyReloading,
    NotifyStatus,
    NotifyStopping,
    PassiveThroughput,
    Phase,
    PortBusy,
    ProbeFailed,
    ProbeOk,
    RegressionDecision,
    ReloadRequested,
    RunReadyProbe,
    SetTimer,
    Settings,
    Start,
    StopEngine,
    StopRequested,
    TemporaryCleared,
    TimerFired,
    WaitTemporary,
)
from sglang_supervisor.core.profiles import (
    RenderedCommand,
    config_problems,
    default_secret_config_path,
    render,
)
from sglang_supervisor.core.regression import (
    Decision,
    KeepFaster,
    RestartSame,
    RetryPrimary,
    TryNextProfile,
)
from sglang_supervisor.core.rotation import Verdict, liveness, planned, readiness
from sglang_supervisor.core.wedge import counters_grew
from sglang_supervisor.engine.argv import decode_log_interval, tp_size
from sglang_supervisor.engine.detect import detect_engine_version
from sglang_supervisor.engine.graphs import expected_captures
from sglang_supervisor.engine.sglang import clean_exit_codes, health_path
from sglang_supervisor.shell import gpu, ports, state
from sglang_supervisor.shell.apikey import read_api_key, remove_secret_config, write_secret_config
from sglang_supervisor.shell.enginehttp import EngineAnswerError
from sglang_supervisor.shell.enginelog import EngineLogPump, LogWriteState, RotatingByteLog
from sglang_supervisor.shell.fleet import GatewayAgent, read_gateway_key
from sglang_supervisor.shell.grouplink import (
    MEMBER_FAILED_DRAIN_S,
    GroupCollector,
    LeaderLink,
    local_capture_keys,
    member_failure_line,
)
from sglang_supervisor.shell.logsetup import EngineLine, log_engine_lines, set_redactions
from sglang_supervisor.shell.metrics import MetricsServer, MetricsServerError, SupervisorMetrics
from sglang_supervisor.shell.monitor import ThroughputMonitor
from sglang_supervisor.shell.notify import Notifier
from sglang_supervisor.shell.probe import (
    ProbeResult,
    check_health,
    decode_counters,
    engine_load,
    read_engine_metrics,
)
from sglang_supervisor.shell.process import EngineProcess, venv_bin_dir
from sglang_supervisor.shell.reaper import Reaper

log = structlog.get_logger("sglang_supervisor")

# Reasons for which the engine gets its full drain; after a failure or a hang SIGTERM is a
# formality (a wedged SGLang waits a minute for core dumps), so the group is killed soon.
GRACEFUL_STOPS = frozenset({"signal", "reload", "regression"})
FAILED_STOP_DRAIN_S = 2.0
# After the leader exits, give the pipe this long to deliver the last lines (and the parser's
# closing events) before the exit is reported: classification needs them.
EOF_GRACE_S = 3.0
# Foreign processes holding less than this on our GPUs do not block a start (monitoring agents).
FOREIGN_BYTES_BLOCKING = 1 << 30
# While waiting for a temporary condition: how often it is checked, and how far ahead systemd's
# start deadline is kept (the wait has its own bound, restart.temporary_wait_s).
TEMPORARY_POLL_S = 1.0
TEMPORARY_EXTEND_S = 60.0
# How often the engine's family is walked for processes that left its session (setsid).
ESCAPE_SCAN_S = 2.0
# The loop's heartbeat (/livez, zombie reaping) and how old it may get before /livez fails.
HEARTBEAT_S = 1.0
LIVENESS_STALE_S = 15.0

PHASE_TO_METRIC = {
    Phase.PREFLIGHT: "starting", Phase.LAUNCHING: "starting", Phase.LOADING_WEIGHTS: "loading",
    Phase.CAPTURING_GRAPHS: "capturing", Phase.WARMING_UP: "warming", Phase.READY: "ready",
    Phase.SERVING: "ready", Phase.DEGRADED: "degraded", Phase.RESTARTING: "restarting",
    Phase.WAITING: "backoff",
    Phase.STOPPING: "stopping", Phase.STOPPED: "stopped", Phase.FAILED: "failed",
}

# ----------------------------------------------------------------------------- preflight (pure-ish)

@dataclass(frozen=True)
class Prepared:
    """A validated configuration, rendered for one engine version."""

    config: Config
    version: str
    renders: Mapping[str, RenderedCommand]
    api_key: str | None
    gateway_key: str | None = None  # gateway.api_key_file's key, when a gateway is configured


def capture_keys(argv: Sequence[str], version: str) -> frozenset[CaptureKey]:
    keys: set[CaptureKey] = set()
    for cap in expected_captures(argv, version, tp_size(argv)):
        for rank in cap.ranks:
            keys.add((cap.owner, cap.phase, rank))
    return frozenset(keys)


def prepare(config: Config, version: str, *, secret_path: str | None = None) -> Prepared:
    """Render every profile; any flag the target release refuses is a configuration error."""
    api_key = read_api_key(config.engine)
    path = secret_path or default_secret_config_path(config)
    renders: dict[str, RenderedCommand] = {}
    problems: list[ConfigProblem] = []
    for p in config.profiles:
        rc = render(config, p.name, version, python=sys.executable, secret_config_path=path,
                    api_key=api_key)
        renders[p.name] = rc
        problems += config_problems(config, rc, version)
    if problems:
        raise ConfigError(problems, f"rendering for SGLang {version}")
    return Prepared(config, version, renders, api_key, gateway_key(config))


def gateway_key(config: Config) -> str | None:
    """gateway.api_key_file's key; a file we cannot use is a configuration error."""
    if not config.gateway.enabled:
        return None
    try:
        return read_gateway_key(config.gateway.api_key_file)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ConfigError([ConfigProblem("gateway.api_key_file", f"cannot use the gateway key: {why}",
                                         "write the gateway's API key, one line, into a file "
                                         "readable by the service user")], "gateway") from None


def ladder_hash(renders: Mapping[str, RenderedCommand]) -> str:
    joined = [(name, rc.argv, sorted(rc.env.items())) for name, rc in sorted(renders.items())]
    return state.command_hash([repr(joined)])


def policy_settings(config: Config, *, last_good: str | None, known_bad: Mapping[str, str],
                    retry_known_bad: bool, probation: str | None = None) -> Settings:
    t = config.timeouts
    return Settings(
        profiles=tuple(config.profile_names),
        remediation=dict(config.remediation),
        last_good=last_good,
        known_bad=dict(known_bad),
        retry_known_bad=retry_known_bad,
        probation=probation,
        same_profile_retries=config.restart.same_profile_retries,
        health_failures=t.health_failures,
        stall_s=t.stall_s,
        start_s=t.start_s,
        backoff_s=config.restart.backoff_s,
        failure_grace_s=max(5.0, min(t.stall_s, 15.0)),
        temporary_wait_s=config.restart.temporary_wait_s,
    )


def port_taken(host: str, port: int) -> str | None:
    """Why the engine could not bind host:port now, or None when it could."""
    why = ports.bind_error(host, port)
    if why is None:
        return None
    return f"{host}:{port} is already in use ({why}); stop what listens there or set engine.port " \
           "to a free port"


def _gpu_indices(env: Mapping[str, str]) -> set[int] | None:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return None
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    return {int(p) for p in parts} if parts and all(p.isdigit() for p in parts) else None


# ----------------------------------------------------------------------------- the supervisor

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


@dataclass
class _Timer:
    seconds: float
    reset_on_output: bool
    started: float
    handle: asyncio.TimerHandle | None = None


@dataclass
class _Engine:
    attempt: int
    profile: str
    proc: EngineProcess
    pump: EngineLogPump
    eof: asyncio.Event
    secret_path: str | None
    stopping: asyncio.Task[None] | None = None
    pids: set[int] = field(default_factory=set)  # every process seen in its group

    def note_pids(self) -> None:
        self.pids |= {m.pid for m in self.proc.group_members()}


class Supervisor:
    def __init__(self, prepared: Prepared, options: Options, notifier: Notifier | None = None) -> None:
        self.prep = prepared
        self.config = prepared.config
        self.opts = options
        self.notifier = notifier or Notifier(options.environ)
        self.metrics = SupervisorMetrics()
        self.store = state.StateStore(self.config.state_dir, self.config.name)
        # Set by the first exception inside the supervisor: from then on the lifecycle is not fed
        # (the engine's exit that our own stop causes must not be blamed on its profile).
        self._internal_failure = False
        self.metrics.internal_errors.inc(self.store.snapshot().internal_errors)
        self._below_best_since: float | None = None  # wall clock; persisted per fingerprint
        # The last reload's outcome for /status, and the note STATUS= carries while it was refused.
        self._last_reload: dict[str, Any] | None = None
        self._reload_note: str | None = None
        self._renew_monitor_at_ready = False  # probe settings changed while the engine started
        self.metrics.below_best.set_function(self._below_best_seconds)
        self.fp = self._fingerprint()
        self.lifecycle = Lifecycle(self._settings(first_run=True))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future[Exit] | None = None
        self._timers: dict[str, _Timer] = {}
        self._last_output = time.monotonic()
        self._last_extend = 0.0
        self._engine: _Engine | None = None
        self._launching: asyncio.Task[None] | None = None
        self._last_pids: set[int] = set()  # the previous engine's processes (leader + children)
        # GPU memory in use on our GPUs before our first engine: a relaunch waits until usage is
        # back to it (the schedulers' PIDs are gone by then, their memory not always).
        self._gpu_baseline: int | None = None
        self._engine_started_once = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._health_task: asyncio.Task[None] | None = None
        self._monitor: ThroughputMonitor | None = None
        self._ready_monitor: ThroughputMonitor | None = None  # the READY gate's, while it probes
        self._monitor_task: asyncio.Task[None] | None = None
        self._remediation: Any = None
        self._capture_seconds: dict[str, float] = {}
        self._client: httpx.AsyncClient | None = None
        self._metrics_server: MetricsServer | None = None
        # Multi-node leader (node 0 of a group): the link its worker nodes call (grouplink.py).
        group = self.config.group
        self._group: LeaderLink | None = (
            LeaderLink(group, self._group_view, self._group_engine_running, self._group_member_failed,
                       self._group_progress)
            if group is not None and group.leader else None)
        if self._group is not None:
            self.metrics.registry.register(GroupCollector(self._group))
        # A spell of failed engine log writes, across engines: (began, bytes dropped so far).
        self._log_spell: tuple[float, int] | None = None
        # Fleets (docs/OPERATIONS.md): gateway registration, the drain before planned stops,
        # /readyz and /livez, zombie reaping as a container's PID 1. See `_before_stop`.
        self._fleet: GatewayAgent | None = None
        self._draining = False
        self._heartbeat = time.monotonic()
        self._reaper = Reaper.for_this_process(self._known_children)

    # -- setup ----------------------------------------------------------------------------

    def _fingerprint(self) -> str:
        gpus = gpu.snapshot() or []
        return state.fingerprint(
            self.config.engine.model_path, self.prep.version, [g.name for g in gpus],
            next((g.driver for g in gpus if g.driver), "") or "", ladder_hash(self.prep.renders))

    def _settings(self, first_run: bool) -> Settings:
        now = time.time()
        fs = self.store.fingerprint_state(self.fp)
        last_good = fs.last_good.profile if fs.last_good is not None else None
        r = self.config.restart
        # Falls back to `tune`'s winner; no probation for what tune measured serving slower.
        plan = wayback.start_plan(self.config.profile_names, last_good,
                                  ranking=fs.ranking.profiles if fs.ranking is not None else None,
                                  bad=fs.bad, now=now,
                                  policy=wayback.Policy(r.known_bad_ttl_s, r.transient_retry_s))
        self._below_best_since = fs.below_best_since
        return policy_settings(
            self.config, last_good=plan.last_good, known_bad=plan.backoff,
            probation=plan.probation if first_run else None,
            retry_known_bad=self.opts.retry_known_bad and first_run)

    def _below_best_seconds(self) -> float:
        """For the metric: how long this deployment has served below the ladder's best profile
        (across restarts: the start of the spell is in the state file)."""
        since = self._below_best_since
        return 0.0 if since is None else max(0.0, time.time() - since)

    @property
    def base_url(self) -> str:
        return ports.local_base_url(self.config.engine.host, self.config.engine.port)

    def status(self) -> dict[str, Any]:
        """The `/status` document: names and numbers only, never the API key or argv."""
        snap = self.lifecycle.snapshot(time.monotonic())
        eng = self._engine
        snap.update({
            "name": self.config.name,
            "engine_version": self.prep.version,
            "fingerprint": self.fp,
            "engine_pid": eng.proc.pid if eng else None,
            "engine_log": self.config.engine.log_file,
            "engine_log_errors": eng.pump.log_errors if eng else 0,
            "engine_log_writable": self._log_spell is None,
            "forward_dropped": eng.pump.stats.forward_dropped if eng else 0,
            "throughput": self._monitor.status() if self._monitor else None,
            "last_reload": self._last_reload,
            "below_best_profile_seconds": round(self._below_best_seconds(), 1),
            "readyz": self.readiness().reason,
            "gateway": self._fleet.status() if self._fleet else None,
        })
        if self._group is not None:
            book = self._group.book
            snap["group"] = {"generation": book.generation, "nnodes": book.nnodes,
                             "serving_nodes": sorted(book.serving), "missing_nodes": book.missing(),
                             "failed": book.failed, "rejected_reports": self._group.rejected}
        return snap

    def readiness(self) -> Verdict:
        return readiness(self.lifecycle.snapshot(time.monotonic()), draining=self._draining)

    def liveness(self) -> Verdict:
        return liveness(time.monotonic() - self._heartbeat, stale_s=LIVENESS_STALE_S)

    # -- main -----------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._done = loop.create_future()
        loop.set_exception_handler(self._loop_exception)
        # The gateway's key too: a gateway (or a proxy before it) may quote it in an error page.
        if keys := [k for k in (self.prep.api_key, self.prep.gateway_key) if k]:
            set_redactions(keys)
        for sig, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
            loop.add_signal_handler(sig, self.feed, StopRequested(name))
        loop.add_signal_handler(signal.SIGHUP, self._spawn_task, self._reload)
        self._client = httpx.AsyncClient()
        self._start_fleet()
        await self._start_metrics()
        if self._group is not None:
            try:
                await self._group.start()
            except OSError as exc:
                log.error("group.link_unavailable", error=str(exc))
                await self._shutdown()
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
                return int(ExitCode.TEMPORARY)
        watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
        heartbeat = asyncio.create_task(self._beat(), name="heartbeat")
        log.info("supervisor.start", name=self.config.name, engine_version=self.prep.version,
                 profiles=",".join(self.config.profile_names), fingerprint=self.fp,
                 state_dir=self.config.state_dir, engine_log=self.config.engine.log_file)
        foreign = self._foreign()
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
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
        return int(result.code)

    async def _shutdown(self) -> None:
        self._stop_serving_tasks()
        if self._launching is not None:
            self._launching.cancel()
        eng = self._engine
        if eng is not None:
            if eng.stopping is not None and not eng.stopping.done():
                with contextlib.suppress(Exception):
                    await eng.stopping  # bounded by drain_s + kill_s
            escaped = await asyncio.to_thread(eng.proc.family.escapees)
            if eng.proc.returncode is None or eng.proc.group_members() or escaped:
                # Exit was decided with (part of) the engine still up, e.g. after an internal
                # error: never leave it behind, children included.
                result = await eng.proc.stop(self.config.timeouts.drain_s, self.config.timeouts.kill_s)
                self._log_escaped(result.escaped)
                self._log_leftover(result.leftover)
        for t in list(self._tasks):
            t.cancel()
        for timer in self._timers.values():
            if timer.handle:
                timer.handle.cancel()
        if self._fleet is not None:
            with contextlib.suppress(Exception):
                await self._fleet.aclose()
        if self._metrics_server is not None:
            with contextlib.suppress(Exception):
                await self._metrics_server.stop()
        if self._group is not None:
            await self._group.stop()
        if self._client is not None:
            await self._client.aclose()
        with contextlib.suppress(OSError):
            remove_secret_config(default_secret_config_path(self.config))

    async def _start_metrics(self) -> None:
        if not self.config.metrics.enabled:
            return
        address = self.opts.metrics_address or self.config.metrics.address
        server = MetricsServer(address, self.metrics, self.status, readiness=self.readiness,
                               liveness=self.liveness)
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

    # -- fleets: the gateway, the drain before planned stops, liveness, reaping ------------------

    def _start_fleet(self) -> None:
        gw = self.config.gateway
        if gw.enabled:
            self._fleet = GatewayAgent(gw, self.base_url, self.config.state_dir, self.metrics.registry,
                                       api_key=self.prep.gateway_key, engine_api_key=self.prep.api_key)
            self._fleet.start()

    async def _beat(self) -> None:
        """The heartbeat /livez reads; as PID 1 of a container it also reaps orphaned zombies."""
        while True:
            self._heartbeat = time.monotonic()
            self._reaper.reap()
            await asyncio.sleep(HEARTBEAT_S)

    def _known_children(self) -> set[int]:
        """Our own children, reaped by whoever started them (Popen), never by the reaper."""
        return {self._engine.proc.pid} if self._engine is not None else set()

    async def _before_stop(self, reason: str) -> None:
        """The one hook every stop of the engine passes, before SIGTERM reaches it: a planned stop
        leaves the gateway and waits for in-flight requests (bounded by gateway.drain_s); a
        failure stop only leaves the gateway, in the background."""
        if self._fleet is None:
            return
        if not planned(reason):
            self._fleet.on_engine_gone()
            return
        self._draining = True
        # systemd's stop (or reload) deadline must cover the drain that is about to happen.
        self.notifier.extend_timeout(self.config.gateway.drain_s + self.config.timeouts.drain_s
                                     + self.config.timeouts.kill_s + 5.0)
        await self._fleet.drain(reason, self._inflight)

    async def _inflight(self) -> int | None:
        assert self._client is not None
        load = await engine_load(self._client, self.base_url, self.prep.api_key,
                                 timeout=self.config.gateway.timeout_s)
        return None if load is None else load.running + load.queued

    def _spawn_task(self, fn: Callable[[], Any]) -> None:
        task = asyncio.ensure_future(fn())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._supervise(task)

    def _supervise(self, task: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """A bug in any of our tasks ends the run (exit 1, engine stopped) instead of vanishing
        into "Task exception was never retrieved" while the lifecycle waits forever for it."""
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._internal_error(task.exception())

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

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio's last resort, in our log. A callback of ours that raised (a timer, a signal,
        engine output fed to the lifecycle) is fatal like a task; other reports are logged only."""
        exc = context.get("exception")
        if exc is not None and "handle" in context and "future" not in context:
            self._internal_error(exc, str(context.get("message") or ""))
        else:
            log.warning("supervisor.asyncio", message=str(context.get("message") or ""),
                        error=repr(exc) if exc is not None else None)

    # -- the policy bridge ------------------------------------------------------------------

    def feed(self, inp: Input) -> None:
        if self._internal_failure:
            return  # shutting down after our own error: nothing is decided (or blamed) any more
        actions = self.lifecycle.handle(inp, time.monotonic())
        for action in actions:
            self._apply(action)

    def _apply(self, a: Action) -> None:
        if isinstance(a, Log):
            fields = {k: v for k, v in a.fields.items() if v is not None}
            getattr(log, a.level)(a.event, **fields)
        elif isinstance(a, NotifyStatus):
            self.notifier.status(self._with_note(a.text))
            self.metrics.set_state(PHASE_TO_METRIC.get(self.lifecycle.phase, "other"))
            self.metrics.set_engine_up(self.lifecycle.phase in UP_PHASES)
        elif isinstance(a, Launch):
            if a.restart is not None:
                self.metrics.restart(a.restart)
            if a.restart is not None and self.config.group and self.config.group.restart == "external":
                # LeaderWorkerSet recreates the whole group: no relaunch of our own.
                self._apply(Exit(ExitCode.GROUP_FAILED, f"group failed ({a.restart}); "
                                 "restart: external leaves the restart to the orchestrator"))
                return
            self._launching = asyncio.ensure_future(self._launch(a))
            self._supervise(self._launching)
        elif isinstance(a, StopEngine):
            self._stop_engine(a.reason)
        elif isinstance(a, SetTimer):
            self._set_timer(a)
        elif isinstance(a, CancelTimer):
            t = self._timers.pop(a.name, None)
            if t is not None and t.handle is not None:
                t.handle.cancel()
        elif isinstance(a, WaitTemporary):
            self._spawn_task(lambda: self._wait_temporary(a))
        elif isinstance(a, RunReadyProbe):
            self._spawn_task(lambda: self._ready_probe(a.attempt))
        elif isinstance(a, NotifyReady):
            self._on_ready()
        elif isinstance(a, NotifyStopping):
            self.notifier.stopping(self.lifecycle.status_text())
            self._stop_serving_tasks()
        elif isinstance(a, NotifyReloading):
            self.notifier.reloading(self._with_note(self.lifecycle.status_text()))
        elif isinstance(a, MarkGood):
            self.store.mark_serving(self.fp, a.profile, time.time(),
                                    below_best=a.profile != self.config.profile_names[0])
            self._below_best_since = self.store.fingerprint_state(self.fp).below_best_since
            self.metrics.start_attempt(a.profile, "ready")
            if a.seconds is not None:
                self.metrics.startup_seconds(a.seconds)
            self._publish_active(a.profile)
        elif isinstance(a, MarkBad):
            self.store.mark_bad(self.fp, a.profile, a.failure_class.value, time.time())
            self.metrics.start_attempt(a.profile, a.failure_class.value)
        elif isinstance(a, Exit) and self._done is not None and not self._done.done():
            self._done.set_result(a)

    def _publish_active(self, profile: str) -> None:
        names = self.config.profile_names
        self.metrics.set_active_profile(profile, self.prep.version, self.fp,
                                        names.index(profile) if profile in names else 0)

    # -- timers ---------------------------------------------------------------------------

    def _set_timer(self, a: SetTimer) -> None:
        old = self._timers.pop(a.name, None)
        if old is not None and old.handle is not None:
            old.handle.cancel()
        assert self._loop is not None
        timer = _Timer(a.seconds, a.reset_on_output, time.monotonic())
        timer.handle = self._loop.call_later(a.seconds, self._timer_due, a.name, timer)
        self._timers[a.name] = timer

    def _timer_due(self, name: str, timer: _Timer) -> None:
        if self._timers.get(name) is not timer:
            return
        if timer.reset_on_output:
            # Output since the timer was armed moves the deadline instead of re-arming per line.
            deadline = max(timer.started, self._last_output) + timer.seconds
            left = deadline - time.monotonic()
            if left > 0:
                assert self._loop is not None
                timer.handle = self._loop.call_later(left, self._timer_due, name, timer)
                return
        del self._timers[name]
        self.feed(TimerFired(name))

    # -- launching ------------------------------------------------------------------------

    def _gpu_set(self) -> set[int] | None:
        return _gpu_indices({**self.opts.environ, **self.config.engine.env})

    def _foreign(self) -> str | None:
        foreign = [f for f in gpu.foreign_processes(self._last_pids, self._gpu_set())
                   if (f.used_bytes or 0) >= FOREIGN_BYTES_BLOCKING]
        if not foreign:
            return None
        return ", ".join(f"pid {f.pid} ({f.command or '?'}) holds {(f.used_bytes or 0) >> 20} MiB "
                         f"on GPU{f.gpu_index}" for f in foreign)

    async def _launch(self, a: Launch) -> None:
        try:
            if self._engine_started_once:
                target: set[int] | int = (self._gpu_baseline if self._gpu_baseline is not None
                                          else self._last_pids)
                released = await gpu.wait_for_release(target, self.config.timeouts.gpu_release_s,
                                                      gpu_indices=self._gpu_set())
                if released is False:
                    foreign = self._foreign()
                    log.warning("gpu.not_released", pids=len(self._last_pids), foreign=foreign)
                    if foreign:
                        self.feed(GpuBusy(foreign))
                        return
            if a.delay_s > 0:
                await asyncio.sleep(a.delay_s)
            self._spawn(a)
        except asyncio.CancelledError:
            return
        finally:
            if self._launching is asyncio.current_task():
                self._launching = None

    async def _wait_temporary(self, a: WaitTemporary) -> None:
        """Check the condition the lifecycle waits for until it clears (its timer bounds us)."""
        await asyncio.sleep(a.delay_s)
        extended = float("-inf")
        while self.lifecycle.wait_seq == a.seq:
            if a.what == "port":
                busy = port_taken(self.config.engine.host, self.config.engine.port)
            else:
                busy = await asyncio.to_thread(self._foreign)
            if busy is None:
                self.feed(TemporaryCleared(a.seq))
                return
            now = time.monotonic()
            if not self.lifecycle.ready_sent and now - extended >= TEMPORARY_EXTEND_S / 3:
                extended = now  # still starting: systemd's start timeout must not end the wait
                self.notifier.extend_timeout(TEMPORARY_EXTEND_S)
            await asyncio.sleep(TEMPORARY_POLL_S)

    def _render(self, profile: str) -> RenderedCommand:
        rc = self.prep.renders.get(profile)
        if rc is None:  # a profile added by a reload is rendered on the spot
            rc = render(self.config, profile, self.prep.version, python=sys.executable,
                        secret_config_path=default_secret_config_path(self.config),
                        api_key=self.prep.api_key)
        return rc

    def _spawn(self, a: Launch) -> None:
        try:
            rc = self._render(a.profile)
        except ConfigError as exc:
            self.feed(LaunchFailed(a.attempt, str(exc), config_error=True))
            return
        if rc.errors:
            self.feed(LaunchFailed(a.attempt, "; ".join(p.message for p in rc.errors), True))
            return
        secret_path: str | None = None
        if rc.secret_config:
            secret_path = default_secret_config_path(self.config)
            try:
                write_secret_config(secret_path, rc.secret_config)
            except OSError as exc:
                self.feed(LaunchFailed(a.attempt, f"cannot write the engine's secret config "
                                       f"{secret_path}: {exc.strerror}", config_error=True))
                return
        env = engine_env(self.opts.environ, rc.env, venv_bin_dir(rc.argv[0]))
        if not self._engine_started_once:
            gpus = gpu.snapshot()
            self._gpu_baseline = gpu.total_used(gpus, self._gpu_set()) if gpus else None
        try:
            proc = EngineProcess.spawn(rc.argv, env)
        except OSError as exc:
            self.feed(LaunchFailed(a.attempt, f"cannot start {rc.argv[0]}: {exc.strerror or exc}",
                                   config_error=isinstance(exc, FileNotFoundError | PermissionError)))
            return
        assert self._loop is not None
        eng_cfg = self.config.engine
        eof = asyncio.Event()
        attempt = a.attempt
        secrets = [self.prep.api_key] if self.prep.api_key else []
        forward_max = self.opts.forward_max_priority

        def forward(lines: Sequence[EngineLine]) -> None:
            log_engine_lines(lines, max_priority=forward_max)

        pump = EngineLogPump(
            proc.stderr_fd, loop=self._loop,
            log=RotatingByteLog(eng_cfg.log_file, eng_cfg.log_max_bytes, eng_cfg.log_backups,
                                on_state=self._log_state_threadsafe),
            splitter=LineSplitter(), parser=LogParser(self.prep.version, secrets),
            echo_fd=proc.stdout_fd, echo_splitter=LineSplitter(),  # request records: never parsed
            on_output=lambda events: self._on_output(attempt, events), on_eof=eof.set,
            secrets=secrets,
            forward_batch=forward if self.config.logging.forward_engine_output else None,
            name=f"engine-log-{attempt}")
        pump.start()
        self._engine_started_once = True
        self._engine = _Engine(attempt, a.profile, proc, pump, eof, secret_path)
        self._last_output = time.monotonic()
        self._capture_seconds = {}
        keys = capture_keys(rc.argv, self.prep.version)
        if self._group is not None and self.config.group is not None:
            # The leader expects its own ranks' captures; the workers' come through the link.
            keys = local_capture_keys(keys, self.config.group, tp_size(rc.argv))
            self._group.book.new_generation(attempt)
        self.feed(Launched(attempt, proc.pid, keys))
        self._spawn_task(lambda: self._watch_exit(self._engine_for(attempt)))
        self._spawn_task(lambda: self._watch_family(self._engine_for(attempt)))

    def _log_state_threadsafe(self, st: LogWriteState) -> None:
        """From the pump's thread: never log or block there (journald may be what is stuck)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: we are exiting
                self._loop.call_soon_threadsafe(self._on_log_state, st)

    def _on_log_state(self, st: LogWriteState) -> None:
        """A full disk under the engine log is an event (once per spell, and its end) and a
        metric: the engine runs on, its lines still go to the journal."""
        now = time.monotonic()
        if not st.ok and self._log_spell is None:
            self._log_spell = (now, st.dropped_bytes)
            self.metrics.engine_log_state(False, st.dropped_bytes, began=True)
            log.error("engine_log.write_failed", path=st.path, error=st.error,
                      hint=f"free space under {os.path.dirname(st.path) or '.'}: the engine keeps "
                           "running (its lines reach the journal if logging.forward_engine_output "
                           "is on); writing resumes by itself")
            return
        self.metrics.engine_log_state(st.ok, st.dropped_bytes)
        if self._log_spell is None:
            return
        began, dropped = self._log_spell
        dropped += st.dropped_bytes
        if st.ok:
            self._log_spell = None
            log.info("engine_log.write_recovered", path=st.path, dropped_bytes=dropped,
                     seconds=round(now - began, 3))
        else:
            self._log_spell = (began, dropped)

    def _engine_for(self, attempt: int) -> _Engine:
        assert self._engine is not None and self._engine.attempt == attempt
        return self._engine

    async def _watch_family(self, eng: _Engine) -> None:
        """Warn about engine processes that leave its session (setsid) as soon as they do: the
        group kill would miss them; `EngineProcess.stop` kills them with the engine."""
        while eng.proc.returncode is None and eng.stopping is None:
            for e in await asyncio.to_thread(eng.proc.family.scan):
                log.warning("engine.escaped_process", profile=eng.profile, pid=e.pid, comm=e.name,
                            session=e.session,
                            hint="it left the engine's session (setsid); it is stopped with "
                                 "the engine")
            await asyncio.sleep(ESCAPE_SCAN_S)

    async def _watch_exit(self, eng: _Engine) -> None:
        rc = await eng.proc.wait()
        if not eng.proc.we_stopped and self._fleet is not None:
            self._fleet.on_engine_gone()  # a crash: out of the gateway before anything else
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(eng.eof.wait(), EOF_GRACE_S)
        escaped = await asyncio.to_thread(eng.proc.family.escapees, sweep=True)
        if eng.proc.group_members() or escaped:
            # The launcher is gone but part of its group (or a process that left it) lives on,
            # holding GPU memory, its port or the pipe: an engine is all of its processes.
            log.warning("engine.orphans", pids=[m.pid for m in eng.proc.group_members()]
                        + [e.pid for e in escaped])
            result = await eng.proc.stop(0.0, self.config.timeouts.kill_s)
            self._log_escaped(result.escaped)
            self._log_leftover(result.leftover)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(eng.eof.wait(), EOF_GRACE_S)
        if eng.stopping is not None:
            with contextlib.suppress(Exception):
                await eng.stopping
        self._last_pids = eng.pids | {eng.proc.pid}
        if eng.secret_path:
            remove_secret_config(eng.secret_path)
        if self._engine is eng:
            self._engine = None
        self._stop_serving_tasks()
        clean = rc in clean_exit_codes(self.prep.version)
        self.feed(EngineExited(eng.attempt, rc, eng.proc.we_stopped, clean))

    def _log_escaped(self, escaped: Sequence[Any]) -> None:
        if escaped:
            log.warning("engine.escapees_stopped",
                        processes=", ".join(f"{p.pid}:{p.name}" for p in escaped),
                        hint="engine processes outside its session (setsid) were killed with it")

    def _log_leftover(self, leftover: Sequence[Any]) -> None:
        if leftover:
            log.error("engine.leftover_processes",
                      processes=", ".join(f"{p.pid}:{p.name}" for p in leftover),
                      hint="processes of the engine's group survived SIGKILL (uninterruptible "
                           "sleep in the driver?)")

    def _stop_engine(self, reason: str) -> None:
        eng = self._engine
        if eng is None:
            if self._launching is not None and not self._launching.done():
                # Nothing runs yet (backoff or GPU wait): cancel the launch and report the "exit".
                self._launching.cancel()
                self._launching = None
                attempt = self.lifecycle.attempt
                assert self._loop is not None
                self._loop.call_soon(self.feed, EngineExited(attempt, None, True, True))
            return
        eng.proc.we_stopped = True
        self._quiet_probes()
        if eng.stopping is not None and not eng.stopping.done():
            return
        t = self.config.timeouts
        drain = t.drain_s if reason in GRACEFUL_STOPS else min(t.drain_s, FAILED_STOP_DRAIN_S)

        eng.note_pids()

        async def stop() -> None:
            await self._before_stop(reason)
            result = await eng.proc.stop(drain, t.kill_s)
            log.info("engine.stopped", profile=eng.profile, reason=reason,
                     returncode=result.returncode, drained=result.drained, killed=result.killed,
                     seconds=result.seconds)
            self._log_escaped(result.escaped)
            self._log_leftover(result.leftover)

        eng.stopping = asyncio.ensure_future(stop())
        self._supervise(eng.stopping)

    def _quiet_probes(self) -> None:
        """Our stop is about to break the engine's connections: probes and health checks still in
        flight must not report that as the engine failing (a probe.failed ReadError warning)."""
        if self._health_task is not None:
            self._health_task.cancel()  # its next result would be fed to a stopping lifecycle
            self._health_task = None
        for monitor in (self._monitor, self._ready_monitor):
            if monitor is not None:
                monitor.stop()  # its loop ends after the probe in flight, whose result it drops

    # -- engine output ----------------------------------------------------------------------

    def _on_output(self, attempt: int, events: list[EngineEvent]) -> None:
        if self._engine is None or self._engine.attempt != attempt:
            return  # a previous engine's last words
        now = time.monotonic()
        self._last_output = now
        phase = self.lifecycle.phase
        if phase not in UP_PHASES and phase != Phase.STOPPING:
            # Keep systemd's start (or reload) deadline ahead of us while the log moves; once the
            # log stalls this stops and our own stall timer decides first.
            stall = self.config.timeouts.stall_s
            if now - self._last_extend >= min(10.0, stall / 3):
                self._last_extend = now
                self.notifier.extend_timeout(stall + self.config.timeouts.drain_s + 30.0)
        for ev in events:
            if isinstance(ev, CaptureEnded) and ev.elapsed_s is not None:
                kind = f"{ev.owner}_{ev.phase}"
                self._capture_seconds[kind] = max(self._capture_seconds.get(kind, 0.0), ev.elapsed_s)
                self.metrics.capture_seconds(kind, self._capture_seconds[kind])
            if isinstance(ev, DecodeStats) and self._monitor is not None:
                self._monitor.feed(ev)
            self.feed(ev)

    # -- probing and health -------------------------------------------------------------------

    def _new_monitor(self, profile: str) -> ThroughputMonitor:
        p = self.config.probe
        argv = self._render(profile).argv
        key = state.baseline_key(f"{self.fp}/{profile}", p.input_tokens, p.max_new_tokens)
        eng = self._engine
        pids = {eng.proc.pid} if eng else set()
        attempt = self.lifecycle.attempt

        def on_probe(result: ProbeResult) -> None:
            if self.lifecycle.attempt != attempt:
                return  # a stopped engine's monitor finishing its last round
            if result.ok:
                self.feed(ProbeOk(result.decode_tps, result.ttft_s))
            elif result.timed_out:
                # An idle engine that cannot finish a short generation may be wedged: count it
                # like a failed health check. Other errors are the monitor's (logged, counted).
                self.feed(ProbeFailed(result.error or "probe timed out", hung=True))

        def on_passive_tps(tok_s: float) -> None:
            if self.lifecycle.attempt == attempt:
                self.feed(PassiveThroughput(tok_s))

        return ThroughputMonitor(
            self.base_url, p, self.metrics, self.store, self._on_decision,
            baseline_key=key, profile=profile, primary=self.config.profile_names[0],
            remediation=self._remediation, api_key=self.prep.api_key,
            our_pids=lambda: gpu.descendant_pids(next(iter(pids))) if pids else set(),
            gpu_indices=self._gpu_set(),
            gpus_per_engine=tp_size(argv), decode_log_interval=decode_log_interval(argv),
            on_probe=on_probe, on_passive_tps=on_passive_tps)

    async def _ready_probe(self, attempt: int) -> None:
        """The probe that gates READY, retried until `ready_probe_s` (the port may need a moment)."""
        profile = self.lifecycle.profile or ""
        if self._group is not None and not await self._group_members_ready(attempt):
            return
        monitor = self._ready_monitor = self._new_monitor(profile)
        try:
            await self._ready_probe_rounds(attempt, profile, monitor)
        finally:
            if self._ready_monitor is monitor:
                self._ready_monitor = None

    async def _ready_probe_rounds(self, attempt: int, profile: str,
                                  monitor: ThroughputMonitor) -> None:
        deadline = time.monotonic() + self.config.timeouts.ready_probe_s
        last_error = "no probe ran"
        hung = False
        while time.monotonic() < deadline:
            if self.lifecycle.attempt != attempt or self.lifecycle.phase not in (
                    Phase.WARMING_UP, Phase.CAPTURING_GRAPHS):
                await monitor.aclose()
                return
            try:
                result = await asyncio.wait_for(monitor.first_probe(),
                                                max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                last_error, hung = "no answer within timeouts.ready_probe_s", True
                break
            if monitor.stopped:
                await monitor.aclose()  # the engine is being stopped: its answer means nothing
                return
            if result.ok:
                if self.lifecycle.attempt == attempt:
                    self._monitor = monitor
                    self.feed(ProbeOk(result.decode_tps, result.ttft_s))
                else:
                    await monitor.aclose()
                return
            last_error, hung = result.error or "probe failed", result.timed_out
            log.warning("probe.retry", profile=profile, error=last_error)
            await asyncio.sleep(0.5)
        await monitor.aclose()
        if self.lifecycle.attempt == attempt:
            self.feed(ProbeFailed(last_error, hung=hung))

    # -- multi-node leader ------------------------------------------------------------------------

    def _group_view(self) -> View:
        phase = self.lifecycle.phase
        eng = self._engine
        if eng is None or eng.stopping is not None or phase in (Phase.STOPPING, Phase.RESTARTING):
            engine = "stopping" if eng is not None else "none"
        else:
            engine = "serving" if phase in UP_PHASES else "starting"
        assert self.config.group is not None and self._group is not None
        return View(self.lifecycle.attempt, self.lifecycle.profile, engine,  # type: ignore[arg-type]
                    self.config.group.restart, dict(self._group.book.claimed))

    def _group_progress(self) -> None:
        self._last_output = time.monotonic()  # the stall timer watches the whole group's start

    def _group_engine_running(self) -> bool:
        return self._engine is not None and self._engine.stopping is None

    def _group_member_failed(self, f: MemberFailed) -> None:
        """A worker node failed: the group's engine failed. Its class goes to the lifecycle as a
        failure line; the leader's engine is killed now (its ranks wait in a collective that
        cannot complete), and the lifecycle restarts the group on the same or the next profile."""
        log.error("group.member_failed", node_rank=f.node_rank, failure_class=f.failure_class.value,
                  message=f.message, generation=self.lifecycle.attempt)
        assert self.config.group is not None
        if self.config.group.restart == "external":
            self._apply(Exit(ExitCode.GROUP_FAILED, f"node {f.node_rank} failed "
                             f"({f.failure_class.value}); restart: external"))
            return
        eng = self._engine
        if eng is None or eng.stopping is not None:
            return
        self.feed(member_failure_line(f))
        self._quiet_probes()
        eng.note_pids()
        kill_s = self.config.timeouts.kill_s

        async def stop() -> None:
            result = await eng.proc.stop(MEMBER_FAILED_DRAIN_S, kill_s)
            log.info("engine.stopped", profile=eng.profile, reason="group_member_failed",
                     returncode=result.returncode, seconds=result.seconds)

        eng.stopping = asyncio.ensure_future(stop())
        self._supervise(eng.stopping)

    async def _group_members_ready(self, attempt: int) -> bool:
        """READY waits for every worker node's captures (the leader's own ended already)."""
        assert self._group is not None
        ok = await self._group.wait_members(
            attempt, self.config.timeouts.ready_probe_s,
            lambda: self.lifecycle.attempt == attempt and self.lifecycle.phase in (
                Phase.WARMING_UP, Phase.CAPTURING_GRAPHS))
        if ok:
            log.info("group.members_ready", generation=attempt, nodes=self._group.book.nnodes)
        if not ok and self.lifecycle.attempt == attempt and self._group.book.failed is False:
            missing = ", ".join(map(str, self._group.book.missing()))
            self.feed(ProbeFailed(f"node(s) {missing} did not report their captures ended within "
                                  "timeouts.ready_probe_s", hung=True))
        return ok

    def _with_note(self, text: str) -> str:
        """STATUS= text; after a refused reload it says so until a reload is applied: `systemctl
        status` is where an operator looks, and the next tok/s refresh must not hide it."""
        return text if self._reload_note is None else f"{text}; {self._reload_note}"

    def _on_ready(self) -> None:
        self.notifier.ready(self._with_note(self.lifecycle.status_text()))
        if self._renew_monitor_at_ready:
            self._renew_monitor_at_ready = False
            self._renew_monitor()
        self._draining = False
        if self._fleet is not None:
            self._fleet.on_ready()
        if self._engine is not None:
            self._engine.note_pids()
        # READY=1 also ends a reload that kept the engine: the loops may already be running.
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.ensure_future(self._health_loop(self.lifecycle.attempt))
            self._supervise(self._health_task)
        if self._monitor is not None and self.config.probe.enabled and (
                self._monitor_task is None or self._monitor_task.done()):
            self._monitor_task = asyncio.ensure_future(self._monitor.run())
            self._supervise(self._monitor_task)
        if self.opts.exit_after_ready:
            assert self._loop is not None
            self._loop.call_soon(self.feed, StopRequested("exit-after-ready"))

    def _stop_serving_tasks(self) -> None:
        for task in (self._health_task, self._monitor_task):
            if task is not None:
                task.cancel()
        self._health_task = self._monitor_task = None
        if self._monitor is not None:
            self._remediation = self._monitor.remediation
            self._monitor.stop()
            self._spawn_task(self._monitor.aclose)
            self._monitor = None

    async def _health_loop(self, attempt: int) -> None:
        """Health checks (bounded: `probe.check_health`), each followed by a look at the engine's
        /metrics decode counters: progress since the last check means busy, not wedged."""
        url = self.base_url + health_path(self.prep.version)
        assert self._client is not None
        counters: tuple[float | None, ...] | None = None
        scrape = True  # until the engine shows it has no /metrics (no --enable-metrics)
        while self.lifecycle.attempt == attempt and self.lifecycle.phase in UP_PHASES:
            t = self.config.timeouts  # every round: a reload applies new timeouts at once
            await asyncio.sleep(t.health_interval_s)
            result = await check_health(self._client, url, t.health_timeout_s)
            if scrape:
                try:
                    m = await read_engine_metrics(self._client, self.base_url, self.prep.api_key,
                                                  min(t.health_timeout_s, 5.0))
                except EngineAnswerError as exc:
                    m, scrape = None, exc.status != 404
                now_counters = decode_counters(m)
                progressed = counters_grew(counters, now_counters)
                counters = now_counters if now_counters is not None else counters
            else:
                progressed = False
            if self.lifecycle.attempt != attempt:
                return
            if progressed:
                self.feed(DecodeProgress())
            self.feed(HealthOk() if result.ok else HealthFailed(result.why))

    def _on_decision(self, decision: Decision, text: str) -> None:
        current = self.lifecycle.profile
        if isinstance(decision, RestartSame):
            self.feed(RegressionDecision("restart_same", text))
        elif isinstance(decision, TryNextProfile):
            self.feed(RegressionDecision("next_profile", text))
        elif isinstance(decision, KeepFaster) and decision.profile != current:
            self.feed(RegressionDecision("switch", text, decision.profile))
        elif isinstance(decision, RetryPrimary):
            self.feed(RegressionDecision("switch", text, self.config.profile_names[0]))
        else:
            self.feed(RegressionDecision("keep", text))

    # -- reload -------------------------------------------------------------------------------

    async def _reload(self) -> None:
        """SIGHUP: re-read the configuration; restart the engine only if its command changed.
        Every changed key is applied, or the reload is refused with the reason (reloadplan.py)."""
        path = self.opts.config_path
        if path is None:
            self._refuse_reload("no configuration file to re-read", "no_config")
            return
        try:
            config = await asyncio.to_thread(load_config, path)
            # `version: auto` runs the engine's interpreter: never on the loop (watchdog, health).
            version = await asyncio.to_thread(self._reload_version, config)
            prepared = await asyncio.to_thread(prepare, config, version)
        except ConfigError as exc:
            # A broken file must not take a healthy engine down: keep running what we have.
            first = exc.problems[0] if exc.problems else None
            why = f"{len(exc.problems)} configuration problem(s)" + (
                f", first: {first.path or 'file'}: {first.problem}" if first else "")
            self._refuse_reload(why[:300], "invalid", report=str(exc))
            return
        current = self.lifecycle.profile
        old = self.prep.renders.get(current) if current else None
        new = prepared.renders.get(current) if current else None
        changed = (old is None or new is None or old.argv != new.argv or old.env != new.env
                   or old.secret_config != new.secret_config)
        refused = reloadplan.refused_keys(self.config, config, engine_restarts=changed)
        if refused:
            self._refuse_reload(reloadplan.refusal_reason(refused), "not_applicable",
                                keys=",".join(sorted(refused)))
            return
        probe_changed = config.probe != self.config.probe
        keys = reloadplan.changed_keys(self.config, config)
        self.prep = prepared
        self.config = config
        # Baselines, last good and known bad belong to the commands that earned them: the new
        # ladder has its own (NVML is read off the loop).
        old_fp, self.fp = self.fp, await asyncio.to_thread(self._fingerprint)
        if self.fp != old_fp:
            log.info("supervisor.fingerprint_changed", old=old_fp, new=self.fp)
        if secrets := [k for k in (prepared.api_key, prepared.gateway_key) if k]:
            set_redactions(secrets)
        self._reload_note = None
        self._last_reload = {"result": "applied", "at": time.time(), "changed": keys[:50],
                             "restarts_engine": changed}
        self.metrics.reload_result("applied")
        self.feed(ReloadRequested(changed, self._settings(first_run=False)))
        if not changed and current and self.fp != old_fp and self.lifecycle.phase in UP_PHASES:
            # The engine runs on, unchanged: it is the last good one of the new ladder too (else a
            # restart of the supervisor would forget it), and /metrics names the new fingerprint.
            self.store.mark_serving(self.fp, current, time.time(),
                                    below_best=current != config.profile_names[0])
            self._below_best_since = self.store.fingerprint_state(self.fp).below_best_since
            self._publish_active(current)
        if probe_changed and not changed:
            if self._monitor is not None:
                self._renew_monitor()
            elif self._ready_monitor is not None:
                self._renew_monitor_at_ready = True

    def _refuse_reload(self, reason: str, kind: str, **fields: Any) -> None:
        """Keep everything as it runs, and say why where operators look: the journal, STATUS=
        (`systemctl status`), /status and a metric."""
        log.error("supervisor.reload_failed", reason=reason, kind=kind,
                  kept_profile=self.lifecycle.profile, **fields,
                  hint="the running configuration is unchanged; fix the file and reload again "
                       "(sglang-supervisor check --config FILE shows every problem)")
        self._reload_note = f"reload refused: {reason}"[:200]
        self._last_reload = {"result": "refused", "at": time.time(), "reason": reason}
        self.metrics.reload_result("refused")
        text = self._with_note(self.lifecycle.status_text())
        if self.lifecycle.ready_sent and self.lifecycle.phase in UP_PHASES:
            self.notifier.reloading(text)
            self.notifier.ready(text)
        else:
            self.notifier.status(text)

    def _renew_monitor(self) -> None:
        """New probe settings while serving: replace the throughput monitor (its probe shape,
        interval and baseline key come from them), keeping what remediation learned."""
        old = self._monitor
        profile = self.lifecycle.profile
        if old is None or profile is None or self.lifecycle.phase not in UP_PHASES:
            return
        if self._monitor_task is not None:
            self._monitor_task.cancel()
            self._monitor_task = None
        self._remediation = old.remediation
        old.stop()
        self._spawn_task(old.aclose)
        self._monitor = self._new_monitor(profile)
        if self.config.probe.enabled:
            self._monitor_task = asyncio.ensure_future(self._monitor.run())
            self._supervise(self._monitor_task)

    def _reload_version(self, config: Config) -> str:
        if config.engine.version == self.config.engine.version and config.engine.command == (
                self.config.engine.command):
            return self.prep.version
        return detect_engine_version(config)


async def run_supervisor(prepared: Prepared, options: Options, notifier: Notifier | None = None
                         ) -> int:
    sup = Supervisor(prepared, options, notifier)
    return await sup.run()
