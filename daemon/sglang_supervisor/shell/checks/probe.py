"""Throughput probe: one streaming `/generate` of a fixed, versioned shape, measured client-side.

The maths (`stream_stats`) is pure and works on `(seconds since send, chunk)` pairs so it can be
tested on hand-computed streams. The HTTP shell (`probe_once`, `probe_many`, `engine_load`) never
raises for engine misbehaviour: errors, garbage bodies and hangs become `ProbeResult(ok=False)`.

Decode tok/s counts tokens with the server's `completion_tokens`, not chunks: speculative decoding
and `--stream-interval` put several tokens in one chunk.

Long because: the probe's shape, its pure stream maths, the HTTP shell that runs it and the /health
and /metrics reads the same loop makes: one measured exchange with the engine, whose parts are
tested against each other (hand-computed streams, the simulator).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import secrets
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from sglang_supervisor.engine.api import (
    GENERATE_ROUTE,
    GET_LOAD_ROUTE,
    MAX_COUNT,
    METRICS_ROUTE,
    EngineLoad,
    EngineMetrics,
    count_or_none,
    parse_engine_metrics,
    parse_get_load,
)
from sglang_supervisor.shell.checks.enginehttp import (
    MAX_ERROR_BODY_BYTES,
    MAX_METRICS_BYTES,
    EngineAnswerError,
    Problem,
    bounded_lines,
    engine_client,
    fetch,
    fetch_json,
    parse_json,
)

SHAPE_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class ProbeShape:
    """What one probe asks for. `name` is part of the baseline fingerprint: change the prompt
    recipe and you must bump `SHAPE_VERSION`, or old baselines would be compared with new probes."""

    name: str
    input_tokens: int
    max_new_tokens: int


def make_shape(input_tokens: int = 256, max_new_tokens: int = 128) -> ProbeShape:
    if input_tokens < 1 or max_new_tokens < 2:
        raise ValueError(
            f"probe shape needs input_tokens >= 1 and max_new_tokens >= 2 "
            f"(got {input_tokens}, {max_new_tokens}): decode tok/s needs two tokens"
        )
    return ProbeShape(f"{SHAPE_VERSION}-in{input_tokens}-out{max_new_tokens}", input_tokens, max_new_tokens)


DEFAULT_SHAPE = make_shape(256, 128)

# Natural text rather than random ids: random tokens collapse speculative acceptance, which would
# make a probe of an EAGLE/NGRAM profile look slower than real traffic.
_FILLER_TEXT = (
    "The supervisor measures how fast the language model server writes text so that an operator "
    "learns about a slowdown before the users do and can read why it happened in the log"
)
_FILLER = _FILLER_TEXT.split()


def build_prompt(shape: ProbeShape, nonce: str | None = None) -> str:
    """About `shape.input_tokens` tokens (one short English word is roughly one token).

    The random nonce goes FIRST: the radix cache matches prefixes, so a new first token makes the
    whole prompt a cache miss and every probe pays the same prefill."""
    nonce = nonce if nonce is not None else secrets.token_hex(8)
    words = [f"[{nonce}]"]
    words.extend(_FILLER[i % len(_FILLER)] for i in range(max(shape.input_tokens - 1, 0)))
    return " ".join(words)


@dataclass(frozen=True, slots=True)
class StreamStats:
    ttft_s: float | None
    decode_tps: float | None
    itl_p50_s: float | None
    itl_p90_s: float | None
    e2e_s: float | None
    completion_tokens: int
    completion_tokens_from_server: bool  # False: counted chunks (the server sent no meta_info)
    prompt_tokens: int | None
    spec_accept_length: float | None
    content_chunks: int
    error: str | None  # an error object the server put in the stream


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 1]."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _meta(chunk: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = chunk.get("meta_info")
    return meta if isinstance(meta, Mapping) else {}


def _float_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > MAX_COUNT:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _chunk_error(chunk: Mapping[str, Any]) -> str | None:
    err = chunk.get("error")
    if err is None and chunk.get("object") == "error":
        err = chunk.get("message", "error")
    if err is None:
        return None
    if isinstance(err, Mapping):
        err = err.get("message", err)
    return str(err)[:300]


def stream_stats(events: Sequence[tuple[float, Mapping[str, Any]]]) -> StreamStats:
    """Measure one stream. `events` are `(seconds since the request was sent, decoded chunk)`.

    A chunk carries content when the server's cumulative `completion_tokens` grew (or, without
    meta_info, when it has text or output ids). TTFT is the first such chunk; decode tok/s is
    (n - 1) / (t_last - t_first) over content chunks, n the server's final completion_tokens;
    ITL percentiles are the gaps between content chunks; e2e is the last event.
    """
    content_times: list[float] = []
    last_reported: int | None = None
    chunk_count = 0
    prompt_tokens: int | None = None
    spec_accept: float | None = None
    error: str | None = None
    for t, chunk in events:
        err = _chunk_error(chunk)
        if err is not None:
            error = error or err
            continue
        meta = _meta(chunk)
        reported = count_or_none(meta.get("completion_tokens"))
        if reported is not None:
            has_content = reported > (last_reported or 0)
            last_reported = max(reported, last_reported or 0)
        else:
            has_content = bool(chunk.get("text")) or bool(chunk.get("output_ids"))
        if has_content:
            content_times.append(t)
            chunk_count += 1
        prompt_tokens = count_or_none(meta.get("prompt_tokens")) or prompt_tokens
        accept = _float_or_none(meta.get("spec_accept_length"))
        spec_accept = accept if accept is not None else spec_accept

    from_server = last_reported is not None
    n = last_reported if last_reported is not None else chunk_count
    ttft = content_times[0] if content_times else None
    decode_tps: float | None = None
    if n >= 2 and len(content_times) >= 2 and content_times[-1] > content_times[0]:
        decode_tps = (n - 1) / (content_times[-1] - content_times[0])
    gaps = sorted(b - a for a, b in itertools.pairwise(content_times))
    return StreamStats(
        ttft_s=ttft,
        decode_tps=decode_tps,
        itl_p50_s=_percentile(gaps, 0.5) if gaps else None,
        itl_p90_s=_percentile(gaps, 0.9) if gaps else None,
        e2e_s=events[-1][0] if events else None,
        completion_tokens=n,
        completion_tokens_from_server=from_server,
        prompt_tokens=prompt_tokens,
        spec_accept_length=spec_accept,
        content_chunks=len(content_times),
        error=error,
    )


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    error: str | None
    ttft_s: float | None = None
    decode_tps: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    e2e_s: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    spec_accept_length: float | None = None
    started_at: float = field(default_factory=time.time)  # wall clock (epoch seconds)
    shape: str = DEFAULT_SHAPE.name
    # No (complete) answer in time: the engine may be wedged, unlike an error it sent back.
    timed_out: bool = False
    problem: str | None = None  # an `enginehttp.Problem` value when the answer was refused


    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def result_from_stats(stats: StreamStats, shape: ProbeShape, started_at: float) -> ProbeResult:
    """Judge a measured stream: a probe is ok only if it produced a decode rate."""
    error = stats.error
    if error is None and stats.content_chunks == 0:
        error = "the stream ended without any generated token"
    elif error is None and stats.decode_tps is None:
        error = f"too few tokens to measure decode speed ({stats.completion_tokens})"
    return ProbeResult(
        ok=error is None,
        error=error,
        ttft_s=stats.ttft_s,
        decode_tps=stats.decode_tps,
        itl_p50_s=stats.itl_p50_s,
        itl_p90_s=stats.itl_p90_s,
        e2e_s=stats.e2e_s,
        completion_tokens=stats.completion_tokens,
        prompt_tokens=stats.prompt_tokens,
        spec_accept_length=stats.spec_accept_length,
        started_at=started_at,
        shape=shape.name,
    )


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def _stream_generate(
    client: httpx.AsyncClient, url: str, payload: dict[str, Any], headers: dict[str, str]
) -> list[tuple[float, dict[str, Any]]]:
    """The SSE events of one generation. Lines are bounded (`bounded_lines`), JSON is decoded by
    `parse_json`; the caller bounds the total time."""
    events: list[tuple[float, dict[str, Any]]] = []
    t0 = time.perf_counter()
    async with client.stream("POST", url, json=payload, headers=headers) as resp:
        if resp.status_code != 200:
            body = b""
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) >= MAX_ERROR_BODY_BYTES:
                    break
            text = body[:200].decode("utf-8", "replace").strip()
            raise EngineAnswerError(Problem.HTTP_STATUS, f"HTTP {resp.status_code} from {url}: {text}",
                                    resp.status_code)
        async for line in bounded_lines(resp):
            if not line.startswith("data:"):
                continue  # SSE comments, blank separators
            data = line[5:].strip()
            if data == "[DONE]":
                events.append((time.perf_counter() - t0, {}))
                break
            try:
                chunk = parse_json(data, what="event stream")
            except EngineAnswerError as exc:
                if exc.problem is Problem.BAD_JSON:
                    raise EngineAnswerError(Problem.BAD_JSON,
                                            f"garbage in the event stream: {data[:120]!r}") from None
                raise
            if not isinstance(chunk, dict):
                raise EngineAnswerError(Problem.BAD_SHAPE, f"unexpected event in the stream: {data[:120]!r}")
            events.append((time.perf_counter() - t0, chunk))
    return events


async def probe_once(
    client: httpx.AsyncClient,
    base_url: str,
    shape: ProbeShape = DEFAULT_SHAPE,
    api_key: str | None = None,
    timeout: float = 120.0,
) -> ProbeResult:
    """One streaming generation within `timeout` seconds in all. Never raises for what the server
    does: every misbehaviour is a failed result with its `problem` (`enginehttp.Problem`)."""
    started_at = time.time()
    payload = {
        "text": build_prompt(shape),
        "sampling_params": {"max_new_tokens": shape.max_new_tokens, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }
    url = base_url.rstrip("/") + GENERATE_ROUTE
    headers = {**_headers(api_key), "Accept-Encoding": "identity"}

    def failed(problem: Problem, error: str) -> ProbeResult:
        return ProbeResult(ok=False, error=error or problem.value, started_at=started_at, shape=shape.name,
                           timed_out=problem is Problem.TIMEOUT, problem=problem.value)

    try:
        events = await asyncio.wait_for(_stream_generate(client, url, payload, headers), timeout)
    except asyncio.TimeoutError:
        return failed(Problem.TIMEOUT, f"no complete answer within {timeout:g} s")
    except EngineAnswerError as exc:
        return failed(exc.problem, exc.detail)
    except httpx.TimeoutException as exc:  # the client's own connect/read timeout
        return failed(Problem.TIMEOUT, f"{type(exc).__name__}: no answer in time")
    except (httpx.HTTPError, OSError) as exc:
        return failed(Problem.CONNECT, f"{type(exc).__name__}: {exc}"[:300])
    except RuntimeError:
        # httpx refuses to send on a client closed under a probe in flight: our own stop did
        # that (the engine is being stopped), not the engine.
        if not client.is_closed:
            raise
        return failed(Problem.CONNECT, "not sent: the supervisor closed its HTTP client (stopping)")
    return result_from_stats(stream_stats(events), shape, started_at)


@dataclass(frozen=True, slots=True)
class ProbeReport:
    shape: ProbeShape
    concurrency: int
    results: tuple[ProbeResult, ...]
    aggregate_tps: tuple[float, ...]  # per round: sum of tokens of its ok probes / round wall time

    @property
    def ok(self) -> tuple[ProbeResult, ...]:
        return tuple(r for r in self.results if r.ok)

    @property
    def failed(self) -> int:
        return len(self.results) - len(self.ok)

    def median(self, attr: str) -> float | None:
        values = [v for r in self.ok if isinstance(v := getattr(r, attr), (int, float))]
        return statistics.median(values) if values else None

    @property
    def median_decode_tps(self) -> float | None:
        return self.median("decode_tps")

    @property
    def median_aggregate_tps(self) -> float | None:
        return statistics.median(self.aggregate_tps) if self.aggregate_tps else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": asdict(self.shape),
            "concurrency": self.concurrency,
            "runs": len(self.aggregate_tps),
            "ok": len(self.ok),
            "failed": self.failed,
            "median_decode_tps": self.median_decode_tps,
            "median_ttft_s": self.median("ttft_s"),
            "median_itl_p50_s": self.median("itl_p50_s"),
            "median_itl_p90_s": self.median("itl_p90_s"),
            "median_e2e_s": self.median("e2e_s"),
            "median_aggregate_tps": self.median_aggregate_tps,
            "spec_accept_length": self.median("spec_accept_length"),
            "errors": sorted({r.error for r in self.results if r.error}),
            "results": [r.to_dict() for r in self.results],
        }


async def probe_many(
    base_url: str,
    shape: ProbeShape = DEFAULT_SHAPE,
    runs: int = 3,
    concurrency: int = 1,
    *,
    api_key: str | None = None,
    timeout: float = 120.0,
    client: httpx.AsyncClient | None = None,
) -> ProbeReport:
    """`runs` rounds of `concurrency` simultaneous probes; rounds are sequential."""
    if runs < 1 or concurrency < 1:
        raise ValueError(f"runs and concurrency must be >= 1 (got {runs}, {concurrency})")
    own = client is None
    http = client or engine_client(httpx.Timeout(timeout, connect=min(timeout, 10.0)),
                                   limits=httpx.Limits(max_connections=concurrency + 2))
    results: list[ProbeResult] = []
    aggregate: list[float] = []
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            batch = await asyncio.gather(
                *(probe_once(http, base_url, shape, api_key, timeout) for _ in range(concurrency))
            )
            wall = time.perf_counter() - t0
            results.extend(batch)
            tokens = sum(r.completion_tokens for r in batch if r.ok)
            if tokens and wall > 0:
                aggregate.append(tokens / wall)
    finally:
        if own:
            await http.aclose()
    return ProbeReport(shape, concurrency, tuple(results), tuple(aggregate))


async def read_engine_metrics(
    client: httpx.AsyncClient, base_url: str, api_key: str | None = None, timeout: float = 5.0
) -> EngineMetrics:
    """The engine's `/metrics` within `timeout` s and `MAX_METRICS_BYTES`. Raises only
    `EngineAnswerError` (HTTP_STATUS 404 when the engine runs without --enable-metrics)."""
    url = base_url.rstrip("/") + METRICS_ROUTE
    answer = await fetch(client, url, deadline_s=timeout, max_bytes=MAX_METRICS_BYTES,
                         headers=_headers(api_key))
    if answer.status != 200:
        raise EngineAnswerError(Problem.HTTP_STATUS, f"HTTP {answer.status} from {url}", answer.status)
    try:
        return parse_engine_metrics(answer.text())
    except ValueError as exc:
        raise EngineAnswerError(Problem.BAD_METRICS, f"{url}: {exc}") from None


async def engine_metrics(
    client: httpx.AsyncClient, base_url: str, api_key: str | None = None, timeout: float = 5.0
) -> EngineMetrics | None:
    """The engine's `/metrics` (only with --enable-metrics); None when absent or unreadable."""
    try:
        return await read_engine_metrics(client, base_url, api_key, timeout)
    except EngineAnswerError:
        return None


