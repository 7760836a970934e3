"""`sglang-supervisor tune`: start each profile, wait for ready, probe it, stop it, rank them.

Ready and failed mean what they mean to the daemon (core/trial: its ready gate over every
expected CUDA graph capture and the ready line, its deadlines, its failure ranker), so a profile
tune ranks is one `run` accepts, and a failure is named as `run` would name it.

The ranking (fastest working profile first) is persisted in the state directory under the same
deployment fingerprint `run` computes, and the winner is marked last-known-good there, so the next
`run` starts with it (no probation for the profiles it beat; the ones that failed here are
remembered as failed starts). Progress goes to stderr as it happens; the table (or JSON) to stdout.

A written profile that fails with a class `run` answers with a derived profile (issue 25,
`restart.derive`) is followed by that derived profile, measured and ranked like the others and
shown with its base and change (tune_derive.py decides which).

Exit status: 0 when at least one profile served, 69 when none did, 75 when the engine port is
busy (a running engine), 78 for a configuration error.

Long because: one command's whole surface in the order it runs (a trial per profile with its log
watch, derived trials after failures, the table and JSON, the persisted ranking), sharing TuneResult.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from sglang_supervisor.commands.doctor import port_busy, quiet_logging
from sglang_supervisor.commands.tune_derive import TrialFacts, next_derivation, oom_in, render_derived
from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.core.config import Config, ConfigError
from sglang_supervisor.core.derive import Derivation
from sglang_supervisor.core.events import ServerArgsSeen
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.logwatch import LineSplitter, LogParser
from sglang_supervisor.core.profiles import RenderedCommand
from sglang_supervisor.core.readiness import capture_keys
from sglang_supervisor.core.trial import Deadlines, Step, TrialStart
from sglang_supervisor.engine.argv import tp_size
from sglang_supervisor.engine.detect import detect_engine_version
from sglang_supervisor.engine.resolved import resolved_graph_max
from sglang_supervisor.shell.checks.fidelitycheck import AfterReady, tune_check
from sglang_supervisor.shell.checks.probe import make_shape, probe_many
from sglang_supervisor.shell.engineproc.apikey import write_secret_config
from sglang_supervisor.shell.engineproc.process import EngineProcess
from sglang_supervisor.shell.files import state
from sglang_supervisor.shell.files.configfile import load_config
from sglang_supervisor.shell.links.grouplink import local_capture_keys
from sglang_supervisor.shell.supervisor import Prepared, ladder_hash, policy_settings, prepare
from sglang_supervisor.shell.telemetry import gpu

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
    base: str | None = None  # a derived profile (issue 25): the written rung it came from
    change: str | None = None  # ... and what it changed there


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
    """Reads the engine's output, parses it, and keeps the facts of the start (core/trial)."""

    def __init__(self, version: str, secrets: Sequence[str], trial: TrialStart) -> None:
        self.splitter = LineSplitter()
        self.parser = LogParser(version, secrets)
        self.trial = trial
        self.tail: deque[str] = deque(maxlen=20)
        self.facts = TrialFacts()  # what a derived profile after a failure needs (tune_derive)

    def feed(self, data: bytes) -> None:
        now = time.monotonic()
        self.trial.output(now)
        self._lines(self.splitter.feed(data), now)

    def finish(self) -> None:
        """End of the engine's log: its last partial line, and a traceback block still open
        (the parser classifies a block once it ends), as the daemon's log pump does."""
        now = time.monotonic()
        self._lines(self.splitter.flush(), now)
        for ev in self.parser.finish():
            self.trial.feed(ev, now)

    def _lines(self, lines: list[str], now: float) -> None:
        for line in lines:
            self.tail.append(line)
            for ev in self.parser.feed_line(line):
                if isinstance(ev, ServerArgsSeen):
                    self.facts.resolved = resolved_graph_max(ev.args)
                self.trial.feed(ev, now)

    def touch(self, data: bytes) -> None:
        """Output on the engine's stdout (request records, access lines: user text, never parsed)."""
        self.trial.output(time.monotonic())


