"""`sglang-supervisor tune`: start each profile, wait for ready, probe it, stop it, rank them.

The ranking (fastest working profile first) is persisted in the state directory under the same
deployment fingerprint `run` computes, and the winner is marked last-known-good there, so the next
`run` starts with it. Progress goes to stderr as it happens; the table (or JSON) to stdout.

Exit status: 0 when at least one profile served, 69 when none did, 75 when the engine port is
busy (a running engine), 78 for a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from sglang_supervisor.commands.doctor import port_busy, quiet_logging
from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.core.config import Config, ConfigError
from sglang_supervisor.core.events import CaptureBegan, CaptureEnded, EngineFailed, FailureClass, ServerReady
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.logwatch import LineSplitter, LogParser
from sglang_supervisor.engine.detect import detect_engine_version
from sglang_supervisor.shell import gpu, state
from sglang_supervisor.shell.apikey import write_secret_config
from sglang_supervisor.shell.configfile import load_config
from sglang_supervisor.shell.probe import make_shape, probe_many
from sglang_supervisor.shell.process import EngineProcess
from sglang_supervisor.shell.supervisor import Prepared, ladder_hash, prepare

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TuneResult:
    profile: str
    started: bool
    startup_s: float | None = None  # launch -> "ready to roll"
    capture_s: float | None = None  # first graph capture begin -> last capture end
    ttft_p50_s: float | None = None
    decode_tps_p50: float | None = None
    decode_tps_spread: float | None = None  # (max - min) / median over the probe rounds
    peak_gpu_bytes: int | None = None  # summed over GPUs; None without NVML
    failure: str | None = None  # FailureClass value, or "probe_failed"
    detail: str | None = None


def rank(results: Sequence[TuneResult]) -> list[TuneResult]:
    """Working profiles by decode tok/s (p50, highest first; TTFT breaks ties), then the failed
    ones in the order they were tried."""
    ok = [r for r in results if r.started and r.decode_tps_p50 is not None]
    ok.sort(key=lambda r: (-(r.decode_tps_p50 or 0.0), r.ttft_p50_s or 0.0))
    return ok + [r for r in results if r not in ok]


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{unit}"


def format_table(ranked: Sequence[TuneResult]) -> str:
    head = (
        "#",
        "profile",
        "started",
        "startup",
        "capture",
        "TTFT p50",
        "decode p50",
        "spread",
        "peak GPU",
        "failure",
    )
    rows = [head]
    for i, r in enumerate(ranked, 1):
        rows.append(
            (
                str(i) if r.decode_tps_p50 is not None else "-",
                r.profile,
                "yes" if r.started else "no",
                _fmt(r.startup_s, ".1f", " s"),
                _fmt(r.capture_s, ".1f", " s"),
                _fmt(None if r.ttft_p50_s is None else r.ttft_p50_s * 1000, ".0f", " ms"),
                _fmt(r.decode_tps_p50, ".1f", " tok/s"),
                _fmt(None if r.decode_tps_spread is None else r.decode_tps_spread * 100, ".0f", " %"),
                _fmt(None if r.peak_gpu_bytes is None else r.peak_gpu_bytes / 1024**3, ".1f", " GiB"),
                r.failure or "",
            )
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _gpu_used() -> int | None:
    snap = gpu.snapshot()
    if not snap:
        return None
    return sum(g.memory_used_bytes or 0 for g in snap)


class _Watch:
    """Reads the engine's output, parses it, and remembers what tune reports."""

    def __init__(self, version: str, secrets: Sequence[str]) -> None:
        self.splitter = LineSplitter()
        self.parser = LogParser(version, secrets)
        self.last_output = time.monotonic()
        self.ready = asyncio.Event()
        self.capture_begin: float | None = None
        self.capture_end: float | None = None
        self.failure: EngineFailed | None = None
        self.tail: deque[str] = deque(maxlen=20)

    def feed(self, data: bytes) -> None:
        self.last_output = time.monotonic()
        for line in self.splitter.feed(data):
            self.tail.append(line)
            for ev in self.parser.feed_line(line):
                now = time.monotonic()
                if isinstance(ev, CaptureBegan) and self.capture_begin is None:
                    self.capture_begin = now
                elif isinstance(ev, CaptureEnded):
                    self.capture_end = now
                elif isinstance(ev, EngineFailed) and self.failure is None:
                    self.failure = ev
                elif isinstance(ev, ServerReady):
                    self.ready.set()


    def touch(self, data: bytes) -> None:
        """Output on the engine's stdout (request records, access lines: user text, never parsed)."""
        self.last_output = time.monotonic()


async def _drain(fd: int, feed: Callable[[bytes], None]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = os.fdopen(fd, "rb", buffering=0)  # the transport closes it
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe
    )
    try:
        while chunk := await reader.read(65536):
            feed(chunk)
    finally:
        transport.close()


async def _pump(proc: EngineProcess, watch: _Watch) -> None:
    """SGLang's own log (stderr) is parsed; its stdout is drained so that the engine never blocks."""
    await asyncio.gather(_drain(proc.stderr_fd, watch.feed), _drain(proc.stdout_fd, watch.touch))


async def _wait_ready(proc: EngineProcess, watch: _Watch, config: Config, began: float) -> str | None:
    """None when ready, else why not (a FailureClass value)."""
    while not watch.ready.is_set():
        if watch.failure is not None:
            return watch.failure.failure.value
        rc = proc.returncode
        if rc is not None:
            return FailureClass.UNKNOWN_FLAG.value if rc == 2 else FailureClass.OTHER.value
        now = time.monotonic()
        if now - began > config.timeouts.start_s or now - watch.last_output > config.timeouts.stall_s:
            return FailureClass.HANG.value
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(watch.ready.wait(), 0.1)
    return None


