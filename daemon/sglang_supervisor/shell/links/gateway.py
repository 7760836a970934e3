"""A small client for the SGLang Model Gateway's worker API (PyPI `sglang-router`).

The gateway is untrusted input like the engine: every call has one total deadline (connect, send
and the whole answer) and every answer a size cap; anything unexpected becomes a typed
`GatewayAnswer` with a `problem` from a small set (a metric label) and a one-line `detail` for the
log, never an exception.

The API, as the gateway serves it (checked against sglang-router 0.3.2):
  POST   /workers {"url": U[, "api_key": K]}
                               202 {"worker_id": ID, ...}  (asynchronous; the same URL gives the same ID)
  GET    /workers              200 {"workers": [{"id": ID, "url": U, "is_healthy": bool, ...}], ...}
  DELETE /workers/{ID}         202 (asynchronous); 404 for an ID it does not know
Parsing is pure (`parse_add`, `parse_remove`, `parse_workers`) so each odd answer has a unit test.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import httpx

# Answers the worker API gives are a few KiB; a megabyte is a broken or hostile gateway.
MAX_ANSWER_BYTES = 1 << 20
# Worker ids are UUIDs today; accept any short token, refuse what could smuggle a path or a header.
_WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")

Problem = Literal[
    "unreachable", "timeout", "unauthorized", "unknown_worker", "server_error", "rejected",
    "garbage", "too_large",
]
PROBLEMS: tuple[str, ...] = ("unreachable", "timeout", "unauthorized", "unknown_worker",
                             "server_error", "rejected", "garbage", "too_large")


@dataclass(frozen=True)
class WorkerView:
    worker_id: str | None
    url: str
    healthy: bool | None


@dataclass(frozen=True)
class GatewayAnswer:
    ok: bool
    status: int | None = None
    problem: Problem | None = None
    detail: str = ""
    worker_id: str | None = None
    workers: tuple[WorkerView, ...] = field(default_factory=tuple)

    @property
    def result(self) -> str:
        """The metric label: "ok" or the problem."""
        return "ok" if self.ok else (self.problem or "garbage")


def _snippet(body: bytes) -> str:
    """A short printable head of an answer for the log (HTML error pages included)."""
    text = body[:120].decode("utf-8", "replace")
    return re.sub(r"[^\x20-\x7e]", "?", text).strip()


def _failure(status: int, body: bytes, *, on_404: Problem = "rejected") -> GatewayAnswer:
    head = _snippet(body)
    if status in (401, 403):
        return GatewayAnswer(False, status, "unauthorized",
                             f"HTTP {status}: the gateway refused our key; check gateway.api_key_file "
                             "against the gateway's --api-key")
    if status == 404:
        return GatewayAnswer(False, status, on_404, f"HTTP 404: {head}")
    if status >= 500:
        return GatewayAnswer(False, status, "server_error", f"HTTP {status}: {head}")
    return GatewayAnswer(False, status, "rejected", f"HTTP {status}: {head}")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: a deeply nested answer well inside the size cap (not a ValueError).
        return None


def parse_add(status: int, body: bytes) -> GatewayAnswer:
    """POST /workers: 200/201/202 with a worker id."""
    if status not in (200, 201, 202):
        return _failure(status, body)
    data = _json(body)
    wid = data.get("worker_id") if isinstance(data, Mapping) else None
    if not isinstance(wid, str) or not _WORKER_ID.match(wid):
        return GatewayAnswer(False, status, "garbage",
                             f"HTTP {status} without a usable worker_id: {_snippet(body)!r}")
    return GatewayAnswer(True, status, worker_id=wid)


def parse_remove(status: int, body: bytes) -> GatewayAnswer:
    """DELETE /workers/{id}: 200/202/204; 404 means the gateway does not know the id."""
    if status in (200, 202, 204):
        return GatewayAnswer(True, status)
    return _failure(status, body, on_404="unknown_worker")


def parse_workers(status: int, body: bytes) -> GatewayAnswer:
    """GET /workers: the list, each entry's id, URL and health (other fields ignored)."""
    if status != 200:
        return _failure(status, body)
    data = _json(body)
    entries = data.get("workers") if isinstance(data, Mapping) else data
    if not isinstance(entries, list):
        return GatewayAnswer(False, status, "garbage", f"no worker list in {_snippet(body)!r}")
    views: list[WorkerView] = []
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("url"), str):
            return GatewayAnswer(False, status, "garbage",
                                 f"a worker entry without a url: {_snippet(body)!r}")
        wid = entry.get("id", entry.get("worker_id"))
        healthy = entry.get("is_healthy", entry.get("healthy"))
        views.append(WorkerView(wid if isinstance(wid, str) else None, entry["url"],
                                healthy if isinstance(healthy, bool) else None))
    return GatewayAnswer(True, status, workers=tuple(views))


