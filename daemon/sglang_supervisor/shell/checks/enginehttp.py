"""Reading the engine's HTTP answers as untrusted data: bounded time, bounded size, typed failures.

Everything the engine (or whatever listens on its port) answers is input the supervisor does not
control: a body may trickle a byte a second, never end a line, nest JSON ten thousand deep or
carry NaN and 1e999. Every read of an engine answer goes through this module, so that each one
has a total deadline (not only httpx's per-read timeout), a size cap that holds before the bytes
are kept, and a JSON decoder that refuses what would crash or mislead the caller. Each failure is
an `EngineAnswerError` carrying a `Problem` (the vocabulary below) and a short, printable detail:
callers turn it into a failed probe or health result, never let it out of their loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import httpx

# --------------------------------------------------------------------------- the vocabulary


class Problem(str, Enum):
    """Why an engine answer was not usable (a metric label and a log field)."""

    TIMEOUT = "timeout"  # no complete answer before the deadline (a hang, or a trickle)
    TOO_LARGE = "too_large"  # the body (or one line of a stream) passed its size cap
    CONNECT = "connect"  # refused, reset, closed early, or not HTTP at all
    HTTP_STATUS = "http_status"  # an answer, but not the status the caller needs
    BAD_JSON = "bad_json"  # not JSON, or not UTF-8
    TOO_DEEP = "too_deep"  # JSON nested deeper than the caller accepts
    NON_FINITE = "non_finite"  # NaN, Infinity or a number that overflows a float
    BAD_SHAPE = "bad_shape"  # valid JSON, but not the structure the caller expects
    BAD_METRICS = "bad_metrics"  # not Prometheus text


class EngineAnswerError(Exception):
    """An engine answer the supervisor refuses. `str()` is safe to log (bounded, no body dump)."""

    def __init__(self, problem: Problem, detail: str, status: int | None = None) -> None:
        self.problem = problem
        self.detail = _clip(detail)
        self.status = status
        super().__init__(f"{problem.value}: {self.detail}")

    @property
    def timed_out(self) -> bool:
        """No answer in time: the engine may be wedged, unlike an answer it sent back."""
        return self.problem is Problem.TIMEOUT


# Caps. A probe's SSE line holds one chunk's cumulative text (max_new_tokens words plus meta):
# far below 1 MiB. Info documents (/server_info, /model_info) are tens of KiB; /metrics of a
# large TP engine a few hundred KiB.
MAX_LINE_BYTES = 1 << 20
MAX_JSON_BYTES = 4 << 20
MAX_METRICS_BYTES = 4 << 20
MAX_ERROR_BODY_BYTES = 4 << 10
# Deeper than any answer SGLang sends (server_info nests < 6); the decoder itself stops near
# Python's recursion limit, the walk below at this depth.
MAX_JSON_DEPTH = 32
_DETAIL_CHARS = 200
# Compressed bodies could expand past the cap inside one chunk: ask for none.
_HEADERS = {"Accept-Encoding": "identity"}


# The engine speaks plain HTTP on the port the supervisor gave it (ports.base_url): its clients
# need no TLS, yet httpx builds a context for every client, by default with the whole CA bundle
# loaded (~3 MB the first, ~1 MB each further one: a twentieth of the supervisor's RSS target).
# One context shared by every engine client, trusting no CA: an https URL would fail, never pass
# unchecked.
@functools.cache
def _no_tls() -> ssl.SSLContext:
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def engine_client(timeout: httpx.Timeout | float = 5.0,
                  limits: httpx.Limits | None = None) -> httpx.AsyncClient:
    """An HTTP client for the engine's port (plain HTTP: no CA bundle, see `_no_tls`)."""
    return httpx.AsyncClient(timeout=timeout, verify=_no_tls(),
                             limits=limits or httpx.Limits(max_connections=100, max_keepalive_connections=20))


def _clip(text: str) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text[: _DETAIL_CHARS * 2])
    return text[:_DETAIL_CHARS] + ("..." if len(text) > _DETAIL_CHARS else "")


def _http_problem(exc: BaseException, url: str) -> EngineAnswerError:
    if isinstance(exc, httpx.TimeoutException):
        return EngineAnswerError(Problem.TIMEOUT, f"{type(exc).__name__} from {url}")
    return EngineAnswerError(Problem.CONNECT, f"{type(exc).__name__} from {url}: {exc}")


# --------------------------------------------------------------------------- JSON


def _refuse_constant(name: str) -> Any:
    raise EngineAnswerError(Problem.NON_FINITE, f"{name} in a JSON answer")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise EngineAnswerError(Problem.NON_FINITE, f"{text[:40]} overflows a float")
    return value


def _float_sized_int(text: str) -> int:
    # An integer no float can hold would overflow the first arithmetic done on it (tok/s).
    if len(text.lstrip("-")) > 308:
        raise EngineAnswerError(Problem.NON_FINITE, f"an integer of {len(text)} digits overflows a float")
    return int(text)


