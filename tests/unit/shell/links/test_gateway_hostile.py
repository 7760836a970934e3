"""A hostile gateway's answers, found by attacking what issue 14 landed: each is a typed answer,
never an exception out of the agent's background tasks or the drain before a stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sglang_supervisor.core import rotation
from sglang_supervisor.core.config import GatewaySettings
from sglang_supervisor.shell.links import gateway
from sglang_supervisor.shell.links.fleet import RECORD_FILE, GatewayAgent, read_gateway_key

# Within the 1 MiB cap, deep enough that json.loads raises RecursionError (not a ValueError).
DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize("parse", [gateway.parse_add, gateway.parse_workers])
def test_deeply_nested_json_is_garbage_not_an_exception(
        parse: Callable[[int, bytes], gateway.GatewayAnswer]) -> None:
    answer = parse(200, DEEP)
    assert not answer.ok
    assert answer.problem == "garbage"


def test_deeply_nested_json_under_the_worker_key_is_garbage() -> None:
    answer = gateway.parse_add(202, b'{"worker_id": ' + DEEP + b"}")
    assert (answer.ok, answer.problem) == (False, "garbage")


def test_a_deeply_nested_registration_record_is_no_record() -> None:
    # under the 4 KiB cap, deeper than json's recursion limit
    assert rotation.parse_registration(b"[" * 2000 + b"]" * 2000) is None


def test_a_damaged_registration_record_does_not_stop_the_agent_starting(tmp_path: Path) -> None:
    # gateway.json lives in the state dir: a crash here would crash-loop the unit at every start.
    (tmp_path / RECORD_FILE).write_bytes(b"[" * 3000)
    agent = GatewayAgent(GatewaySettings(url="http://127.0.0.1:9"), "http://127.0.0.1:30000",
                         str(tmp_path), CollectorRegistry(), api_key=None)
    agent.start()  # no stale registration to remove: nothing scheduled, nothing raised
    assert agent._stale_task is None


def test_a_gateway_key_too_short_to_redact_is_refused_with_the_fix(tmp_path: Path) -> None:
    # It is redacted from every log like the engine's key: "admin" would shred ordinary lines.
    key = tmp_path / "gw-key"
    key.write_text("admin\n")
    with pytest.raises(ValueError, match=r"5 characters long.*openssl rand"):
        read_gateway_key(str(key))
    key.write_text("0123456789abcdef\n")
    assert read_gateway_key(str(key)) == "0123456789abcdef"


def test_a_gateway_whose_list_hangs_cannot_stretch_the_drain_past_drain_s(tmp_path: Path) -> None:
    """DELETE answers at once, GET /workers never does: the wait for the gateway to drop us is
    part of gateway.drain_s (the documented stop bound), not one more gateway.timeout_s."""
    async def go() -> tuple[list[str], str | None]:
        seen: list[str] = []

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            request = (await reader.readuntil(b"\r\n\r\n")).decode()
            seen.append(request.split(" ", 1)[0])
            if request.startswith("DELETE"):
                writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
            else:
                await asyncio.sleep(60)  # a GET that never answers
            writer.close()

        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        s = GatewaySettings(url=f"http://127.0.0.1:{port}", drain_s=0.2, timeout_s=30.0)
        a = GatewayAgent(s, "http://127.0.0.1:30000", str(tmp_path), CollectorRegistry(), api_key=None)
        a.worker_id = "266e4c64-98d9-488e-ae16-e4ab2644efa4"

        async def idle() -> int | None:
            return 0

        try:
            # Before the fix the GET held the drain for its full 30 s call deadline.
            await asyncio.wait_for(a.drain("signal", idle), 10)
        finally:
            server.close()
        return seen, a.worker_id

    seen, worker_id = asyncio.run(go())
    assert seen[0] == "DELETE" and worker_id is None


@pytest.mark.parametrize(("gateway_url", "engine_url", "wrong"), [
    ("http://10.0.0.5:30080", "http://127.0.0.1:30000", True),  # engine.host 0.0.0.0, no advertise_url
    ("http://gw.inference.svc:30080", "http://[::1]:30000", True),
    ("http://gw.inference.svc:30080", "http://localhost:30000", True),
    ("http://127.0.0.1:30080", "http://127.0.0.1:30000", False),  # a gateway on this machine
    ("http://localhost:30080", "http://127.0.0.1:30000", False),
    ("http://10.0.0.5:30080", "http://10.0.0.7:30000", False),
])
def test_a_loopback_engine_url_advertised_to_a_remote_gateway_is_named(
        gateway_url: str, engine_url: str, wrong: bool) -> None:
    assert (rotation.advertise_problem(gateway_url, engine_url) is not None) is wrong


def test_the_agent_warns_at_start_when_it_would_advertise_loopback(tmp_path: Path) -> None:
    agent = GatewayAgent(GatewaySettings(url="http://10.0.0.5:30080"), "http://127.0.0.1:30000",
                         str(tmp_path), CollectorRegistry(), api_key=None)
    with capture_logs() as logs:
        agent.start()
    [warning] = [e for e in logs if e["event"] == "gateway.advertise_loopback"]
    assert "advertise_url" in warning["fix"] and warning["log_level"] == "warning"
