"""gateway: the worker API client. Every odd answer is a typed GatewayAnswer, never an exception:
no answer, 500, an HTML page, a wrong key, an unknown worker id, a huge or endless answer."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable

import httpx
import pytest

from sglang_supervisor.shell.links.gateway import (
    GatewayAnswer,
    GatewayClient,
    parse_add,
    parse_remove,
    parse_workers,
)

WID = "266e4c64-98d9-488e-ae16-e4ab2644efa4"
# What sglang-router 0.3.2 answers (captured from the real gateway).
ADD_202 = json.dumps({"status": "accepted", "worker_id": WID, "url": "http://127.0.0.1:31871",
                      "location": f"/workers/{WID}",
                      "message": "Worker addition queued for background processing"}).encode()
LIST_200 = json.dumps({"workers": [{"id": WID, "url": "http://127.0.0.1:31871", "is_healthy": True,
                                    "load": 0, "worker_type": "regular"}],
                       "total": 1, "stats": {"regular_count": 1}}).encode()
NOT_FOUND_404 = json.dumps({"error": f"Worker {WID} not found", "code": "WORKER_NOT_FOUND"}).encode()
HTML = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


def test_parse_add() -> None:
    assert parse_add(202, ADD_202) == GatewayAnswer(True, 202, worker_id=WID)
    assert parse_add(202, b"{}").problem == "garbage"
    assert parse_add(202, HTML).problem == "garbage"
    assert parse_add(202, json.dumps({"worker_id": "../../admin"}).encode()).problem == "garbage"
    assert parse_add(500, b"oops").problem == "server_error"
    assert parse_add(401, b"").problem == "unauthorized"
    assert "api_key_file" in parse_add(403, b"").detail
    assert parse_add(404, b"").problem == "rejected"  # no /workers: not a gateway we know


def test_parse_remove() -> None:
    assert parse_remove(202, b"{}").ok
    assert parse_remove(204, b"").ok
    unknown = parse_remove(404, NOT_FOUND_404)
    assert unknown.problem == "unknown_worker" and "not found" in unknown.detail
    assert parse_remove(400, b"bad id").problem == "rejected"
    assert parse_remove(503, HTML).problem == "server_error"


def test_parse_workers() -> None:
    ans = parse_workers(200, LIST_200)
    assert ans.ok and [(w.worker_id, w.url, w.healthy) for w in ans.workers] == [
        (WID, "http://127.0.0.1:31871", True)]
    assert parse_workers(200, b'{"workers": []}').workers == ()
    assert parse_workers(200, HTML).problem == "garbage"
    assert parse_workers(200, b'{"workers": [{"id": 1}]}').problem == "garbage"
    assert parse_workers(200, b'{"workers": "x"}').problem == "garbage"


def mock(handler: Callable[[httpx.Request], httpx.Response], **kw: object) -> GatewayClient:
    return GatewayClient("http://gw.invalid", api_key=kw.get("key"),  # type: ignore[arg-type]
                         timeout_s=2.0, transport=httpx.MockTransport(handler))


def test_client_sends_the_api_calls_the_gateway_expects() -> None:
    seen: list[tuple[str, str, bytes, str | None]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.method, req.url.path, req.content, req.headers.get("authorization")))
        if req.method == "POST":
            return httpx.Response(202, content=ADD_202)
        if req.method == "GET":
            return httpx.Response(200, content=LIST_200)
        return httpx.Response(202, content=b"{}")

    async def go() -> list[GatewayAnswer]:
        c = mock(handler, key="s3cret")
        try:
            return [await c.add_worker("http://127.0.0.1:31871"), await c.workers(),
                    await c.remove_worker(WID)]
        finally:
            await c.aclose()

    add, lst, rm = asyncio.run(go())
    assert add.worker_id == WID and lst.ok and rm.ok
    assert [(m, p) for m, p, _, _ in seen] == [("POST", "/workers"), ("GET", "/workers"),
                                               ("DELETE", f"/workers/{WID}")]
    assert json.loads(seen[0][2]) == {"url": "http://127.0.0.1:31871"}
    assert {h for *_, h in seen} == {"Bearer s3cret"}


def test_the_engine_key_goes_in_the_body_so_the_gateway_can_call_the_engine() -> None:
    bodies: list[bytes] = []

    def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(req.content)
        return httpx.Response(202, content=ADD_202)

    async def go() -> GatewayAnswer:
        c = mock(handler)
        try:
            return await c.add_worker("http://e:1", "engine-key")
        finally:
            await c.aclose()

    assert asyncio.run(go()).ok
    assert json.loads(bodies[0]) == {"url": "http://e:1", "api_key": "engine-key"}


def test_a_worker_id_that_could_inject_a_path_is_never_sent() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise AssertionError("no request may be sent")

    async def go() -> GatewayAnswer:
        c = mock(handler)
        try:
            return await c.remove_worker("../admin?x=1")
        finally:
            await c.aclose()

    assert asyncio.run(go()).problem == "garbage"


def test_wrong_key_500_and_html_are_typed() -> None:
    answers = {"/a": httpx.Response(401, content=b'{"error":"Unauthorized"}'),
               "/b": httpx.Response(500, content=b"internal"),
               "/c": httpx.Response(200, content=HTML, headers={"content-type": "text/html"})}
    problems = []
    for base, resp in answers.items():
        async def go(resp: httpx.Response = resp, base: str = base) -> GatewayAnswer:
            c = GatewayClient("http://gw.invalid" + base, api_key="wrong", timeout_s=2.0,
                              transport=httpx.MockTransport(lambda _r: resp))
            try:
                return await c.add_worker("http://e:1")
            finally:
                await c.aclose()
        problems.append(asyncio.run(go()).problem)
    assert problems == ["unauthorized", "server_error", "garbage"]


def test_nothing_listening_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused

        async def go() -> GatewayAnswer:
            c = GatewayClient(f"http://127.0.0.1:{port}", api_key=None, timeout_s=2.0)
            try:
                return await c.workers()
            finally:
                await c.aclose()

        ans = asyncio.run(go())
    assert ans.problem == "unreachable" and f"127.0.0.1:{port}" in ans.detail


async def _serve(reply: Callable[[asyncio.StreamWriter], object]) -> tuple[asyncio.AbstractServer, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            await reply(writer)  # type: ignore[misc]
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_an_answer_that_never_ends_hits_the_total_deadline() -> None:
    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        while True:  # a byte every 50 ms: each read is quick, the whole answer never ends
            writer.write(b"1\r\n \r\n")
            await writer.drain()
            await asyncio.sleep(0.05)

    async def go() -> GatewayAnswer:
        server, port = await _serve(trickle)
        c = GatewayClient(f"http://127.0.0.1:{port}", api_key=None, timeout_s=0.5)
        try:
            return await c.workers()
        finally:
            await c.aclose()
            server.close()

    ans = asyncio.run(go())
    assert ans.problem == "timeout" and "gateway.timeout_s" in ans.detail


def test_a_huge_answer_is_cut_at_the_cap() -> None:
    async def flood(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10000000\r\n\r\n")
        for _ in range(100):
            writer.write(b"[" * 100_000)
            await writer.drain()

    async def go() -> GatewayAnswer:
        server, port = await _serve(flood)
        c = GatewayClient(f"http://127.0.0.1:{port}", api_key=None, timeout_s=5.0, max_bytes=64 * 1024)
        try:
            return await c.workers()
        finally:
            await c.aclose()
            server.close()

    assert asyncio.run(go()).problem == "too_large"


@pytest.mark.parametrize("status", [200, 202, 204])
def test_remove_success_codes(status: int) -> None:
    assert parse_remove(status, b"").ok
