"""The multi-node group's shell: the leader's link server and a worker node's supervisor.

Decisions are group.py's (pure); this module carries them out with HTTP, processes and sd_notify.

Leader (node 0): the ordinary Supervisor plus `LeaderLink`, a small HTTP server on `group.link`:
`GET /group` publishes the generation (the lifecycle's attempt), the profile and the engine's
state; `POST /group/report` takes a worker node's state (bounded, parsed as untrusted input). Every
message both ways is authenticated with the group's secret (core/linkauth.py): a request without a
valid, fresh MAC is refused before its body is parsed, counted by reason and logged at most once a
minute per reason; an unauthenticated caller learns nothing of the group. A worker's failure
becomes an `EngineFailed` line of the leader's engine and the leader's engine is killed at once,
so the existing lifecycle classifies, marks the profile and relaunches the group.

Worker (node R > 0): `WorkerNode` runs instead of the Supervisor. It never reads its engine's
`/health` (SGLang's dummy server answers 200 whatever the ranks do): its engine is serving when the
launcher printed the dummy server line after every local capture ended, and failed when the
launcher exits or one of its scheduler processes is gone.

Long because: both ends of one wire protocol (its bounds, parsing and authentication) live in one
file, LeaderLink serving what WorkerNode posts and reads, so the wire's two sides change together;
the messages and every decision are core/group.py's, the MACs core/linkauth.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from sglang_supervisor.core.address import parse_address
from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.core.config import Config
from sglang_supervisor.core.events import (
    CaptureEnded,
    EngineEvent,
    EngineFailed,
    FailureClass,
    PrefillGraphDisabled,
)
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.failures import classify_failure
from sglang_supervisor.core.group import (
    MAX_REPORT_BYTES,
    MAX_VIEW_BYTES,
    ExitGroup,
    Follow,
    GroupSettings,
    LeaderBook,
    MemberFailed,
    MessageError,
    NodeState,
    Report,
    StopLocal,
    View,
    node_rank_labels,
    parse_report,
    parse_view,
    worker_decide,
)
from sglang_supervisor.core.linkauth import (
    AUTH_HEADER,
    AuthError,
    LogGate,
    RejectReason,
    ReplayGuard,
    Stamp,
    sign,
    verify,
)
from sglang_supervisor.core.logwatch import LineSplitter, LogParser
from sglang_supervisor.core.profiles import default_secret_config_path
from sglang_supervisor.core.readiness import CaptureKey, without_prefill
from sglang_supervisor.engine import patterns as P
from sglang_supervisor.shell.asgiserver import InLoopServer, listening_socket
from sglang_supervisor.shell.engineproc.apikey import remove_secret_config, write_secret_config
from sglang_supervisor.shell.engineproc.enginelog import EngineLogPump, RotatingByteLog
from sglang_supervisor.shell.engineproc.jitcache import engine_cache_env, gpu_models, torch_version
from sglang_supervisor.shell.engineproc.preflight import gpu_indices
from sglang_supervisor.shell.engineproc.process import EngineProcess
from sglang_supervisor.shell.telemetry.logsetup import EngineLine, log_engine_lines
from sglang_supervisor.shell.telemetry.notify import Notifier

log = structlog.get_logger("sglang_supervisor")

# A worker's failure while serving: the leader's engine is SIGKILLed with no drain (its ranks sit
# in a collective that will not complete; SIGTERM would wait for SGLang's 60 s core-dump pause).
MEMBER_FAILED_DRAIN_S = 0.0


def local_capture_keys(keys: Iterable[CaptureKey], settings: GroupSettings, tp_size: int
                       ) -> frozenset[CaptureKey]:
    """The captures this node's ranks log (SGLang's TP ranks are global across the nodes)."""
    labels = node_rank_labels(tp_size, settings.nnodes, settings.node_rank)
    return frozenset(k for k in keys if k[2] in labels)


# ---- the leader ---------------------------------------------------------------------------------

REPORT_PATH = "/group/report"
VIEW_PATH = "/group"
REJECT_LOG_INTERVAL_S = 60.0  # one log line per reason per minute, however many packets
_REJECT_STATUS = {RejectReason.MALFORMED: 400, RejectReason.OVERLOADED: 429}


def stamp_now(node: int) -> Stamp:
    """This node's stamp for a message it sends now: the wall clock (the nodes' clocks are compared,
    not their monotonic ones) and a fresh random nonce."""
    return Stamp(node, int(time.time() * 1000), secrets.token_hex(16))


class LeaderLink:
    """`GET /group`, `POST /group/report` on `group.link`, authenticated with the group's secret."""

    def __init__(self, settings: GroupSettings, secret: bytes, *, view: Callable[[], View],
                 engine_running: Callable[[], bool], on_failure: Callable[[MemberFailed], None],
                 on_progress: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._secret = secret
        self._clock = clock
        self.replay = ReplayGuard()
        self.rejections: dict[RejectReason, int] = dict.fromkeys(RejectReason, 0)
        self._gates = {r: LogGate(REJECT_LOG_INTERVAL_S) for r in RejectReason}
        self._on_progress = on_progress
        self._progress: dict[int, tuple[int | None, str, int]] = {}
        self.book = LeaderBook(settings.nnodes)
        self._view = view
        self._engine_running = engine_running
        self._on_failure = on_failure
        self._server = InLoopServer("group-link", graceful_shutdown_s=1, stop_wait_s=3.0)

    @property
    def rejected(self) -> int:
        """Every message the link refused, whatever the reason."""
        return sum(self.rejections.values())

    def _refuse(self, request: Request, exc: AuthError) -> Response:
        """Count, log (rate-limited) and answer a refused message: the reason's word only."""
        self.rejections[exc.reason] += 1
        now = self._clock()
        due, held = self._gates[exc.reason].admit(now)
        if due:
            log.warning("group.link_rejected", reason=exc.reason.value, detail=str(exc),
                        client=request.client.host if request.client else None,
                        held_back=held, total=self.rejections[exc.reason],
                        hint="a node with another group secret, a clock off by more than 30 s, "
                             "or a hostile caller of group.link; at most one line a minute per reason")
        status = _REJECT_STATUS.get(exc.reason, 401)
        return PlainTextResponse(f"refused: {exc.reason.value}\n", status_code=status)

    def _authenticate(self, request: Request, purpose: Literal["report", "get"], path: str,
                      body: bytes) -> Stamp:
        stamp = verify(self._secret, request.headers.get(AUTH_HEADER), purpose, method=request.method,
                       path=path, body=body)
        lo = 1 if purpose == "report" else 0
        if not lo <= stamp.node < self.settings.nnodes:
            raise AuthError(RejectReason.WRONG_NODE, f"node {stamp.node} is no sender of a {purpose}")
        self.replay.admit(stamp, self._clock())
        return stamp

    def _signed_view(self, request: Request, path: str, answered: Stamp) -> Response:
        body = self._view().to_json()
        header = sign(self._secret, "view", method=request.method, path=path, stamp=stamp_now(0),
                      body=body, bound=answered.nonce)
        return Response(body, media_type="application/json", headers={AUTH_HEADER: header})

    def app(self) -> Starlette:
        async def get_view(request: Request) -> Response:
            # Only the group's members see it: the instance ids it holds are what a forged
            # report would need.
            try:
                stamp = self._authenticate(request, "get", VIEW_PATH, b"")
            except AuthError as exc:
                return self._refuse(request, exc)
            return self._signed_view(request, VIEW_PATH, stamp)

        async def post_report(request: Request) -> Response:
            if request.headers.get(AUTH_HEADER) is None:  # refused before its body is read
                return self._refuse(request, AuthError(RejectReason.UNAUTHENTICATED,
                                                       "no X-Group-Auth header"))
            body = b""
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_REPORT_BYTES:
                    return self._refuse(request, AuthError(
                        RejectReason.MALFORMED, f"a report of more than {MAX_REPORT_BYTES} bytes"))
            try:
                stamp = self._authenticate(request, "report", REPORT_PATH, body)
                try:
                    report = parse_report(body, self.settings.nnodes)
                except MessageError as exc:
                    raise AuthError(RejectReason.MALFORMED, f"bad report: {exc}") from None
                if report.node_rank != stamp.node:
                    raise AuthError(RejectReason.WRONG_NODE, f"node {stamp.node} reported for node "
                                    f"{report.node_rank}")
            except AuthError as exc:
                return self._refuse(request, exc)
            failure = self.book.on_report(report, self._engine_running())
            if failure is not None:
                self._on_failure(failure)
            elif report.generation == self.book.generation:
                # A worker node's start-up moving (state or captures) is the group's log moving:
                # the leader's stall timer must not blame its own quiet engine for it.
                mark = (report.generation, report.state, report.captures_ended)
                if self._progress.get(report.node_rank) != mark:
                    self._progress[report.node_rank] = mark
                    self._on_progress()
            return self._signed_view(request, REPORT_PATH, stamp)

        return Starlette(routes=[Route(VIEW_PATH, get_view),
                                 Route(REPORT_PATH, post_report, methods=["POST"])])

    async def start(self) -> None:
        host, port = parse_address(self.settings.link)
        try:
            sock = listening_socket(host, port, 64)
        except OSError as exc:
            raise OSError(f"cannot listen on group.link {self.settings.link}: {exc.strerror or exc}; "
                          "set group.link to a free HOST:PORT of this node") from None
        await self._server.start(self.app(), sock,
                                 lambda failure: OSError(f"group link failed to start: {failure!r}"))
        log.info("group.link_listening", link=self.settings.link, nnodes=self.settings.nnodes,
                 restart=self.settings.restart)

    async def stop(self) -> None:
        await self._server.stop()

    async def wait_members(self, generation: int, seconds: float, current: Callable[[], bool]) -> bool:
        """Until every worker node serves this generation (its captures ended): True; False after
        `seconds` or when the generation is over."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and current():
            if self.book.generation == generation and self.book.all_serving():
                return True
            await asyncio.sleep(0.1)
        return False


class GroupCollector(Collector):
    """The leader's view of its group for Prometheus, read from the link's book at scrape time:
    which generation runs, how many nodes it has, which worker nodes serve it, and how many reports
    were refused (a misbehaving or hostile caller of the link)."""

    def __init__(self, link: LeaderLink) -> None:
        self._link = link

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        book = self._link.book
        yield GaugeMetricFamily("sglang_supervisor_group_generation",
                                "the group's current generation (one per group start)",
                                value=book.generation)
        yield GaugeMetricFamily("sglang_supervisor_group_nodes", "nodes in the group (group.nnodes)",
                                value=book.nnodes)
        serving = GaugeMetricFamily("sglang_supervisor_group_node_serving",
                                    "1 while a worker node reports its engine serving this generation",
                                    labels=["node_rank"])
        for rank in range(1, book.nnodes):
            serving.add_metric([str(rank)], 1.0 if rank in book.serving else 0.0)
        yield serving
        yield GaugeMetricFamily("sglang_supervisor_group_failed",
                                "1 once this generation failed on any node", value=int(book.failed))
        yield GaugeMetricFamily("sglang_supervisor_group_rejected_reports",
                                "messages to the group link that were refused, any reason",
                                value=self._link.rejected)
        refused = CounterMetricFamily(
            "sglang_supervisor_group_link_rejected",
            "messages to the group link refused by reason (unauthenticated, forged, stale, replayed, "
            "wrong_node, overloaded, malformed)", labels=["reason"])
        for reason, count in self._link.rejections.items():
            refused.add_metric([reason.value], float(count))
        yield refused


def member_failure_line(f: MemberFailed) -> EngineFailed:
    """A worker node's failure as a failure line of the group's engine (for the lifecycle)."""
    return EngineFailed(line_no=0, rank=f"node{f.node_rank}", failure=f.failure_class,
                        message=f"node {f.node_rank}: {f.message}"[:400], node=f.node_rank)


# ---- a worker node -------------------------------------------------------------------------------

class _NodeParser:
    """SGLang's parser plus the worker launcher's dummy-server line (this node's ranks are up)."""

    def __init__(self, inner: LogParser) -> None:
        self.inner = inner
        self.dummy_seen = False

    def feed_line(self, line: str) -> list[EngineEvent]:
        if P.WORKER_READY.match(line):
            self.dummy_seen = True
        return self.inner.feed_line(line)

    def finish(self) -> list[EngineEvent]:
        return self.inner.finish()


@dataclass
class _LocalEngine:
    generation: int
    profile: str
    proc: EngineProcess
    pump: EngineLogPump
    parser: _NodeParser
    expected: frozenset[CaptureKey]
    ended: set[CaptureKey] = field(default_factory=set)
    failures: list[EngineFailed] = field(default_factory=list)
    max_ranks: int = 0
    failed: FailureClass | None = None
    message: str = ""
    stopping: bool = False


class WorkerNode:
    """A worker node's supervisor: follows the leader's generation and profile."""

    def __init__(self, config: Config, version: str, *, renders: dict[str, Any], api_key: str | None,
                 secret: bytes, environ: dict[str, str],
                 capture_keys: Callable[[Sequence[str]], frozenset[CaptureKey]],
                 tp_size: Callable[[Sequence[str]], int], notifier: Notifier | None = None) -> None:
        assert config.group is not None
        self.config = config
        self.settings: GroupSettings = config.group
        self.version = version
        self.renders = renders
        self.api_key = api_key
        self.environ = environ
        self.notifier = notifier or Notifier(environ)
        self._capture_keys, self._tp_size = capture_keys, tp_size
        self.instance = secrets.token_hex(8)
        self._secret = secret
        self._refused_gate = LogGate(REJECT_LOG_INTERVAL_S)  # the leader's refusals, rate-limited
        self._forged_gate = LogGate(REJECT_LOG_INTERVAL_S)  # answers without the leader's MAC
        self.engine: _LocalEngine | None = None
        self.last_generation: int | None = None  # the generation our last engine ran
        self._stop = asyncio.Event()
        self._cache_pruned = False  # old kernel-cache keys pruned at the first engine start

    # -- engine ---------------------------------------------------------------------------------

    def _cache_env(self, overlay: Mapping[str, str], engine_python: str) -> dict[str, str]:
        """The kernel-cache variables, as the leader's runner sets them (shell/engineproc/jitcache.py);
        old keys pruned at this node's first engine start."""
        cfg = self.config.engine
        key_dir, env = engine_cache_env(
            self.environ, overlay, configured=cfg.cache_dir, max_gb=cfg.cache_max_gb,
            version=self.version, gpus=gpu_models(gpu_indices({**self.environ, **cfg.env})),
            torch=torch_version(engine_python), prune_now=not self._cache_pruned)
        if key_dir is not None and not self._cache_pruned:
            log.info("engine.cache_placed", dir=key_dir, set=sorted(env))
        self._cache_pruned = True
        return env

    def _start(self, gen: int, profile: str) -> None:
        rc = self.renders.get(profile)
        if rc is None:
            log.error("group.unknown_profile", profile=profile,
                      hint="every node needs the same profiles as the leader")
            return
        loop = asyncio.get_running_loop()
        if rc.secret_config:  # the command names the 0600 --config file holding the API key
            try:
                write_secret_config(default_secret_config_path(self.config, os.environ), rc.secret_config)
            except OSError as exc:
                log.error("group.secret_config", error=exc.strerror or str(exc))
                return
        env = engine_env(self.environ, {**self._cache_env(rc.env, rc.argv[0]), **rc.env})
        try:
            proc = EngineProcess.spawn(rc.argv, env)
        except OSError as exc:
            log.error("group.engine_spawn_failed", command=rc.argv[0], error=exc.strerror or str(exc))
            self.last_generation = gen
            self._failed_report = Report(self.settings.node_rank, self.instance, gen, "failed",
                                         FailureClass.OTHER, f"cannot start {rc.argv[0]}")
            return
        ecfg = self.config.engine
        secrets_ = [self.api_key] if self.api_key else []
        parser = _NodeParser(LogParser(self.version, secrets_))
        keys = local_capture_keys(self._capture_keys(rc.argv), self.settings, self._tp_size(rc.argv))

        def forward(lines: Sequence[EngineLine]) -> None:
            log_engine_lines(lines, max_priority=6)

        eng_box: list[_LocalEngine] = []
        pump = EngineLogPump(
            proc.stderr_fd, loop=loop,
            log=RotatingByteLog(ecfg.log_file, ecfg.log_max_bytes, ecfg.log_backups),
            splitter=LineSplitter(), parser=parser,
            echo_fd=proc.stdout_fd, echo_splitter=LineSplitter(),  # request records: never parsed
            on_output=lambda events: self._on_output(eng_box[0], events) if eng_box else None,
            on_eof=lambda: None, secrets=secrets_,
            forward_batch=forward if self.config.logging.forward_engine_output else None,
            name=f"engine-log-g{gen}")
        eng = _LocalEngine(gen, profile, proc, pump, parser, keys)
        eng_box.append(eng)
        pump.start()
        self.engine = eng
        self.last_generation = gen
        log.info("group.engine_start", generation=gen, profile=profile, node_rank=self.settings.node_rank,
                 pid=proc.pid)

    def _on_output(self, eng: _LocalEngine, events: list[EngineEvent]) -> None:
        for ev in events:
            if isinstance(ev, CaptureEnded):
                eng.ended.add((ev.owner, ev.phase, ev.rank))
            elif isinstance(ev, PrefillGraphDisabled):
                # As the leader's lifecycle does: the engine decided against prefill graphs on
                # that rank (or on every rank, unprefixed): do not wait for them.
                eng.expected = frozenset(without_prefill(eng.expected, ev.rank))
            elif isinstance(ev, EngineFailed):
                eng.failures.append(ev)

    def _check(self, eng: _LocalEngine) -> None:
        """Judge the engine by its processes: the launcher gone, or a scheduler of ours gone."""
        if eng.failed is not None or eng.stopping:
            return
        rc = eng.proc.returncode
        ranks = sum(1 for m in eng.proc.group_members() if m.name.startswith(P.SCHEDULER_COMM_PREFIX))
        eng.max_ranks = max(eng.max_ranks, ranks)
        if rc is not None:
            eng.failed = classify_failure(rc, eng.failures, after_ready=self.serving(eng))
            eng.message = f"engine exited with {rc}"
        elif eng.max_ranks and ranks < eng.max_ranks:
            eng.failed = (classify_failure(None, eng.failures) if eng.failures
                          else FailureClass.CHILD_CRASHED)
            eng.message = f"{eng.max_ranks - ranks} scheduler process(es) of this node died"
        if eng.failed is not None:
            log.error("group.engine_failed", generation=eng.generation, profile=eng.profile,
                      failure_class=eng.failed.value, message=eng.message)

    def serving(self, eng: _LocalEngine) -> bool:
        return eng.parser.dummy_seen and eng.ended >= eng.expected

    async def _stop_engine(self, reason: str) -> None:
        eng = self.engine
        if eng is None:
            return
        eng.stopping = True
        t = self.config.timeouts
        result = await eng.proc.stop(min(t.drain_s, 2.0), t.kill_s)
        log.info("group.engine_stopped", generation=eng.generation, reason=reason,
                 returncode=result.returncode, seconds=round(result.seconds, 2))
        self.engine = None

    def _report(self) -> Report:
        eng = self.engine
        if eng is None:
            return Report(self.settings.node_rank, self.instance, None, "idle")
        state: NodeState = ("failed" if eng.failed is not None
                            else "serving" if self.serving(eng) else "starting")
        return Report(self.settings.node_rank, self.instance, eng.generation, state, eng.failed,
                      eng.message, len(eng.ended & eng.expected), len(eng.expected))

    # -- main loop --------------------------------------------------------------------------------

    async def run(self) -> int:
        """Long because: the worker node's one loop: signal handlers installed around it and removed in
        its finally, the watchdog, the exchange with the leader, the pure decision
        (group.worker_decide) and its execution; the view, the last answer's time and the engine it
        started are carried across iterations and seen by the finally clause.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        # systemctl reload: the group's profile is the leader's; reload the leader instead.
        loop.add_signal_handler(signal.SIGHUP, lambda: log.warning(
            "group.reload_ignored", hint="a worker node follows its leader: reload the leader"))
        watchdog_s = self.notifier.watchdog_interval()
        last_watchdog = 0.0
        host, port = parse_address(self.settings.link)
        base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        last_ok = time.monotonic()
        view: View | None = None
        code = int(ExitCode.OK)
        log.info("group.worker_start", node_rank=self.settings.node_rank, link=self.settings.link,
                 instance=self.instance, restart=self.settings.restart)
        # READY=1 means "this node follows its leader": the group's readiness is the leader's
        # (a worker unit waiting for the whole group would hit systemd's start timeout).
        self.notifier.ready(f"node {self.settings.node_rank}: following the leader at {self.settings.link}")
        async with httpx.AsyncClient(timeout=httpx.Timeout(2.0)) as client:
            try:
                while not self._stop.is_set():
                    if watchdog_s is not None and time.monotonic() - last_watchdog >= watchdog_s:
                        last_watchdog = time.monotonic()
                        self.notifier.watchdog()  # WatchdogSec= in the units: the loop is alive
                    if self.engine is not None:
                        self._check(self.engine)
                    fresh = await self._exchange(client, base)
                    if fresh is not None:
                        view, last_ok = fresh, time.monotonic()
                    eng = self.engine
                    action = worker_decide(
                        view if fresh is not None else None, silent_s=time.monotonic() - last_ok,
                        leader_timeout_s=self.settings.leader_timeout_s, instance=self.instance,
                        node_rank=self.settings.node_rank,
                        running_generation=eng.generation if eng else self.last_generation,
                        engine_alive=eng is not None and eng.failed is None,
                        engine_failed=eng is not None and eng.failed is not None,
                        restart=self.settings.restart)
                    if isinstance(action, ExitGroup):
                        log.error("group.exit", reason=action.reason, code=int(ExitCode.GROUP_FAILED))
                        code = int(ExitCode.GROUP_FAILED)
                        break
                    if isinstance(action, StopLocal):
                        log.warning("group.engine_stop", reason=action.reason)
                        await self._stop_engine(action.reason)
                    elif isinstance(action, Follow):
                        if self.engine is not None:
                            await self._stop_engine("a new generation")
                        self._start(action.generation, action.profile)
                    eng = self.engine
                    if eng is not None and eng.failed is not None and eng.proc.returncode is None:
                        await self._stop_engine(f"this node failed: {eng.failed.value}")
                        # keep reporting the failure of that generation until the leader moves on
                        self.engine = None
                        self._failed_report = Report(self.settings.node_rank, self.instance,
                                                     eng.generation, "failed", eng.failed, eng.message)
                    self._notify_status()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), self.settings.poll_interval_s)
            finally:
                self.notifier.stopping("stopping")
                await self._stop_engine("supervisor stopping")
                with contextlib.suppress(OSError):
                    remove_secret_config(default_secret_config_path(self.config, os.environ))
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
        return code

    _failed_report: Report | None = None
    _last_status = ""

    def _notify_status(self) -> None:
        eng = self.engine
        r = self._report()
        text = (f"node {self.settings.node_rank}: {r.state}" + (
            f" generation {eng.generation} profile={eng.profile} captures {r.captures_ended}/"
            f"{r.captures_expected}" if eng is not None else ""))
        if text != self._last_status:
            self._last_status = text
            self.notifier.status(text)

    async def _exchange(self, client: httpx.AsyncClient, base: str) -> View | None:
        """Report our state, read the leader's view from the answer (None: no usable answer)."""
        report = self._report()
        if report.state == "idle" and self._failed_report is not None:
            report = self._failed_report
        payload = report.to_json()
        stamp = stamp_now(self.settings.node_rank)
        header = sign(self._secret, "report", method="POST", path=REPORT_PATH, stamp=stamp, body=payload)
        try:
            async with client.stream("POST", base + REPORT_PATH, content=payload,
                                     headers={"content-type": "application/json",
                                              AUTH_HEADER: header}) as resp:
                body = b""
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_VIEW_BYTES:
                        raise MessageError("view too large")
                if resp.status_code != 200:
                    due, held = self._refused_gate.admit(time.monotonic())
                    if due:
                        log.warning("group.leader_refused", status=resp.status_code, held_back=held,
                                    body=body[:200].decode("utf-8", "replace"),
                                    hint="the same group secret file on every node, clocks within "
                                         "30 s (NTP)")
                    return None
                # Only a view the leader made for this very report: a replayed or forged answer
                # is no answer (the leader then looks silent, and silence is bounded).
                leader = verify(self._secret, resp.headers.get(AUTH_HEADER), "view", method="POST",
                                path=REPORT_PATH, body=body, bound=stamp.nonce)
                if leader.node != 0:
                    raise AuthError(RejectReason.WRONG_NODE, f"a view signed as node {leader.node}")
            view = parse_view(body)
        except AuthError as exc:
            due, held = self._forged_gate.admit(time.monotonic())
            if due:
                log.warning("group.view_rejected", reason=exc.reason.value, detail=str(exc),
                            held_back=held, link=self.settings.link)
            return None
        except (httpx.HTTPError, MessageError, OSError) as exc:
            log.debug("group.leader_unreachable", error=str(exc) or type(exc).__name__)
            return None
        if self._failed_report is not None and view.generation != self._failed_report.generation:
            self._failed_report = None
        return view