def json_depth(value: object) -> int:
    """Nesting depth of decoded JSON (a scalar is 0), iterative: deep input cannot recurse here."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def parse_json(data: bytes | bytearray | str, *, max_depth: int = MAX_JSON_DEPTH,
               what: str = "answer") -> Any:
    """Pure: decode untrusted JSON. NaN/Infinity/1e999, nesting deeper than `max_depth`, invalid
    UTF-8 and integers too long to convert are `EngineAnswerError`s, never other exceptions."""
    try:
        text = data if isinstance(data, str) else data.decode("utf-8")
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                           parse_int=_float_sized_int)
    except RecursionError:
        raise EngineAnswerError(Problem.TOO_DEEP, f"{what}: JSON nested too deep to decode") from None
    except EngineAnswerError as exc:
        raise EngineAnswerError(exc.problem, f"{what}: {exc.detail}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, int digit limit, bad UTF-8
        raise EngineAnswerError(Problem.BAD_JSON, f"{what}: {exc}") from None
    if json_depth(value) > max_depth:
        raise EngineAnswerError(Problem.TOO_DEEP, f"{what}: JSON nested deeper than {max_depth}")
    return value


def parse_json_object(data: bytes | bytearray | str, *, what: str = "answer") -> dict[str, Any]:
    value = parse_json(data, what=what)
    if not isinstance(value, dict):
        raise EngineAnswerError(Problem.BAD_SHAPE,
                                f"{what}: expected a JSON object, got {type(value).__name__}")
    return value


# --------------------------------------------------------------------------- bounded reads


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes | bytearray

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def _merge(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {**_HEADERS, **(headers or {})}


def _too_large(url: str, cap: int) -> EngineAnswerError:
    return EngineAnswerError(Problem.TOO_LARGE, f"answer from {url} is larger than {cap} bytes")


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    *,
    deadline_s: float,
    max_bytes: int = MAX_JSON_BYTES,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    json_body: Any = None,
) -> Answer:
    """One request, its whole body read within `deadline_s` (connect to last byte) and at most
    `max_bytes` kept. Raises only `EngineAnswerError`."""

    async def read() -> Answer:
        async with client.stream(method, url, headers=_merge(headers), json=json_body,
                                 timeout=deadline_s) as resp:
            body = bytearray()  # grows in place: no second copy of the body to join
            async for chunk in resp.aiter_bytes():
                if len(body) + len(chunk) > max_bytes:
                    raise _too_large(url, max_bytes)
                body += chunk
            return Answer(resp.status_code, body)

    try:
        return await asyncio.wait_for(read(), deadline_s)
    except asyncio.TimeoutError:
        raise EngineAnswerError(Problem.TIMEOUT,
                                f"no complete answer from {url} within {deadline_s:g} s") from None
    except (httpx.HTTPError, OSError) as exc:
        raise _http_problem(exc, url) from None
    except RuntimeError:
        # httpx refuses to send on a closed client: our own stop closed it under a request in
        # flight (a probe or health check of an engine being stopped), not the engine.
        if not client.is_closed:
            raise
        raise EngineAnswerError(Problem.CONNECT,
                                f"request to {url} not sent: the supervisor closed its HTTP client") from None


async def fetch_json(client: httpx.AsyncClient, url: str, *, deadline_s: float,
                     headers: Mapping[str, str] | None = None, what: str | None = None) -> Any:
    """GET a JSON document that must answer 200."""
    answer = await fetch(client, url, deadline_s=deadline_s, headers=headers)
    if answer.status != 200:
        raise EngineAnswerError(Problem.HTTP_STATUS, f"HTTP {answer.status} from {url}", answer.status)
    return parse_json(answer.body, what=what or url)


def fetch_sync(
    client: httpx.Client,
    url: str,
    *,
    deadline_s: float,
    max_bytes: int = MAX_JSON_BYTES,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """`fetch` for synchronous callers (doctor). The deadline is checked after every chunk, and
    no single read waits longer than what is left of it."""
    end = time.monotonic() + deadline_s
    try:
        with client.stream("GET", url, headers=_merge(headers), timeout=deadline_s) as resp:
            body = bytearray()
            for chunk in resp.iter_bytes():
                if len(body) + len(chunk) > max_bytes:
                    raise _too_large(url, max_bytes)
                body += chunk
                if time.monotonic() > end:
                    raise EngineAnswerError(Problem.TIMEOUT,
                                            f"no complete answer from {url} within {deadline_s:g} s")
            return Answer(resp.status_code, body)
    except (httpx.HTTPError, OSError) as exc:
        raise _http_problem(exc, url) from None


async def bounded_lines(resp: httpx.Response, max_line: int = MAX_LINE_BYTES) -> AsyncIterator[str]:
    """The lines of a streaming body, none longer than `max_line` bytes: httpx's own
    `aiter_lines` keeps a line that never ends in memory whole (one run reached 9 GB). The
    caller bounds the total time (the stream may be endless)."""
    buf = bytearray()  # grows in place: no copy of the pending line per chunk
    async for chunk in resp.aiter_bytes():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            buf += chunk[start:end]
            yield buf.rstrip(b"\r").decode("utf-8", "replace")
            buf.clear()
            start = end + 1
        buf += chunk[start:]
        if len(buf) > max_line:
            raise EngineAnswerError(Problem.TOO_LARGE,
                                    f"a line of the stream is longer than {max_line} bytes")
    if buf:
        yield buf.rstrip(b"\r").decode("utf-8", "replace")
