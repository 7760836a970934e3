"""The engine runner: launch (after the GPU is released), spawn, pump its log, watch its exit and
its family, stop it. One engine at a time; every fact goes to the lifecycle as an `Input` through
the `feed` it is given. It takes the served configuration (`Current`) and the parts it tells
(`RunnerParts`: the serving checks and the gateway as small Protocols), never the Supervisor.

Threads: only the log pump reads the engine's pipe (its own thread). The engine is spawned from
the loop's thread, which lives as long as the supervisor (PDEATHSIG is per thread).

Long because: one engine's life, spawn to reaped, in one place; the waits for a busy GPU or port
belong to it (they decide when the next spawn may happen).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from sglang_supervisor.core.actions import Launch, WaitTemporary
from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.core.config import ConfigError
from sglang_supervisor.core.derive import Derivation
from sglang_supervisor.core.events import CaptureEnded, DecodeStats, EngineEvent
from sglang_supervisor.core.group import MemberFailed
from sglang_supervisor.core.inputs import (
    EngineExited,
    GpuBusy,
    Input,
    Launched,
    LaunchFailed,
    TemporaryCleared,
)
from sglang_supervisor.core.jitcache import CACHE_VAR_NAMES
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.liveness import (
    TEMPORARY_POLL_S,
    start_extension,
    stop_drain_s,
    temporary_extension,
)
from sglang_supervisor.core.logstats import fold_stats
from sglang_supervisor.core.logwatch import LineSplitter, LogParser
from sglang_supervisor.core.phases import UP_PHASES, Phase
from sglang_supervisor.core.profiles import (
    RenderedCommand,
    default_secret_config_path,
    render,
    with_derived,
)
from sglang_supervisor.engine.argv import tp_size
from sglang_supervisor.engine.sglang import clean_exit_codes
from sglang_supervisor.shell.current import Current
from sglang_supervisor.shell.engineproc.apikey import remove_secret_config, write_secret_config
from sglang_supervisor.shell.engineproc.enginelog import EngineLogPump, LogWriteState, RotatingByteLog
from sglang_supervisor.shell.engineproc.jitcache import engine_cache_env, gpu_models, torch_version
from sglang_supervisor.shell.engineproc.preflight import capture_keys, gpu_indices, port_taken
from sglang_supervisor.shell.engineproc.process import EngineProcess, venv_bin_dir
from sglang_supervisor.shell.links.grouplink import MEMBER_FAILED_DRAIN_S, LeaderLink, local_capture_keys
from sglang_supervisor.shell.telemetry import gpu
from sglang_supervisor.shell.telemetry.logsetup import (
    EngineLine,
    background_logging,
    log_engine_lines,
    log_engine_lines_nowait,
)
from sglang_supervisor.shell.telemetry.metrics import SupervisorMetrics
from sglang_supervisor.shell.telemetry.notify import Notifier

log = structlog.get_logger("sglang_supervisor")

# After the leader exits, give the pipe this long to deliver the last lines (and the parser's
# closing events) before the exit is reported: classification needs them.
EOF_GRACE_S = 3.0
# Foreign processes holding less than this on our GPUs do not block a start (monitoring agents).
FOREIGN_BYTES_BLOCKING = 1 << 30
# How often the engine's family is walked for processes that left its session (setsid).
ESCAPE_SCAN_S = 2.0


@dataclass
class Engine:
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


class Probes(Protocol):
    """The serving checks (checks/serving.py), as far as the engine's life concerns them."""

    def decode_stats(self, ev: DecodeStats) -> None: ...  # a decode log line, for the monitor
    def quiet_probes(self) -> None: ...  # our stop is about to break their connections
    def stop_tasks(self) -> None: ...  # the engine is gone


class Gateway(Protocol):
    """The engine's presence towards the gateway and /readyz (links/presence.py)."""

    def engine_crashed(self) -> None: ...
    async def before_stop(self, reason: str) -> None: ...


@dataclass(frozen=True)
class RunnerParts:
    """What the runner reads and tells, wired in supervisor.py."""

    lifecycle: Lifecycle  # read: the attempt, the phase, the wait in progress
    notifier: Notifier  # systemd's start deadline
    metrics: SupervisorMetrics
    probes: Probes
    gateway: Gateway
    group: LeaderLink | None  # node 0's link: the workers' captures come through it
    note_output: Callable[[float], None]  # the stall timer's clock (timers.py)
    feed: Callable[[Input], None]  # facts, to the lifecycle
    spawn: Callable[[Callable[[], Any]], None]  # a task of ours (its errors to the TaskGuard)
    supervise: Callable[[asyncio.Future[Any]], object]  # a running task's errors to the TaskGuard