def valid_worker_id(worker_id: str) -> bool:
    return bool(_WORKER_ID.match(worker_id))


class GatewayClient:
    """The worker API over one httpx client. Every method returns a GatewayAnswer."""

    def __init__(self, base_url: str, *, api_key: str | None, timeout_s: float,
                 max_bytes: int = MAX_ANSWER_BYTES, transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(headers=headers, transport=transport,
                                         timeout=httpx.Timeout(timeout_s), follow_redirects=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def add_worker(self, engine_url: str, engine_api_key: str | None = None) -> GatewayAnswer:
        """Register `engine_url`; with the engine's API key, so the gateway can call it (the key
        goes in the body, the gateway's `WorkerConfigRequest.api_key`; never into a log)."""
        body: dict[str, Any] = {"url": engine_url}
        if engine_api_key:
            body["api_key"] = engine_api_key
        answer = await self._call("POST", "/workers", body)
        return answer if isinstance(answer, GatewayAnswer) else parse_add(*answer)

    async def remove_worker(self, worker_id: str) -> GatewayAnswer:
        if not valid_worker_id(worker_id):
            return GatewayAnswer(False, None, "garbage", f"refusing to send worker id {worker_id[:40]!r}")
        answer = await self._call("DELETE", "/workers/" + quote(worker_id, safe=""), None)
        return answer if isinstance(answer, GatewayAnswer) else parse_remove(*answer)

    async def workers(self) -> GatewayAnswer:
        answer = await self._call("GET", "/workers", None)
        return answer if isinstance(answer, GatewayAnswer) else parse_workers(*answer)

    async def _call(self, method: str, path: str, body: Mapping[str, Any] | None
                    ) -> GatewayAnswer | tuple[int, bytes]:
        """(status, body) read in full within the deadline and the cap, or the failure."""
        try:
            return await asyncio.wait_for(self._read(method, path, body), self.timeout_s)
        except asyncio.TimeoutError:
            return GatewayAnswer(False, None, "timeout",
                                 f"no complete answer within gateway.timeout_s={self.timeout_s:g} s")
        except _TooLarge:
            return GatewayAnswer(False, None, "too_large", f"answer over {self.max_bytes} bytes refused")
        except httpx.TimeoutException:
            return GatewayAnswer(False, None, "timeout", f"timed out after {self.timeout_s:g} s")
        except (httpx.HTTPError, OSError) as exc:
            why = f"{type(exc).__name__}: {exc}"[:200]
            return GatewayAnswer(False, None, "unreachable", f"{self.base_url}: {why}")

    async def _read(self, method: str, path: str, body: Mapping[str, Any] | None) -> tuple[int, bytes]:
        async with self._client.stream(method, self.base_url + path, json=body) as resp:
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > self.max_bytes:
                    raise _TooLarge
                chunks.append(chunk)
            return resp.status_code, b"".join(chunks)


class _TooLarge(Exception):
    pass