async def read_get_load(
    client: httpx.AsyncClient, base_url: str, api_key: str | None = None, timeout: float = 5.0
) -> EngineLoad | None:
    """SGLang's `/get_load` within `timeout` s; None when unreadable."""
    try:
        body = await fetch_json(client, base_url.rstrip("/") + GET_LOAD_ROUTE, deadline_s=timeout,
                                headers=_headers(api_key), what=GET_LOAD_ROUTE)
    except EngineAnswerError:
        return None
    return parse_get_load(body)


async def engine_load(
    client: httpx.AsyncClient, base_url: str, api_key: str | None = None, timeout: float = 5.0
) -> EngineLoad | None:
    """Running and queued requests, from `/metrics` or else `/get_load`; None when unknown."""
    m = await engine_metrics(client, base_url, api_key, timeout)
    if m is not None and m.running is not None and m.queued is not None:
        return EngineLoad(m.running, m.queued, "metrics")
    return await read_get_load(client, base_url, api_key, timeout)


@dataclass(frozen=True, slots=True)
class HealthResult:
    ok: bool
    why: str  # "HTTP 200", or what went wrong
    problem: str | None = None  # an `enginehttp.Problem` value when there was no usable answer


async def check_health(client: httpx.AsyncClient, url: str, timeout: float) -> HealthResult:
    """One health check: 200 within `timeout` s, body included (a body that never ends is no
    answer), at most `MAX_ERROR_BODY_BYTES` of it. Never raises for what the server does."""
    try:
        answer = await fetch(client, url, deadline_s=timeout, max_bytes=MAX_ERROR_BODY_BYTES)
    except EngineAnswerError as exc:
        why = f"no answer within {timeout:g} s" if exc.timed_out else exc.detail
        return HealthResult(False, why, exc.problem.value)
    if answer.status != 200:
        return HealthResult(False, f"HTTP {answer.status}", Problem.HTTP_STATUS.value)
    return HealthResult(True, "HTTP 200")


def decode_counters(m: EngineMetrics | None) -> tuple[float | None, ...] | None:
    """The /metrics counters that only grow while the engine decodes (`wedge.counters_grew`)."""
    if m is None:
        return None
    return (m.generation_tokens_total, m.decode_graph_passes, m.decode_eager_passes)