class EngineRunner:
    def __init__(self, current: Current, parts: RunnerParts, *, environ: Mapping[str, str],
                 forward_max_priority: int) -> None:
        """`environ`: the supervisor's environment (the engine's base); `forward_max_priority`:
        engine lines at this syslog priority or more urgent go to the journal."""
        self.current, self.parts, self.lifecycle = current, parts, parts.lifecycle
        self.feed = parts.feed
        self.environ, self.forward_max_priority = environ, forward_max_priority
        self.engine: Engine | None = None
        self.launching: asyncio.Task[None] | None = None
        self.last_pids: set[int] = set()  # the previous engine's processes (leader + children)
        # GPU memory in use on our GPUs before our first engine: a relaunch waits until usage is
        # back to it (the schedulers' PIDs are gone by then, their memory not always).
        self.gpu_baseline: int | None = None
        # Whether NVML listed the serving engine's PIDs (no PID namespace between us and it).
        self.nvml_lists_ours = False
        self.started_once = False
        self.capture_seconds: dict[str, float] = {}
        self.last_extend = 0.0
        # A spell of failed engine log writes, across engines: (began, bytes dropped so far).
        self.log_spell: tuple[float, int] | None = None
        self.derived: dict[str, Derivation] = {}  # derived profiles launched in this run
        self.cache_key_dir: str | None = None  # the kernel caches' key directory in use
        self.cache_pruned_for: tuple[str | None, str, list[tuple[str, str | None]]] | None = None

    # -- launching ------------------------------------------------------------------------------

    def gpu_set(self) -> set[int] | None:
        return gpu_indices({**self.environ, **self.current.config.engine.env})

    def foreign(self) -> str | None:
        foreign = [f for f in gpu.foreign_processes(self.last_pids, self.gpu_set())
                   if (f.used_bytes or 0) >= FOREIGN_BYTES_BLOCKING]
        if not foreign:
            return None
        return ", ".join(f"pid {f.pid} ({f.command or '?'}) holds {(f.used_bytes or 0) >> 20} MiB "
                         f"on GPU{f.gpu_index}" for f in foreign)

    def note_ready(self) -> None:
        """At READY the engine holds its GPU memory, so whether NVML lists its PIDs now says
        whether a relaunch may take their absence for a release (gpu.release_target)."""
        if self.engine is None:
            return
        self.engine.note_pids()
        self.nvml_lists_ours = gpu.lists_any(gpu.snapshot(),
                                             self.engine.pids | {self.engine.proc.pid})

    def start_launch(self, a: Launch) -> None:
        if a.derived is not None:
            self.derived[a.profile] = a.derived
        self.launching = asyncio.ensure_future(self.launch(a))
        self.parts.supervise(self.launching)

    async def launch(self, a: Launch) -> None:
        try:
            if self.started_once:
                target = gpu.release_target(gpu.snapshot(), self.last_pids, self.gpu_baseline,
                                            self.nvml_lists_ours)
                released = await gpu.wait_for_release(target, self.current.config.timeouts.gpu_release_s,
                                                      gpu_indices=self.gpu_set())
                if released is False:
                    foreign = self.foreign()
                    log.warning("gpu.not_released", pids=len(self.last_pids), foreign=foreign)
                    if foreign:
                        self.feed(GpuBusy(foreign))
                        return
            if a.delay_s > 0:
                await asyncio.sleep(a.delay_s)
            cache = await asyncio.to_thread(self.prepare_cache, a.profile)
            self.spawn(a, cache)
        except asyncio.CancelledError:
            return
        finally:
            if self.launching is asyncio.current_task():
                self.launching = None

    async def wait_temporary(self, a: WaitTemporary) -> None:
        """Check the condition the lifecycle waits for until it clears (its timer bounds us)."""
        await asyncio.sleep(a.delay_s)
        extended = float("-inf")
        while self.lifecycle.wait_seq == a.seq:
            if a.what == "port":
                busy = port_taken(self.current.config.engine.host, self.current.config.engine.port)
            else:
                busy = await asyncio.to_thread(self.foreign)
            if busy is None:
                self.feed(TemporaryCleared(a.seq))
                return
            now = time.monotonic()
            # Still starting: systemd's start timeout must not end the wait.
            extend = temporary_extension(ready_sent=self.lifecycle.ready_sent, now=now,
                                         last_extend=extended)
            if extend is not None:
                extended = now
                self.parts.notifier.extend_timeout(extend)
            await asyncio.sleep(TEMPORARY_POLL_S)

    def render(self, profile: str) -> RenderedCommand:
        rc = self.current.prep.renders.get(profile)
        if rc is None:  # a derived profile, or one added by a reload, is rendered on the spot
            d = self.derived.get(profile)
            config = with_derived(self.current.config, d) if d is not None else self.current.config
            rc = render(config, profile, self.current.prep.version, python=sys.executable,
                        secret_config_path=default_secret_config_path(self.current.config, os.environ),
                        api_key=self.current.prep.api_key)
        return rc

    def prepare_cache(self, profile: str) -> dict[str, str]:
        """The kernel-cache variables for this launch (shell/engineproc/jitcache.py), the key's old
        neighbours pruned once per key and supervisor run. {} outside a CacheDirectory."""
        try:
            rc = self.render(profile)
        except ConfigError:
            return {}  # spawn reports it
        cfg = self.current.config.engine
        gpus = gpu_models(self.gpu_set())
        key_dir, env = engine_cache_env(
            self.environ, rc.env, configured=cfg.cache_dir, max_gb=cfg.cache_max_gb,
            version=self.current.prep.version, gpus=gpus, torch=torch_version(rc.argv[0]),
            prune_now=self.cache_pruned_for != (cfg.cache_dir, self.current.prep.version, gpus))
        if key_dir is not None and key_dir != self.cache_key_dir:
            log.info("engine.cache_placed", dir=key_dir, set=sorted(env),
                     kept=[v for v in CACHE_VAR_NAMES if v not in env])
        self.cache_key_dir = key_dir
        self.cache_pruned_for = (cfg.cache_dir, self.current.prep.version, gpus)
        return env

    def spawn(self, a: Launch, cache: Mapping[str, str] | None = None) -> None:
        try:
            rc = self.render(a.profile)
        except ConfigError as exc:
            self.feed(LaunchFailed(a.attempt, str(exc), config_error=True))
            return
        if rc.errors:
            self.feed(LaunchFailed(a.attempt, "; ".join(p.message for p in rc.errors), True))
            return
        secret_path: str | None = None
        if rc.secret_config:
            secret_path = default_secret_config_path(self.current.config, os.environ)
            try:
                write_secret_config(secret_path, rc.secret_config)
            except OSError as exc:
                self.feed(LaunchFailed(a.attempt, f"cannot write the engine's secret config "
                                      f"{secret_path}: {exc.strerror}", config_error=True))
                return
        # The cache variables name only what neither our environment nor the profile sets.
        env = engine_env(self.environ, {**(cache or {}), **rc.env}, venv_bin_dir(rc.argv[0]))
        if not self.started_once:
            gpus = gpu.snapshot()
            self.gpu_baseline = gpu.total_used(gpus, self.gpu_set()) if gpus else None
        try:
            proc = EngineProcess.spawn(rc.argv, env)
        except OSError as exc:
            self.feed(LaunchFailed(a.attempt, f"cannot start {rc.argv[0]}: {exc.strerror or exc}",
                                  config_error=isinstance(exc, FileNotFoundError | PermissionError)))
            return
        eof = asyncio.Event()
        attempt = a.attempt
        pump = self._pump(proc, attempt, eof)
        pump.start()
        self.started_once = True
        self.engine = Engine(attempt, a.profile, proc, pump, eof, secret_path)
        self.parts.note_output(time.monotonic())
        self.capture_seconds = {}
        keys = capture_keys(rc.argv, self.current.prep.version)
        if self.parts.group is not None and self.current.config.group is not None:
            # The leader expects its own ranks' captures; the workers' come through the link.
            keys = local_capture_keys(keys, self.current.config.group, tp_size(rc.argv))
            self.parts.group.book.new_generation(attempt)
        self.feed(Launched(attempt, proc.pid, keys))
        self.parts.spawn(lambda: self.watch_exit(self.engine_for(attempt)))
        self.parts.spawn(lambda: self.watch_family(self.engine_for(attempt)))

    def _pump(self, proc: EngineProcess, attempt: int, eof: asyncio.Event) -> EngineLogPump:
        """The engine's log pump: SGLang's own log (stderr) parsed, request records (stdout) only
        written; both into the rotating engine log, optionally forwarded to the journal."""
        eng_cfg = self.current.config.engine
        secrets = [self.current.prep.api_key] if self.current.prep.api_key else []
        forward_max = self.forward_max_priority

        def forward(lines: Sequence[EngineLine]) -> None:
            log_engine_lines(lines, max_priority=forward_max)

        def forward_nowait(lines: Sequence[EngineLine]) -> None:
            log_engine_lines_nowait(lines, max_priority=forward_max)

        # The daemon's log sink writes from its own thread through a bounded queue: the reader
        # hands each read's lines to it directly, one thread hop per read instead of two.
        forwarding = self.current.config.logging.forward_engine_output
        inline = forwarding and background_logging()

        return EngineLogPump(
            proc.stderr_fd, loop=self.current.running_loop(),
            log=RotatingByteLog(eng_cfg.log_file, eng_cfg.log_max_bytes, eng_cfg.log_backups,
                                on_state=self.log_state_threadsafe),
            splitter=LineSplitter(), parser=LogParser(self.current.prep.version, secrets, defer_stats=True),
            echo_fd=proc.stdout_fd, echo_splitter=LineSplitter(),  # request records: never parsed
            on_output=lambda events: self.on_output(attempt, events), on_eof=eof.set,
            secrets=secrets,
            forward_batch=forward if forwarding and not inline else None,
            forward_inline=forward_nowait if inline else None,
            wake_fd=proc.exit_fd(),  # the pump's paced reads end when the leader exits
            name=f"engine-log-{attempt}")

    def engine_for(self, attempt: int) -> Engine:
        assert self.engine is not None and self.engine.attempt == attempt
        return self.engine

    # -- the engine's log -------------------------------------------------------------------------

    def on_output(self, attempt: int, events: list[EngineEvent]) -> None:
        if self.engine is None or self.engine.attempt != attempt:
            return  # a previous engine's last words
        now = time.monotonic()
        self.parts.note_output(now)
        phase = self.lifecycle.phase
        # Keep systemd's start (or reload) deadline ahead of us while the log moves; once the
        # log stalls this stops and our own stall timer decides first.
        t = self.current.config.timeouts
        extend = start_extension(starting=phase not in UP_PHASES and phase != Phase.STOPPING,
                                 now=now, last_extend=self.last_extend, stall_s=t.stall_s,
                                 drain_s=t.drain_s)
        if extend is not None:
            self.last_extend = now
            self.parts.notifier.extend_timeout(extend)
        for ev in fold_stats(events):  # a paced read's stat lines: the latest figures, not each
            if isinstance(ev, CaptureEnded) and ev.elapsed_s is not None:
                kind = f"{ev.owner}_{ev.phase}"
                self.capture_seconds[kind] = max(self.capture_seconds.get(kind, 0.0), ev.elapsed_s)
                self.parts.metrics.capture_seconds(kind, self.capture_seconds[kind])
            if isinstance(ev, DecodeStats):
                self.parts.probes.decode_stats(ev)
            self.feed(ev)

    def log_state_threadsafe(self, st: LogWriteState) -> None:
        """From the pump's thread: never log or block there (journald may be what is stuck)."""
        loop = self.current.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: we are exiting
                loop.call_soon_threadsafe(self.on_log_state, st)

    def on_log_state(self, st: LogWriteState) -> None:
        """A full disk under the engine log is an event (once per spell, and its end) and a
        metric: the engine runs on, its lines still go to the journal."""
        metrics = self.parts.metrics
        now = time.monotonic()
        if not st.ok and self.log_spell is None:
            self.log_spell = (now, st.dropped_bytes)
            metrics.engine_log_state(False, st.dropped_bytes, began=True)
            log.error("engine_log.write_failed", path=st.path, error=st.error,
                      hint=f"free space under {os.path.dirname(st.path) or '.'}: the engine keeps "
                           "running (its lines reach the journal if logging.forward_engine_output "
                           "is on); writing resumes by itself")
            return
        metrics.engine_log_state(st.ok, st.dropped_bytes)
        if self.log_spell is None:
            return
        began, dropped = self.log_spell
        dropped += st.dropped_bytes
        if st.ok:
            self.log_spell = None
            log.info("engine_log.write_recovered", path=st.path, dropped_bytes=dropped,
                     seconds=round(now - began, 3))
        else:
            self.log_spell = (began, dropped)

    # -- watching -------------------------------------------------------------------------------

    async def watch_family(self, eng: Engine) -> None:
        """Warn about engine processes that leave its session (setsid) as soon as they do: the
        group kill would miss them; `EngineProcess.stop` kills them with the engine."""
        while eng.proc.returncode is None and eng.stopping is None:
            for e in await asyncio.to_thread(eng.proc.family.scan):
                log.warning("engine.escaped_process", profile=eng.profile, pid=e.pid, comm=e.name,
                            session=e.session,
                            hint="it left the engine's session (setsid); it is stopped with "
                                 "the engine")
            await asyncio.sleep(ESCAPE_SCAN_S)

    async def watch_exit(self, eng: Engine) -> None:
        rc = await eng.proc.wait()
        if not eng.proc.we_stopped:
            self.parts.gateway.engine_crashed()  # out of the gateway before anything else
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(eng.eof.wait(), EOF_GRACE_S)
        escaped = await asyncio.to_thread(eng.proc.family.escapees, sweep=True)
        if eng.proc.group_members() or escaped:
            # The launcher is gone but part of its group (or a process that left it) lives on,
            # holding GPU memory, its port or the pipe: an engine is all of its processes.
            log.warning("engine.orphans", pids=[m.pid for m in eng.proc.group_members()]
                        + [e.pid for e in escaped])
            result = await eng.proc.stop(0.0, self.current.config.timeouts.kill_s)
            log_escaped(result.escaped)
            log_leftover(result.leftover)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(eng.eof.wait(), EOF_GRACE_S)
        if eng.stopping is not None:
            with contextlib.suppress(Exception):
                await eng.stopping
        self.last_pids = eng.pids | {eng.proc.pid}
        if eng.secret_path:
            remove_secret_config(eng.secret_path)
        if self.engine is eng:
            self.engine = None
        self.parts.probes.stop_tasks()
        clean = rc in clean_exit_codes(self.current.prep.version)
        self.feed(EngineExited(eng.attempt, rc, eng.proc.we_stopped, clean))

    # -- stopping -------------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        eng = self.engine
        if eng is None:
            if self.launching is not None and not self.launching.done():
                # Nothing runs yet (backoff or GPU wait): cancel the launch and report the "exit".
                self.launching.cancel()
                self.launching = None
                self.current.running_loop().call_soon(
                    self.feed, EngineExited(self.lifecycle.attempt, None, True, True))
            return
        eng.proc.we_stopped = True
        self.parts.probes.quiet_probes()
        if eng.stopping is not None and not eng.stopping.done():
            return
        t = self.current.config.timeouts
        drain = stop_drain_s(reason, t.drain_s)
        eng.note_pids()

        async def stop() -> None:
            await self.parts.gateway.before_stop(reason)
            result = await eng.proc.stop(drain, t.kill_s)
            log.info("engine.stopped", profile=eng.profile, reason=reason,
                     returncode=result.returncode, drained=result.drained, killed=result.killed,
                     seconds=result.seconds)
            log_escaped(result.escaped)
            log_leftover(result.leftover)

        eng.stopping = asyncio.ensure_future(stop())
        self.parts.supervise(eng.stopping)

    def stop_for_member(self, f: MemberFailed) -> None:
        """A worker node failed: the leader's ranks wait in a collective that cannot complete."""
        eng = self.engine
        if eng is None or eng.stopping is not None:
            return
        eng.note_pids()
        kill_s = self.current.config.timeouts.kill_s

        async def stop() -> None:
            result = await eng.proc.stop(MEMBER_FAILED_DRAIN_S, kill_s)
            log.info("engine.stopped", profile=eng.profile, reason="group_member_failed",
                     returncode=result.returncode, seconds=result.seconds)

        eng.stopping = asyncio.ensure_future(stop())
        self.parts.supervise(eng.stopping)

    async def shutdown(self) -> None:
        """The supervisor exits: never leave (part of) the engine behind."""
        if self.launching is not None:
            self.launching.cancel()
        eng = self.engine
        if eng is None:
            return
        if eng.stopping is not None and not eng.stopping.done():
            with contextlib.suppress(Exception):
                await eng.stopping  # bounded by drain_s + kill_s
        escaped = await asyncio.to_thread(eng.proc.family.escapees)
        if eng.proc.returncode is None or eng.proc.group_members() or escaped:
            # Exit was decided with (part of) the engine still up, e.g. after an internal
            # error: never leave it behind, children included.
            t = self.current.config.timeouts
            result = await eng.proc.stop(t.drain_s, t.kill_s)
            log_escaped(result.escaped)
            log_leftover(result.leftover)


def log_escaped(escaped: Sequence[Any]) -> None:
    if escaped:
        log.warning("engine.escapees_stopped",
                    processes=", ".join(f"{p.pid}:{p.name}" for p in escaped),
                    hint="engine processes outside its session (setsid) were killed with it")


def log_leftover(leftover: Sequence[Any]) -> None:
    if leftover:
        log.error("engine.leftover_processes",
                  processes=", ".join(f"{p.pid}:{p.name}" for p in leftover),
                  hint="processes of the engine's group survived SIGKILL (uninterruptible "
                       "sleep in the driver?)")
