"""Hostile HTTP answers (`http:ENDPOINT:MODE` faults): an ASGI layer in front of the real routes.

What a broken or impersonated engine can send the supervisor: nothing at all, a late answer, a
body trickling a byte a second, garbage, JSON nested 100000 deep, a body without a newline that
never ends, NaN/Infinity/1e999 where numbers belong. `Engine.http_faults` (endpoint → mode) is
set by the launcher when a fault's time comes; routes without a fault pass through untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from sglang_supervisor.simulator import serving

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_ENDPOINTS = {
    "/generate": "generate",
    "/health": "health",
    "/health_generate": "health",
    "/metrics": "metrics",
    "/server_info": "server_info",
    "/get_server_info": "server_info",
    "/model_info": "model_info",
    "/get_model_info": "model_info",
    "/get_load": "load",
    "/v1/loads": "load",
}
SLOW_S = 120.0  # simulated seconds before a `slow` route answers
DEEP = 100_000  # nesting of `deep` JSON
_HUGE_CHUNK = b"a" * 65536


def endpoint_of(path: str) -> str | None:
    return _ENDPOINTS.get(path)


def _deep() -> bytes:
    return b"[" * DEEP + b"]" * DEEP


def _garbage(endpoint: str) -> bytes:
    if endpoint == "generate":
        return b"data: {\"text\": \"unterminated \xff\xfe\n\ndata: [DONE]\n\n"
    if endpoint == "metrics":
        return b"sglang:num_running_reqs{{{ not prometheus \xff\n"
    return b"<html>\xff\xfe not json at all"


def _nonfinite(endpoint: str) -> bytes:
    nan, inf = float("nan"), float("inf")
    if endpoint == "generate":
        chunk = {"text": "x", "meta_info": {"completion_tokens": inf, "prompt_tokens": nan}}
        return b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
    if endpoint == "metrics":
        return (b"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs NaN\n"
                b"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs +Inf\n"
                b"# TYPE sglang:generation_tokens_total counter\nsglang:generation_tokens_total 1e999\n")
    if endpoint == "load":
        return b'[{"dp_rank": 0, "num_reqs": 1e999, "num_waiting_reqs": NaN}]'
    body = {"model_path": "x", "is_generation": True, "version": "0.5.23",
            "internal_states": [{"last_gen_throughput": nan, "avg_spec_accept_length": inf}]}
    return json.dumps(body).encode().replace(b"Infinity", b"1e999", 1)


class Misbehave:
    """ASGI middleware: the active `http:` faults of `engine` replace the routes' answers."""

    def __init__(self, app: ASGIApp, engine: serving.Engine, scale: float) -> None:
        self.app = app
        self.engine = engine
        self.scale = scale

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = endpoint_of(scope.get("path", "")) if scope["type"] == "http" else None
        e = self.engine
        if endpoint == "health" and e.health_slow_s and e.num_requests and not e.draining:
            # The health request queues behind the running batch (SGLang #22511): decoding goes on.
            await asyncio.sleep(e.health_slow_s)
        mode = e.http_faults.get(endpoint) if endpoint else None
        if endpoint is None or mode is None:
            await self.app(scope, receive, send)
            return
        if mode == "slow":
            await asyncio.sleep(SLOW_S * self.scale)
            await self.app(scope, receive, send)
            return
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        try:
            await self._misbehave(endpoint, mode, send, gone)
        except OSError:
            pass  # the client went away mid-send
        finally:
            watcher.cancel()

    async def _misbehave(self, endpoint: str, mode: str, send: Send, gone: asyncio.Event) -> None:
        if mode == "hang":
            await gone.wait()  # never answers; the client's deadline ends it
            return
        content_type = b"text/event-stream" if endpoint == "generate" else b"application/json"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type)]})

        async def more(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        if mode == "trickle":
            await more(b"data: " if endpoint == "generate" else b"{")
            while not gone.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(gone.wait(), max(0.05, self.scale))
                await more(b" ")
            return
        if mode == "huge":
            if endpoint == "generate":
                await more(b"data: ")
            while not gone.is_set():  # as fast as the client reads; no newline, no end
                await more(_HUGE_CHUNK)
                await asyncio.sleep(0)
            return
        body = {"garbage": _garbage, "nonfinite": _nonfinite}.get(mode)
        data = body(endpoint) if body is not None else _deep()
        if mode == "deep" and endpoint == "generate":
            data = b"data: " + data + b"\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": data, "more_body": False})