async def _drain(fd: int, feed: Callable[[bytes], None], eof: Callable[[], None] | None = None) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = os.fdopen(fd, "rb", buffering=0)  # the transport closes it
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe
    )
    try:
        while chunk := await reader.read(65536):
            feed(chunk)
        if eof is not None:
            eof()
    finally:
        transport.close()


async def _pump(proc: EngineProcess, watch: _Watch) -> None:
    """SGLang's own log (stderr) is parsed; its stdout is drained so that the engine never blocks."""
    await asyncio.gather(_drain(proc.stderr_fd, watch.feed, watch.finish),
                         _drain(proc.stdout_fd, watch.touch))


def deadlines(config: Config) -> Deadlines:
    """The daemon's own: its start and stall timeouts, and its grace after a failure line."""
    s = policy_settings(config, last_good=None, known_bad={}, retry_known_bad=False)
    return Deadlines(start_s=s.start_s, stall_s=s.stall_s, grace_s=s.failure_grace_s)


# How long the engine's last lines may take to arrive once its processes are gone (the daemon's
# EOF_GRACE_S).
LAST_LINES_S = 3.0


async def _wait_ready(proc: EngineProcess, watch: _Watch, config: Config,
                      pump: asyncio.Task[None]) -> tuple[str, str | None] | None:
    """None when ready (the daemon's ready gate), else (the failure class the daemon would
    decide, the line that says so). As the daemon, it classifies only after the engine's output
    ended: its last lines (a traceback) often come after the exit is seen."""
    limits = deadlines(config)
    trial = watch.trial
    while True:
        decision = trial.decide(time.monotonic(), proc.returncode, limits)
        if decision.step is Step.READY:
            return None
        if decision.step is not Step.WAIT:
            break
        await asyncio.sleep(0.1)
    # A STOP ends the engine; after an EXIT its children may still hold the pipes.
    await proc.stop(config.timeouts.drain_s, config.timeouts.kill_s)
    await asyncio.wait({pump}, timeout=LAST_LINES_S)
    failure, detail = trial.failure(proc.returncode, decision)
    return failure.value, detail


async def tune_profile(prepared: Prepared, name: str, rounds: int, progress: Progress,
                       after_ready: AfterReady | None = None, *,
                       rc: RenderedCommand | None = None, facts: list[TrialFacts] | None = None
                       ) -> TuneResult:
    """`rc`: a derived profile's command (written ones come from `prepared`); `facts` receives
    what the start showed a derivation (tune_derive.TrialFacts).

    Long because: one trial's lifetime: the engine it spawns, the log pump and GPU sampler tasks it
    starts, and the try/finally that stops all three whatever happened in between (failed, ready,
    probed); the steps in between share those tasks and the trial's clock.
    """
    config = prepared.config
    rc = rc if rc is not None else prepared.renders[name]
    if rc.secret_config is not None:
        write_secret_config(rc.argv[rc.argv.index("--config") + 1], rc.secret_config)
    expected = capture_keys(rc.argv, prepared.version)
    if config.group is not None:  # as the daemon: the leader's log holds only its own ranks
        expected = local_capture_keys(expected, config.group, tp_size(rc.argv))
    began = time.monotonic()
    trial = TrialStart(expected, began)
    watch = _Watch(prepared.version, [prepared.api_key] if prepared.api_key else [], trial)
    if facts is not None:
        facts.append(watch.facts)
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
        failed = await _wait_ready(proc, watch, config, pump)
        startup = time.monotonic() - began
        capture = (
            trial.capture_end - trial.capture_begin
            if trial.capture_begin is not None and trial.capture_end is not None
            else None
        )
        if failed is not None:
            watch.facts.oom = oom_in(f.message for f in trial.failures)
            why, detail = failed
            detail = detail or (watch.tail[-1] if watch.tail else None)
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
        verdict = await after_ready(name, rc, f"http://{host}:{config.engine.port}",
                                    report.median("spec_accept_length")) if after_ready else None
        if verdict is not None:  # a profile that fails fidelity is never ranked, whatever its tok/s
            progress(f"{name}: {verdict[0]} ({verdict[1][:200]}); not ranked ({median:.1f} tok/s)")
            return TuneResult(name, True, startup, capture, report.median("ttft_s"), None, None, peak,
                              failure=verdict[0], detail=verdict[1])
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