async def tune_profile(prepared: Prepared, name: str, rounds: int, progress: Progress) -> TuneResult:
    config = prepared.config
    rc = prepared.renders[name]
    if rc.secret_config is not None:
        write_secret_config(rc.argv[rc.argv.index("--config") + 1], rc.secret_config)
    watch = _Watch(prepared.version, [prepared.api_key] if prepared.api_key else [])
    began = time.monotonic()
    progress(f"{name}: starting")
    proc = EngineProcess.spawn(rc.argv, engine_env(os.environ, rc.env))
    pump = asyncio.create_task(_pump(proc, watch))
    peak: int | None = None

    async def sample_gpu() -> None:
        nonlocal peak
        while True:
            used = _gpu_used()
            if used is not None:
                peak = max(peak or 0, used)
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample_gpu())
    try:
        why = await _wait_ready(proc, watch, config, began)
        startup = time.monotonic() - began
        capture = (
            watch.capture_end - watch.capture_begin
            if watch.capture_begin is not None and watch.capture_end is not None
            else None
        )
        if why is not None:
            detail = watch.failure.message if watch.failure else (watch.tail[-1] if watch.tail else None)
            progress(f"{name}: FAILED ({why}) after {startup:.1f} s")
            return TuneResult(name, False, None, capture, failure=why, detail=detail, peak_gpu_bytes=peak)
        progress(
            f"{name}: ready in {startup:.1f} s"
            + (f" (graph capture {capture:.1f} s)" if capture else "")
            + f"; probing {rounds} round(s)"
        )
        host = config.engine.host
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        report = await probe_many(
            f"http://{host}:{config.engine.port}",
            make_shape(config.probe.input_tokens, config.probe.max_new_tokens),
            runs=rounds,
            api_key=prepared.api_key,
            timeout=config.probe.timeout_s,
        )
        tps = [r.decode_tps for r in report.ok if r.decode_tps is not None]
        if not tps:
            errors = sorted({r.error for r in report.results if r.error})
            progress(f"{name}: probes failed ({'; '.join(errors)[:200]})")
            return TuneResult(
                name,
                True,
                startup,
                capture,
                failure="probe_failed",
                detail="; ".join(errors) or None,
                peak_gpu_bytes=peak,
            )
        median = statistics.median(tps)
        spread = (max(tps) - min(tps)) / median if median else None
        progress(f"{name}: {median:.1f} tok/s decode (p50 of {len(tps)})")
        return TuneResult(name, True, startup, capture, report.median("ttft_s"), median, spread, peak)
    finally:
        sampler.cancel()
        progress(f"{name}: stopping")
        await proc.stop(config.timeouts.drain_s, config.timeouts.kill_s)
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await pump
        with contextlib.suppress(asyncio.CancelledError):
            await sampler


def deployment_fingerprint(prepared: Prepared) -> str:
    """The same fingerprint `run` keys its state with."""
    gpus = gpu.snapshot() or []
    return state.fingerprint(
        prepared.config.engine.model_path,
        prepared.version,
        [g.name for g in gpus],
        next((g.driver for g in gpus if g.driver), "") or "",
        ladder_hash(prepared.renders),
    )


def persist(prepared: Prepared, ranked: Sequence[TuneResult]) -> str | None:
    """Store the ranking; the winner becomes last-known-good. Returns the winner."""
    working = [r.profile for r in ranked if r.decode_tps_p50 is not None]
    if not working:
        return None
    store = state.StateStore(prepared.config.state_dir, prepared.config.name)
    fp = deployment_fingerprint(prepared)
    now = time.time()
    store.set_ranking(fp, working, now)
    store.mark_good(fp, working[0], now)
    return working[0]


async def run_tune(
    prepared: Prepared, names: Sequence[str], rounds: int, progress: Progress
) -> list[TuneResult]:
    results: list[TuneResult] = []
    for i, name in enumerate(names, 1):
        prefix = f"[{i}/{len(names)}] "

        def step(message: str, prefix: str = prefix) -> None:
            progress(prefix + message)

        results.append(await tune_profile(prepared, name, rounds, step))
    return rank(results)


def _progress_printer() -> Progress:
    def show(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    return show


def main(args: argparse.Namespace) -> int:
    quiet_logging()
    try:
        config = load_config(args.config)
        version = detect_engine_version(config)
        prepared = prepare(config, version)
    except ConfigError as e:
        print(e.report(), file=sys.stderr)
        return ExitCode.CONFIG
    names = [n.strip() for n in (args.profiles or "").split(",") if n.strip()] or config.profile_names
    unknown = [n for n in names if n not in config.profile_names]
    if unknown:
        print(
            f"tune: no profile named {', '.join(unknown)}; profiles: {', '.join(config.profile_names)}",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    if args.rounds < 1:
        print("tune: --rounds must be at least 1", file=sys.stderr)
        return ExitCode.USAGE
    if port_busy(config.engine.host, config.engine.port):
        print(
            f"tune: port {config.engine.port} is in use (is the supervisor running? stop it first: "
            "tune starts each profile on the configured port)",
            file=sys.stderr,
        )
        return ExitCode.TEMPORARY
    ranked = asyncio.run(run_tune(prepared, names, args.rounds, _progress_printer()))
    winner = persist(prepared, ranked)
    if args.json:
        print(
            json.dumps(
                {"engine_version": version, "winner": winner, "ranking": [asdict(r) for r in ranked]},
                indent=2,
            )
        )
    else:
        print(format_table(ranked))
        print(f"\nrun will start with: {winner}" if winner else "\nno profile served: nothing persisted")
    return ExitCode.OK if winner else ExitCode.ALL_PROFILES_FAILED
