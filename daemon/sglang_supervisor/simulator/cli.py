"""`sglang-sim`: the simulated launcher (SGLang's main process).

Launch phase: parse flags (exit 2 like argparse), print the early lines, start the rank and
detokenizer children, wait for every rank's `ready` (a rank dying -> exit 1; a rank's SIGQUIT ->
`kill_process_tree` -> -9). SIGTERM has its default action here, as in SGLang before the HTTP
server runs. Running phase: uvicorn on the port (bound only now), warmup request, ready line,
faults on their timers, SIGTERM drain, the SubprocessWatchdog.

Long because: Launcher is SGLang's launcher process through both of its phases (launch: children and
their readiness; running: uvicorn, faults, drain, watchdog); its signal handlers, children and fault
timers are shared by both phases and by the multi-node rendezvous.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import httpx
import uvicorn

from sglang_supervisor.engine.sglang import parse_version
from sglang_supervisor.simulator import args as simargs
from sglang_supervisor.simulator import faults as faultmod
from sglang_supervisor.simulator import (
    misbehave,
    multinode,
    ranks,
    reqlog,
    server,
    serving,
    startup,
    throughput,
    versions,
)
from sglang_supervisor.simulator.outputs import OUTPUT_FAULTS

_WARNING_ENTRY = (
    "{path}/sglang/launch_server.py:71: UserWarning: 'python -m sglang.launch_server' is still supported, "
    "but 'sglang serve' is the recommended entrypoint.\n  Example: sglang serve --model-path <model> "
    "[options]\n  warnings.warn(\n"
)
_UVICORN_FMT = "[%(asctime)s] %(levelprefix)s %(message)s"
LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "default": {
            "()": "uvicorn.logging.DefaultFormatter",
            "fmt": _UVICORN_FMT,
            "datefmt": "%Y-%m-%d %H:%M:%S",
            "use_colors": False,
        },
        "access": {
            "()": "uvicorn.logging.AccessFormatter",
            "fmt": '[%(asctime)s] %(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
            "datefmt": "%Y-%m-%d %H:%M:%S",
            "use_colors": False,
        },
    },
    "handlers": {
        "default": {"formatter": "default", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
        "access": {"formatter": "access", "class": "logging.StreamHandler", "stream": "ext://sys.stdout"},
    },
    "loggers": {
        "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
        "uvicorn.error": {"level": "INFO"},
        "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
    },
}


def help_text(argv: Sequence[str], env: Mapping[str, str]) -> str:
    sim, rest = simargs.parse_sim_options(argv, env)
    spec = versions.resolve(sim.version)
    parser = simargs.build_parser(simargs.catalog_for(spec))
    out = [
        parser.format_help(),
        simargs.sim_parser().format_help().split("\n", 2)[-1],
        faultmod.GRAMMAR_HELP,
        "",
        "Throughput model (pure; /server_info's `sim` key shows the true rates of a running server):",
        "  single-stream tok/s = accept_length / step_s; step_s = 1/base_tps (+ eager launch cost",
        "  per layer) x (1 + 0.15 x draft steps) x (1 + 0.012 x (batch-1)); base_tps from",
        "  --sim-decode-tps or 675 GB/s / (weights GB / tp), capped at 530.",
        f"Emulated SGLang release: {spec.version} (set --sim-version / SGLANG_SIM_VERSION).",
    ]
    model = [rest[i + 1] for i, tok in enumerate(rest[:-1]) if tok == "--model-path"]
    if model:
        with contextlib.suppress(SystemExit, simargs.SimArgsError):
            cfg = simargs.load_config([a for a in argv if a not in ("-h", "--help")], env)
            out.append(f"True rates for this command line: {throughput.describe(cfg.profile)}")
    return "\n".join(out) + "\n"


class Launcher:
    def __init__(self, cfg: simargs.SimConfig, argv: Sequence[str]) -> None:
        self.cfg = cfg
        self.argv = list(argv)  # children re-derive the same config from the same argv
        self.faults = simargs.active_faults(cfg)
        self.scale = cfg.sim.time_scale
        self.log = serving.Log(cfg)
        self.children: list[subprocess.Popen[bytes]] = []
        self.rank_procs: list[subprocess.Popen[bytes]] = []
        # global TP rank of each entry of rank_procs (a node hosts only its share of the ranks)
        self.rank_ids = list(multinode.local_ranks(cfg.tp_size, cfg.nnodes, cfg.node_rank))
        self.peers: list[Any] = []  # multi-node: the open rendezvous connections (collectives)
        self.engine: serving.Engine | None = None
        self.uvicorn: uvicorn.Server | None = None
        self.exit_code: int | None = None
        self._stop = asyncio.Event()
        self._crashing = False
        self._stopping = False  # children exit on purpose during a clean stop
        self._fault_tasks: list[asyncio.Task[None]] = []

    def fault(self, kind: str, stage: str | None = None) -> faultmod.Fault | None:
        return next((f for f in self.faults if f.kind == kind and f.stage == stage), None)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds * self.scale)

    # -- teardown ------------------------------------------------------------------------------

    def kill_children(self) -> None:
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)

    def kill_tree_self(self) -> NoReturn:
        """SGLang's kill_process_tree(include_parent=True): children, then SIGKILL itself (-9)."""
        pid = os.getpid()
        self.log.main(f"kill_process_tree called: parent_pid={pid}, include_parent=True, pid={pid}")
        self.kill_children()
        os.kill(pid, signal.SIGKILL)
        raise SystemExit(137)  # not reached

    # -- launch phase --------------------------------------------------------------------------

    def _launch_sigquit(self, signum: int, frame: object) -> None:
        self.log.main("Received sigquit from a child process. It usually means the child failed.")
        self.kill_tree_self()

    def run(self) -> int:
        with contextlib.suppress(AttributeError, ValueError):
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        if self.fault("ignore-sigterm"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cfg = self.cfg
        if cfg.sim.entrypoint == "launch_server" and parse_version(cfg.spec.version) >= (0, 5, 17):
            self.log.raw(_WARNING_ENTRY.format(path=os.path.dirname(os.path.dirname(__file__))))
        for flag, repl in cfg.deprecated:
            use = f" Use '{repl}' instead." if repl else ""
            self.log.raw(
                f"\x1b[1;33m'{flag}' is deprecated and will be removed in a future release.{use}\x1b[0m\n"
            )
        self.sleep(3.0)
        self.log.main(self._server_args_line())
        signal.signal(signal.SIGQUIT, self._launch_sigquit)
        env = dict(os.environ)
        race = self.fault("port-race")
        if race is not None and race.mode == "precheck":
            return self._port_precheck_fails()
        if self.fault("setsid-escape"):
            # Waited for: its child (the runaway) is the orphan, not it.
            subprocess.run([sys.executable, "-m", "sglang_supervisor.simulator.escape"],
                           env=env, check=False)
        try:
            if cfg.nnodes > 1 and not self._rendezvous():
                return 1
            if cfg.node_rank == 0:  # other nodes run no tokenizer or detokenizer
                self.children.append(ranks.spawn("detokenizer", "sglang::detokenizer", self.argv, env))
            for r in self.rank_ids:
                name = f"sglang::scheduler_TP{r}" if cfg.tp_size > 1 else "sglang::scheduler"
                proc = ranks.spawn(f"scheduler_TP{r}", name, self.argv, env)
                self.children.append(proc)
                self.rank_procs.append(proc)
            code = self._wait_ranks_ready()
            if code is not None:
                return code
            if cfg.node_rank > 0:
                return asyncio.run(self._serve_dummy())
            return asyncio.run(self._serve())
        except SystemExit as exc:  # never leave the children behind, whatever exits
            self.kill_children()
            return int(exc.code) if isinstance(exc.code, int) else 1
        except KeyboardInterrupt:
            self.kill_children()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            return 130

    def _server_args_line(self) -> str:
        args = startup.resolved_server_args(self.cfg)
        if self.cfg.spec.server_args_style == "dict":
            return f"server_args={args!r}"
        return "server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"

    def _wait_ranks_ready(self) -> int | None:
        sel = selectors.DefaultSelector()
        pending: dict[int, int] = {}
        for i, proc in enumerate(self.rank_procs):
            assert proc.stdout is not None
            sel.register(proc.stdout, selectors.EVENT_READ, i)
            pending[i] = 1
        poll_s = max(0.05, 5.0 * self.scale)
        while pending:
            for key, _ in sel.select(timeout=poll_s):
                data = os.read(key.fd, 64)
                if data.startswith(b"ready") or not data:
                    sel.unregister(key.fileobj)
                    pending.pop(int(key.data), None)
            for i, proc in enumerate(self.rank_procs):
                code = proc.poll()
                if code is not None and (i in pending or code != 0):
                    self.log.main(
                        "Traceback (most recent call last):\n"
                        '  File "/usr/lib/python3/site-packages/sglang/launch_server.py", line 83, '
                        "in <module>\n"
                        "    run_server(server_args)\n"
                        f"RuntimeError: Rank {self.rank_ids[i]} scheduler died during initialization "
                        f"(exit code: {code}). "
                        "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
                        "Run `dmesg -T | grep -i oom` to check."
                    )
                    self.kill_children()
                    return 1
        sel.close()
        return None

    # -- running phase -------------------------------------------------------------------------

    async def _serve(self) -> int:
        """Long because: SGLang's running phase in its order: the scheduler link, the startup graph
        timings, the engine and its API, uvicorn bound only now (a port race reproduced), the faults
        armed, then the drain on stop; each step's objects are the next step's inputs, and that
        order is what the simulator reproduces.
        """
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        engine = serving.Engine(cfg, self.log)
        self.engine = engine
        tp0 = self.rank_procs[0] if self.rank_procs else None
        if tp0 is not None and tp0.stdin is not None and tp0.stdout is not None:
            engine.heartbeat = serving.SchedulerLink(tp0.stdin.fileno(), tp0.stdout.fileno()).beat
        mem = startup.memory_plan(cfg)
        engine.kv_tokens = mem.kv_tokens
        engine.memory_usage = {
            "weight": round(mem.weights + mem.draft_weights, 2),
            "kvcache": round(mem.kv, 2),
            "graph": round(mem.prefill_graph + mem.decode_graph, 2),
        }
        timings = startup.capture_timings(cfg)
        graphs = {
            "prefill": timings["prefill"] if cfg.prefill_backend != "disabled" else 0.0,
            "decode": timings["decode"] if cfg.decode_graph and not cfg.speculative else 0.0,
            "target_verify": timings["target_verify"] if cfg.decode_graph and cfg.speculative else 0.0,
            "draft_prefill": timings["draft_prefill"] if cfg.has_draft_model else 0.0,
            "draft_decode": timings["draft_decode"] if cfg.has_draft_model and cfg.spec_steps > 1 else 0.0,
            "draft_extend": timings["draft_extend"] if cfg.has_draft_model else 0.0,
        }
        engine.startup_graph_times = {k: v for k, v in graphs.items() if v}
        if cfg.spec.startup_timings_line:
            load = 0.3 + mem.weights / 1.6
            self.log.tp0(
                "Engine startup timings (s): load_weight={:.2f}, kv_cache_allocation=0.50, "
                "scheduler_e2e={:.2f}, cuda_graph={{{}}}, tokenizer_e2e={:.2f}".format(
                    load,
                    load + sum(graphs.values()) + 1,
                    ", ".join(f"{k}={v:.2f}" for k, v in graphs.items()),
                    load + sum(graphs.values()) + 4,
                )
            )
        registry = server.make_registry(cfg, engine) if cfg.enable_metrics else None
        health_s = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT") or 20) * self.scale
        api = server.Api(cfg, engine, self.log, max(health_s, 0.2), registry)
        config = uvicorn.Config(
            misbehave.Misbehave(server.build_app(api), engine, self.scale),
            host=cfg.host,
            port=cfg.port,
            log_config=LOG_CONFIG,
            timeout_keep_alive=5,
            loop="asyncio",
        )
        self.uvicorn = uvicorn.Server(config)
        race = self.fault("port-race")
        stranger = self._port_race() if race is not None and race.mode == "uvicorn" else None
        serve_task = asyncio.create_task(self._uvicorn_serve(self.uvicorn))
        while not self.uvicorn.started:
            if serve_task.done():  # could not bind: uvicorn logged why; exit with its code
                self.kill_children()
                if stranger is not None:
                    stranger.close()
                return serve_task.result()
            await asyncio.sleep(0.01)
        if self.fault("ignore-sigterm"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(self._on_sigterm()))
        loop.add_signal_handler(signal.SIGQUIT, lambda: asyncio.ensure_future(self._running_sigquit()))
        if self.peers:  # a peer node gone: our collectives never complete (NCCL waits 600 s)
            multinode.watch_peers(self.peers, lambda: loop.call_soon_threadsafe(engine.wedge))
        tasks = [
            asyncio.create_task(engine.run()),
            asyncio.create_task(self._subprocess_watchdog()),
            asyncio.create_task(self._warmup()),
        ]
        await self._stop.wait()
        self.uvicorn.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serve_task, 5)
        for t in tasks:
            t.cancel()
        return self.exit_code or 0

    # -- multi-node ------------------------------------------------------------------------------

    def _rendezvous(self) -> bool:
        cfg = self.cfg
        timeout = (cfg.dist_timeout or multinode.DEFAULT_DIST_TIMEOUT_S) * self.scale
        try:
            host, port = multinode.parse_dist_init_addr(cfg.dist_init_addr or "")
            if cfg.node_rank == 0:
                self.peers = multinode.leader_rendezvous(host, port, cfg.nnodes, timeout)
            else:
                self.peers = [multinode.worker_rendezvous(host, port, cfg.node_rank, timeout)]
        except multinode.RendezvousError as exc:
            self.log.main(
                "Traceback (most recent call last):\n"
                '  File "/usr/lib/python3/site-packages/sglang/srt/distributed/parallel_state.py", '
                "line 1260, in init_distributed_environment\n"
                f"{exc}"
            )
            return False
        return True

    async def _serve_dummy(self) -> int:
        """A node other than 0: SGLang's launch_dummy_health_check_server; /health is always 200
        whatever the ranks do (a dead rank is seen only by its process being gone)."""
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        # The wording of every release the simulator emulates (0.5.5 and later; 0.5.4 and before said
        # `Starting dummy health check server at`), logged as the server's thread starts; the
        # address as SGLang's NetworkAddress.to_host_port_str writes it (IPv6 in brackets).
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        self.log.main(f"Dummy health check server started in background thread at {host}:{cfg.port}")
        config = uvicorn.Config(multinode.dummy_health_app(), host=cfg.host, port=cfg.port,
                                log_config=None, log_level="warning", timeout_keep_alive=5,
                                loop="asyncio")
        self.uvicorn = uvicorn.Server(config)
        serve_task = asyncio.create_task(self._uvicorn_serve(self.uvicorn))
        stop = asyncio.Event()
        if self.fault("ignore-sigterm"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            loop.add_signal_handler(signal.SIGTERM, stop.set)
        for f in self.faults:
            if f.kind == "crash" and f.stage is None and f.rank in self.rank_ids:
                self._fault_tasks.append(asyncio.create_task(self._fault_at(f)))

        async def collectives() -> None:
            while True:
                await asyncio.sleep(max(0.05, 0.5 * self.scale))
                if any(p.poll() is not None for p in self.rank_procs):
                    for peer in self.peers:  # our rank is gone: the group's collectives break
                        with contextlib.suppress(OSError):
                            peer.close()
                    return

        watch = asyncio.create_task(collectives())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([serve_task, stopped], return_when=asyncio.FIRST_COMPLETED)
        watch.cancel()
        self.uvicorn.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serve_task, 5)
        self._stopping = True
        self.kill_children()
        return 0 if stopped.done() else serve_task.result()

    def _port_precheck_fails(self) -> int:
        """SGLang's PortArgs.init_new (server_args.py): wait_port_available() on each derived
        port, a ValueError after SGLANG_WAIT_PORT_TIMEOUT (30 s), logged, then fatal."""
        base = self.cfg.port + 233  # SGLang derives them from dist_init_addr / the server port
        self.sleep(30.0)
        pkg = os.path.dirname(os.path.dirname(__file__))
        self.log.main(f"Port is already in use. dist_init_port={base} port_base={base + 1} "
                      f"detokenizer_port={base + 2} nccl_port={base + 3} "
                      f"scheduler_input_port={base + 5}")
        self.log.raw(
            "Traceback (most recent call last):\n"
            f'  File "{pkg}/sglang/srt/server_args.py", line 5873, in init_new\n'
            '    wait_port_available(port_base, "port_base")\n'
            f'  File "{pkg}/sglang/srt/utils/network.py", line 96, in wait_port_available\n'
            "    raise ValueError(\n"
            f"ValueError: port_base at {base + 1} is not available in 30 seconds. port_base at "
            f"{base + 1} is not available\n")
        return 1

    def _port_race(self) -> socket.socket:
        """Another listener on our port since the supervisor's preflight (fault `port-race`)."""
        host = self.cfg.host or "0.0.0.0"
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, self.cfg.port))
        s.listen()
        return s

    @staticmethod
    async def _uvicorn_serve(srv: uvicorn.Server) -> int:
        try:
            await srv.serve()
        except SystemExit as exc:  # uvicorn exits 3 when it cannot bind (port in use)
            return exc.code if isinstance(exc.code, int) else 1
        return 0

    async def _warmup(self) -> None:
        cfg = self.cfg
        host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host
        base = f"http://{host}:{cfg.port}"
        headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        async with httpx.AsyncClient(timeout=600, headers=headers) as client:
            await client.get(base + "/model_info")
            await asyncio.sleep(3.0 * self.scale)  # the first forward JIT-compiles kernels
            if self.fault("warmup-fail"):
                self.log.tp0(
                    "Scheduler hit an exception: Traceback (most recent call last):\n"
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB.\n"
                )
                self.log.main(
                    "Initialization failed. warmup error: Traceback (most recent call last):\n"
                    "requests.exceptions.ConnectionError: ('Connection aborted.', "
                    "RemoteDisconnected('Remote end closed connection without response'))\n"
                )
                self.kill_tree_self()
            resp = await client.post(
                base + "/generate",
                json={
                    "text": "The capital city of France is",
                    "sampling_params": {"temperature": 0, "max_new_tokens": 8},
                },
            )
            resp.raise_for_status()
        assert self.engine is not None
        self.engine.status = "up"
        self.log.main("The server is fired up and ready to roll!")
        for f in self.faults:
            if (
                f.kind in ("hang", "crash", "watchdog", "nccl-timeout", "degrade", "eager-fallback",
                           "echo-hostile", "http", "health-slow-under-load", *OUTPUT_FAULTS)
                and (f.kind != "hang" or f.stage == "serving")
                and (f.kind != "crash" or f.stage is None)
            ):
                self._fault_tasks.append(asyncio.create_task(self._fault_at(f)))

    async def _fault_at(self, f: faultmod.Fault) -> None:
        await asyncio.sleep(f.at_s * self.scale)
        if f.kind == "crash" and self.engine is None:  # a node other than 0 has no API engine
            if f.rank in self.rank_ids:
                with contextlib.suppress(ProcessLookupError):
                    self.rank_procs[self.rank_ids.index(f.rank)].kill()
            return
        engine = self.engine
        assert engine is not None
        if f.kind == "hang":
            engine.wedge()
        elif f.kind == "degrade":
            engine.degrade(f.factor or 1.0)
        elif f.kind == "http" and f.stage and f.mode:
            engine.http_faults[f.stage] = f.mode
        elif f.kind == "health-slow-under-load":
            engine.health_slow_s = (f.seconds or 60.0) * self.scale
        elif f.kind == "eager-fallback":
            engine.eager = True
        elif f.kind == "accept-collapse":
            engine.accept_collapsed = True
        elif f.kind in OUTPUT_FAULTS:
            engine.output_fault = f.kind
        elif f.kind == "echo-hostile":
            level, fmt = self.cfg.log_requests_level, self.cfg.log_requests_format
            self.log.request_record("".join(reqlog.hostile_lines(level, fmt, time.time())))
        elif f.kind == "crash":
            if f.rank in self.rank_ids:
                with contextlib.suppress(ProcessLookupError):
                    self.rank_procs[self.rank_ids.index(f.rank)].kill()
        elif f.kind == "nccl-timeout":
            engine.wedge()
            stamp = time.strftime("%m%d %H:%M:%S")
            self.log.raw(
                f"[rank{f.rank}]:[E{stamp}.000000000 ProcessGroupNCCL.cpp:632] [Rank {f.rank}] "
                "Watchdog caught "
                "collective operation timeout: WorkNCCL(SeqNum=48213, OpType=ALLREDUCE, NumelIn=5120, "
                "NumelOut=5120, Timeout(ms)=600000) ran for 600011 milliseconds before timing out.\n"
                "terminate called after throwing an instance of 'c10::DistBackendError'\n"
            )
            with contextlib.suppress(ProcessLookupError):
                if f.rank in self.rank_ids:
                    self.rank_procs[self.rank_ids.index(f.rank)].send_signal(signal.SIGABRT)
        elif f.kind == "watchdog":
            engine.wedge()
            while engine.busy_since is None:
                await asyncio.sleep(max(0.05, self.scale))
            remaining = self.cfg.watchdog_timeout * self.scale - (time.monotonic() - engine.busy_since)
            await asyncio.sleep(max(0.0, remaining))
            self.log.tp0(
                f"Scheduler debug info:\nbatch_size={len(engine.running)}, "
                f"#running-req={len(engine.running)}, #queue-req={len(engine.waiting)}"
            )
            self.log.tp0(
                f"Scheduler watchdog timeout (self.watchdog_timeout={self.cfg.watchdog_timeout:g}, "
                "self.soft=False)"
            )
            await asyncio.sleep(5.0 * self.scale)
            await self._running_sigquit()

    async def _subprocess_watchdog(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, 1.0 * self.scale))
            for i, proc in enumerate(self.rank_procs):
                code = proc.poll()
                if code is not None and not self._stopping:
                    self.log.main(
                        f"Subprocess scheduler_{i} (pid={proc.pid}) crashed with exit code {code}. "
                        "Triggering SIGQUIT for cleanup..."
                    )
                    await self._running_sigquit()
                    return

    async def _running_sigquit(self) -> None:
        if self._crashing:
            return
        self._crashing = True
        self.log.main("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        self.log.main("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
        await asyncio.sleep(5.0 * self.scale)
        if all(p.poll() is not None for p in self.rank_procs):
            self.log.main("No live scheduler processes found; skipping py-spy and CUDA coredump.")
        self.kill_tree_self()

    async def _on_sigterm(self) -> None:
        engine = self.engine
        assert engine is not None
        if engine.draining:
            return
        if engine.unhealthy or (engine.wedged and engine.busy_since is not None):
            self.log.main("Signal SIGTERM received while health check failed. Force exiting.")
            self.log.main("Waiting 60.0 seconds for CUDA coredumps before exiting.")
            await asyncio.sleep(60.0 * self.scale)
            self.kill_tree_self()
        engine.draining = True
        self.log.main("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        while True:
            await asyncio.sleep(min(1.0, 5.0 * self.scale))
            rids = [r.rid for r in [*engine.running, *engine.waiting]]
            self.log.main(
                f"Gracefully exiting... Remaining number of requests {len(rids)}. "
                f"Remaining requests remaining_rids={rids}."
            )
            if not rids:
                break
            await asyncio.sleep(max(0.0, 5.0 * self.scale - 1.0))
        slow = self.fault("slow-drain")
        if slow is not None and slow.seconds:
            await asyncio.sleep(slow.seconds * self.scale)
        if self.cfg.spec.clean_exit_code != 0:
            self.kill_tree_self()
        self._stopping = True
        for child in self.children:
            if child.stdin is not None:
                with contextlib.suppress(OSError):
                    child.stdin.close()
        await asyncio.to_thread(self._reap_children)
        self.exit_code = 0
        self._stop.set()

    def _reap_children(self) -> None:
        deadline = time.monotonic() + 15
        for child in self.children:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ
    try:
        if "-h" in args or "--help" in args:
            sys.stdout.write(help_text(args, env))
            return 0
        cfg = simargs.load_config(args, env)
    except (simargs.SimArgsError, versions.UnknownVersionError) as exc:
        sys.stderr.write(f"sglang-sim: error: {exc}\n")
        return 2
    return Launcher(cfg, args).run()


if __name__ == "__main__":
    sys.exit(main())