def persist(prepared: Prepared, ranked: Sequence[TuneResult],
            derived: Mapping[str, Derivation] | None = None) -> str | None:
    """Store the ranking; the winner becomes last-known-good, and a profile that failed here is
    remembered as a failed start (so `run` does not try it first on probation). A derived winner
    is remembered with its change, as `run` remembers one that served; the ranking keeps the
    other derived profiles out (`run` knows only remembered ones). Returns the winner."""
    derived = derived or {}
    working = [r.profile for r in ranked if r.decode_tps_p50 is not None]
    if not working:
        return None
    store = state.StateStore(prepared.config.state_dir, prepared.config.name)
    fp = deployment_fingerprint(prepared)
    now = time.time()
    store.set_ranking(fp, [n for i, n in enumerate(working) if i == 0 or n not in derived], now)
    if working[0] in derived:
        store.mark_serving(fp, working[0], now, below_best=False, derived=derived[working[0]])
    else:
        store.mark_good(fp, working[0], now)
    for r in ranked:
        if r.decode_tps_p50 is None and r.failure is not None:
            store.mark_bad(fp, r.profile, r.failure, now)
    return working[0]


async def run_tune(
    prepared: Prepared, names: Sequence[str], rounds: int, progress: Progress, *,
    derived: dict[str, Derivation] | None = None,
    after_ready: AfterReady | None = None,
) -> list[TuneResult]:
    """Each written profile; after one that fails with a class `run` derives for, the derived
    profiles `run` would start next (issue 25), each recorded in `derived` by name."""
    results: list[TuneResult] = []
    for i, name in enumerate(names, 1):
        prefix = f"[{i}/{len(names)}] "

        def step(message: str, prefix: str = prefix) -> None:
            progress(prefix + message)

        facts: list[TrialFacts] = []
        result = await tune_profile(prepared, name, rounds, step, after_ready, facts=facts)
        results.append(result)
        parent: Derivation | None = None
        while not result.started:
            d = next_derivation(prepared.config, result.profile, result.failure, result.detail,
                                facts=facts[-1], parent=parent)
            if d is None:
                break
            step(f"{result.profile} failed ({result.failure}): trying the derived {d.name} ({d.change})")
            rc = render_derived(prepared.config, d, prepared.version, prepared.renders[name],
                                python=sys.executable, api_key=prepared.api_key)
            result = replace(await tune_profile(prepared, d.name, rounds, step, after_ready,
                                                rc=rc, facts=facts),
                             base=d.base, change=d.change)
            results.append(result)
            if derived is not None:
                derived[d.name] = d
            parent = d
    return rank(results)


def _progress_printer() -> Progress:
    def show(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    return show


def load_prepared(path: str) -> Prepared | None:
    """The config at `path` rendered for the installed release, or None with the problems
    printed (tune and fidelity start engines from it; exit 78 is the caller's)."""
    quiet_logging()
    try:
        config = load_config(path)
        return prepare(config, detect_engine_version(config))
    except ConfigError as e:
        print(e.report(), file=sys.stderr)
        return None


def main(args: argparse.Namespace) -> int:
    prepared = load_prepared(args.config)
    if prepared is None:
        return ExitCode.CONFIG
    config, version = prepared.config, prepared.version
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
    derived: dict[str, Derivation] = {}
    ranked = asyncio.run(run_tune(prepared, names, args.rounds, _progress_printer(), derived=derived,
                                  after_ready=tune_check(prepared)))
    winner = persist(prepared, ranked, derived)
    if args.json:
        print(
            json.dumps(
                {"engine_version": version, "winner": winner, "ranking": [asdict(r) for r in ranked]},
                indent=2,
            )
        )
    else:
        print(format_table(ranked))
        for r in ranked:
            if r.base is not None:
                print(f"derived: {r.profile} = {r.base} with {r.change}")
        print(f"\nrun will start with: {winner}" if winner else "\nno profile served: nothing persisted")
    return ExitCode.OK if winner else ExitCode.ALL_PROFILES_FAILED
