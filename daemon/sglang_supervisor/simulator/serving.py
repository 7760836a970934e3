"""The simulated scheduler while serving: a batch loop that paces tokens by the throughput model.

Requests wait in a queue, get prefilled (a `Prefill batch, ...` line), then decode together in
steps whose duration comes from `throughput.step_seconds` for the current batch size; with
speculative decoding each step yields the accept length in tokens. Every `--decode-log-interval`
steps TP0 prints `Decode batch, ...`. The loop sleeps on an event when idle (no CPU) and
coalesces steps shorter than 10 ms into one wake-up.

Long because: Engine is the simulated scheduler: one batch loop with its queue, running set, pacing
clock, wedge state and log lines; the parts change the same state on every step.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sglang_supervisor.simulator import logfmt, throughput
from sglang_supervisor.simulator.args import SimConfig, active_faults
from sglang_supervisor.simulator.faults import degrade_multiplier
from sglang_supervisor.simulator.outputs import OUTPUT_FAULTS

_MIN_WAKE_S = 0.01
_MAX_LAG_S = 0.5  # behind schedule by more than this (a stall, a loaded host): restart the schedule
WORDS = (
    "the",
    " capital",
    " of",
    " France",
    " is",
    " Paris",
    ".",
    " It",
    " has",
    " a",
    " long",
    " history",
    " and",
    " many",
    " museums",
    ",",
    " parks",
    " and",
    " cafes",
)


class Log:
    """SGLang-format lines on stderr: the launcher's own (no prefix) and TP0's; request records on
    stdout."""

    def __init__(self, cfg: SimConfig, write: Callable[[str], None] | None = None,
                 write_out: Callable[[str], None] | None = None) -> None:
        self.ms = os.environ.get("SGLANG_LOG_MS", "").lower() in ("1", "true", "yes")
        self.tp0_prefix = logfmt.rank_prefix(0, cfg.tp_size)
        self._write = write or _write_stderr
        self._write_out = write_out or _write_stdout

    def main(self, message: str) -> None:
        self._write(logfmt.line(message, time.time(), ms=self.ms))

    def tp0(self, message: str) -> None:
        self._write(logfmt.line(message, time.time(), ms=self.ms, prefix=self.tp0_prefix))

    def rank(self, rank: int, message: str, tp_size: int) -> None:
        self._write(logfmt.line(message, time.time(), ms=self.ms, prefix=logfmt.rank_prefix(rank, tp_size)))

    def raw(self, text: str) -> None:
        self._write(text)

    def request_record(self, text: str) -> None:
        """`--log-requests` records: since 0.5.8 SGLang's request logger writes them through a
        handler of its own on stdout (log_utils.create_log_targets, propagate=False), apart from
        its log on stderr. Emulated versions are all 0.5.13+."""
        self._write_out(text)


def _write_fd(fd: int, text: str) -> None:
    data = text.encode()
    while data:
        data = data[os.write(fd, data) :]


def _write_stderr(text: str) -> None:
    _write_fd(2, text)


def _write_stdout(text: str) -> None:
    # Straight to the fd, past sys.stdout's buffer: uvicorn's access handler flushes after every
    # line, so the two never interleave inside a line (one asyncio thread writes both).
    _write_fd(1, text)


@dataclass(eq=False)
class Request:
    prompt_tokens: int
    max_new_tokens: int
    cached_tokens: int = 0
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    generated: int = 0
    verify_ct: int = 0
    acc: float = 0.0
    created: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    finished_at: float | None = None
    updates: asyncio.Queue[int] = field(default_factory=asyncio.Queue)

    @property
    def done(self) -> bool:
        return self.generated >= self.max_new_tokens


@dataclass
class Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    aborted: int = 0
    decode_graph_passes: int = 0
    decode_eager_passes: int = 0
    prefill_graph_passes: int = 0
    prefill_eager_passes: int = 0


HEARTBEAT_S = 0.1


class SchedulerLink:
    """The launcher's side of the TP0 scheduler's heartbeat pipe (ranks.py echoes each byte)."""

    def __init__(self, to_child: int, from_child: int) -> None:
        self.to_child = to_child
        self.from_child = from_child
        os.set_blocking(from_child, False)

    async def beat(self) -> None:
        """One round trip. Returns at once when the child is gone (its death is the subprocess
        watchdog's to report), never while it is stopped."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                os.read(self.from_child, 64)
            except BlockingIOError:
                return
            except OSError:
                pass
            if not answered.done():
                answered.set_result(None)

        try:
            os.write(self.to_child, b"h")
        except OSError:
            return
        loop.add_reader(self.from_child, readable)
        try:
            await answered
        finally:
            loop.remove_reader(self.from_child)


class Engine:
    """Scheduler state machine + batch loop. Fault hooks flip `wedged`, `eager`, `rate_multiplier`."""

    def __init__(self, cfg: SimConfig, log: Log) -> None:
        self.cfg = cfg
        self.log = log
        self.profile = cfg.profile
        self.status = "starting"  # starting -> up -> (draining); "unhealthy" after a failed health check
        self.draining = False
        self.unhealthy = False
        self.wedged = False
        self.eager = not cfg.decode_graph
        self.rate_multiplier = 1.0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.counters = Counters()
        self.last_gen_throughput = 0.0
        self.last_accept_length = throughput.accept_length(self.profile) if cfg.speculative else 0.0
        self.kv_tokens = 0
        self._wake = asyncio.Event()
        self._unwedge = asyncio.Event()
        self._seen_prompts: dict[str, int] = {}
        self.busy_since: float | None = None  # when a batch last went in flight while wedged
        self.observers: list[Callable[[str, float], None]] = []  # latency histograms (metrics)
        self.startup_graph_times: dict[str, float] = {}
        self.memory_usage: dict[str, float] = {}
        # Faults on the HTTP side (simulator.misbehave): endpoint -> misbehaviour, and how long
        # /health waits while requests run (seconds, already scaled).
        self.http_faults: dict[str, str] = {}
        # Awaited before batch work at most every HEARTBEAT_S: the TP0 scheduler's answer (see
        # SchedulerLink). A stopped scheduler never answers, and decoding stops with it.
        self.heartbeat: Callable[[], Awaitable[None]] | None = None
        self.health_slow_s: float | None = None
        # Output faults (simulator/outputs.py) active from the start; timed ones set later.
        self.output_fault: str | None = next(
            (f.kind for f in active_faults(cfg) if f.kind in OUTPUT_FAULTS and f.at_s == 0
             and f.kind != "accept-collapse"), None)
        self.output_fault_after = next((f.after for f in active_faults(cfg) if f.kind == "garbage-output"), 0)
        self.scored = 0  # teacher-forced scorings answered (return_logprob from position 0)
        self.accept_collapsed = any(f.kind == "accept-collapse" and f.at_s == 0 for f in active_faults(cfg))

    def _observe(self, name: str, value: float) -> None:
        for observe in self.observers:
            observe(name, value)

    def flush_cache(self) -> None:
        self._seen_prompts.clear()

    # -- submission ----------------------------------------------------------------------------

    def prompt_tokens_for(self, text: str | None, input_ids: list[int] | None) -> int:
        if input_ids is not None:
            return max(1, len(input_ids))
        return max(1, math.ceil(len((text or "").encode()) / 4))

    def submit(self, prompt_tokens: int, max_new_tokens: int, key: str | None = None) -> Request:
        cached = 0
        if key is not None:
            if key in self._seen_prompts:
                cached = prompt_tokens - 1
            elif len(self._seen_prompts) < 4096:
                self._seen_prompts[key] = prompt_tokens
        req = Request(prompt_tokens, max(0, max_new_tokens), cached)
        self.counters.requests += 1
        self.counters.prompt_tokens += prompt_tokens
        self.waiting.append(req)
        if self.wedged and self.busy_since is None:
            self.busy_since = time.monotonic()
        self._wake.set()
        return req

    def abort(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
            self.counters.aborted += 1
        elif req in self.waiting:
            self.waiting.remove(req)
            self.counters.aborted += 1

    @property
    def num_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    # -- faults --------------------------------------------------------------------------------

    def wedge(self) -> None:
        self.wedged = True
        if self.num_requests and self.busy_since is None:
            self.busy_since = time.monotonic()

    def degrade(self, factor: float) -> None:
        self.rate_multiplier *= degrade_multiplier(factor)

    # -- the batch loop ------------------------------------------------------------------------

    def token_usage(self, extra: int = 0) -> float:
        used = sum(r.prompt_tokens + r.generated for r in self.running) + extra
        return used / self.kv_tokens if self.kv_tokens else 0.0

    def true_single_stream_tps(self) -> float:
        return throughput.single_stream_tps(self.profile, eager=self.eager) * self.rate_multiplier

    async def run(self) -> None:
        """Long because: the scheduler's one loop (wake, heartbeat, prefill, paced decode step, stats
        line, finish) paced against an absolute schedule; the pacing variables live across
        iterations, so the steps share them.
        """
        loop = asyncio.get_running_loop()
        window_tokens = 0
        window_start = loop.time()
        steps_since_log = 0
        # Decode steps are paced against an absolute schedule: relative sleeps would add the loop's
        # own overhead to every step and run several percent slower than the modelled rate.
        next_at: float | None = None
        beat_at = float("-inf")
        while True:
            if self.wedged:
                await self._unwedge.wait()  # never set: a wedged scheduler stays wedged
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                window_start = loop.time()
                window_tokens = 0
                next_at = None
                continue
            if self.heartbeat is not None and loop.time() - beat_at >= HEARTBEAT_S:
                await self.heartbeat()
                beat_at = loop.time()
            if self.waiting and len(self.running) < self.profile.max_running_requests:
                await self._prefill()
                next_at = None
                continue
            batch = len(self.running)
            step = throughput.step_seconds(self.profile, batch, eager=self.eager) / self.rate_multiplier
            k = max(1, math.ceil(_MIN_WAKE_S / step))
            k = min(k, max(1, min(r.max_new_tokens - r.generated for r in self.running)))
            now_loop = loop.time()
            if next_at is None or now_loop - next_at > _MAX_LAG_S:
                next_at = now_loop  # a fresh stretch, or too far behind to catch up honestly
            next_at += k * step
            await asyncio.sleep(max(0.0, next_at - now_loop))
            if self.wedged:
                continue
            accept = 1.0 if self.accept_collapsed else throughput.accept_length(self.profile)
            now = time.monotonic()
            finished: list[Request] = []
            for req in self.running:
                produced = 0
                for _ in range(k):
                    if req.done:
                        break
                    req.acc += accept
                    n = max(1, int(req.acc))
                    req.acc -= n
                    n = min(n, req.max_new_tokens - req.generated)
                    req.generated += n
                    req.verify_ct += 1
                    produced += n
                if req.first_token_at is None and produced:
                    req.first_token_at = now
                self._observe("itl", k * step / max(produced, 1))
                window_tokens += produced
                self.counters.generation_tokens += produced
                req.updates.put_nowait(produced)
                if req.done:
                    req.finished_at = now
                    finished.append(req)
            if self.eager:
                self.counters.decode_eager_passes += k
            else:
                self.counters.decode_graph_passes += k
            steps_since_log += k
            for req in finished:
                self.running.remove(req)
                self._observe("e2e", now - req.created)
                req.updates.put_nowait(-1)
            if steps_since_log >= self.cfg.decode_log_interval:
                elapsed = loop.time() - window_start
                self.last_gen_throughput = window_tokens / elapsed if elapsed > 0 else 0.0
                self._decode_line(batch)
                steps_since_log = 0
                window_tokens = 0
                window_start = loop.time()

    async def _prefill(self) -> None:
        room = self.profile.max_running_requests - len(self.running)
        new = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
        new_tokens = sum(r.prompt_tokens - r.cached_tokens for r in new)
        seconds = throughput.prefill_seconds(self.profile, new_tokens) / self.rate_multiplier
        await asyncio.sleep(seconds)
        graph = self.cfg.prefill_backend != "disabled"
        if graph:
            self.counters.prefill_graph_passes += 1
        else:
            self.counters.prefill_eager_passes += 1
        usage = self._usage_prefill(new_tokens)
        self.log.tp0(
            f"Prefill batch, #new-seq: {len(new)}, #new-token: {new_tokens}, "
            f"#cached-token: {sum(r.cached_tokens for r in new)}, {usage}, "
            f"#running-req: {len(self.running)}, #queue-req: {len(self.waiting)}, #pending-token: 0, "
            f"{self._image_field()}cuda graph: {graph}, "
            f"input throughput (token/s): {new_tokens / max(seconds, 1e-6):.2f}"
        )
        now = time.monotonic()
        for req in new:
            self._observe("ttft", now - req.created)
            if req.max_new_tokens == 0:
                req.finished_at = now
                req.updates.put_nowait(-1)
            else:
                # the prefill forward emits the first token
                req.generated = 1
                req.verify_ct = 0
                req.first_token_at = now
                self.counters.generation_tokens += 1
                req.updates.put_nowait(1)
                if req.done:
                    req.finished_at = now
                    self._observe("e2e", now - req.created)
                    req.updates.put_nowait(-1)
                else:
                    self.running.append(req)

    def _image_field(self) -> str:
        return "waiting-image-req: 0, " if self.cfg.language_only else ""

    def _usage_prefill(self, new_tokens: int) -> str:
        usage = self.token_usage(new_tokens)
        if self.cfg.hybrid:
            return f"full token usage: {usage:.2f}, mamba usage: {len(self.running) / 64:.2f}"
        return f"token usage: {usage:.2f}"

    def _decode_line(self, batch: int) -> None:
        tokens = sum(r.prompt_tokens + r.generated for r in self.running)
        usage = self.token_usage()
        if self.cfg.hybrid:
            use = (
                f"#full token: {tokens}, full token usage: {usage:.2f}, mamba num: {batch}, "
                f"mamba usage: {batch / max(self.cfg.max_running_requests * 2, 1):.2f}"
            )
        else:
            use = f"#token: {tokens}, token usage: {usage:.2f}"
        spec = ""
        if self.cfg.speculative:
            accept = 1.0 if self.accept_collapsed else throughput.accept_length(self.profile)
            rate = (accept - 1) / max(self.cfg.spec_steps, 1)
            spec = f"accept len: {accept:.2f}, accept rate: {min(rate, 1.0):.2f}, "
        self.log.tp0(
            f"Decode batch, #running-req: {batch}, {use}, {spec}{self._image_field()}"
            f"cuda graph: {not self.eager}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {len(self.waiting)}"
        )
