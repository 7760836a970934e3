"""fleet.GatewayAgent over a scripted gateway (httpx.MockTransport): registration with retries,
the drain before a planned stop, the persisted id, and bad gateways -- each a warning and a
metric, never an exception, and the drain always ends within its bound."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import structlog
from prometheus_client import CollectorRegistry

from sglang_supervisor.core.config import GatewaySettings
from sglang_supervisor.core.rotation import Registration
from sglang_supervisor.shell.links.fleet import RECORD_FILE, GatewayAgent
from sglang_supervisor.shell.links.gateway import GatewayClient

WID = "266e4c64-98d9-488e-ae16-e4ab2644efa4"
ENGINE = "http://127.0.0.1:30000"


class FakeGateway:
    """A scripted gateway: `script[method]` answers in turn (the last one repeats)."""

    def __init__(self, **script: list[httpx.Response]) -> None:
        self.script = script
        self.calls: list[tuple[str, str]] = []
        self.listed = True

    def __call__(self, req: httpx.Request) -> httpx.Response:
        self.calls.append((req.method, req.url.path))
        answers = self.script.get(req.method)
        if answers:
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            if req.method == "DELETE" and answer.status_code < 300:
                self.listed = False  # the removal job done
            return answer
        if req.method == "POST":
            return httpx.Response(202, json={"worker_id": WID})
        if req.method == "DELETE":
            self.listed = False
            return httpx.Response(202, json={"status": "accepted"})
        workers = [{"id": WID, "url": ENGINE, "is_healthy": True}] if self.listed else []
        return httpx.Response(200, json={"workers": workers})


def agent(tmp: Path, gw: Callable[[httpx.Request], httpx.Response], **settings: Any
          ) -> tuple[GatewayAgent, CollectorRegistry]:
    reg = CollectorRegistry()
    s = GatewaySettings(url="http://gw.invalid", **{"drain_s": 2.0, "retry_max_s": 0.5, **settings})
    client = GatewayClient("http://gw.invalid", api_key=None, timeout_s=1.0,
                           transport=httpx.MockTransport(gw))
    return GatewayAgent(s, ENGINE, str(tmp), reg, api_key=None, client=client), reg


def calls(reg: CollectorRegistry, op: str, result: str) -> float:
    return reg.get_sample_value("sglang_supervisor_gateway_calls_total", {"op": op, "result": result}) or 0.0


async def until(pred: Callable[[], bool]) -> None:
    while not pred():
        await asyncio.sleep(0.01)


async def _idle() -> int | None:
    return 0


def drain_on_signal(tmp: Path, gw: FakeGateway, within_s: float | None, **settings: Any
                    ) -> tuple[str | None, CollectorRegistry, list[dict[str, Any]]]:
    """A registered agent drained on a signal, the engine idle, the drain bounded by `within_s`:
    its worker id after the drain (before aclose), its metrics and what it logged."""
    async def go() -> tuple[str | None, CollectorRegistry, list[dict[str, Any]]]:
        a, reg = agent(tmp, gw, **settings)
        a.worker_id = WID
        with structlog.testing.capture_logs() as logs:
            await asyncio.wait_for(a.drain("signal", _idle), within_s)
        worker_id = a.worker_id
        await a.aclose()
        return worker_id, reg, logs

    return asyncio.run(go())


def test_register_retries_until_the_gateway_answers_and_records_the_id(tmp_path: Path) -> None:
    gw = FakeGateway(POST=[httpx.Response(500, text="starting"), httpx.Response(503, text="busy"),
                           httpx.Response(202, json={"worker_id": WID})])

    async def go() -> None:
        a, reg = agent(tmp_path, gw)
        with structlog.testing.capture_logs() as logs:
            a.on_ready()
            await asyncio.wait_for(until(lambda: a.worker_id is not None), 10)
            await a.aclose()
        assert calls(reg, "register", "server_error") == 2 and calls(reg, "register", "ok") == 1
        assert reg.get_sample_value("sglang_supervisor_gateway_registered") == 1
        # One warning for the streak, one note when it recovered.
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["gateway.unavailable"]
        assert any(e["event"] == "gateway.recovered" for e in logs)

    asyncio.run(go())
    saved = json.loads((tmp_path / RECORD_FILE).read_text())
    assert saved == {"gateway_url": "http://gw.invalid", "engine_url": ENGINE, "worker_id": WID}


def test_drain_deregisters_first_then_waits_for_zero_in_flight(tmp_path: Path) -> None:
    gw = FakeGateway()
    loads = [3, 1, 0, 0]
    order: list[str] = []

    async def load() -> int | None:
        order.append(f"load after {len(gw.calls)} gateway calls")
        return loads.pop(0) if len(loads) > 1 else loads[0]

    async def go() -> CollectorRegistry:
        a, reg = agent(tmp_path, gw, drain_s=10.0)
        a.on_ready()
        await asyncio.wait_for(until(lambda: a.worker_id is not None), 5)
        await a.drain("signal", load)
        assert a.worker_id is None
        await a.aclose()
        return reg

    reg = asyncio.run(go())
    assert gw.calls[:2] == [("POST", "/workers"), ("DELETE", f"/workers/{WID}")]
    assert ("GET", "/workers") in gw.calls  # waited for the removal job
    first_load = int(order[0].split()[2])
    assert first_load >= 3  # no in-flight count before the gateway stopped routing to us
    assert reg.get_sample_value("sglang_supervisor_drains_total", {"result": "drained"}) == 1
    assert not (tmp_path / RECORD_FILE).exists()


def test_a_drain_never_outlives_drain_s_whatever_the_gateway_and_engine_do(tmp_path: Path) -> None:
    async def never_idle() -> int | None:
        return 5

    async def unknown() -> int | None:
        return None

    async def go() -> CollectorRegistry:
        a, reg = agent(tmp_path, FakeGateway(), drain_s=0.3)
        a.worker_id = WID
        await asyncio.wait_for(a.drain("reload", never_idle), 5)
        a.worker_id = WID
        await asyncio.wait_for(a.drain("reload", unknown), 5)
        await a.aclose()
        return reg

    reg = asyncio.run(go())
    assert reg.get_sample_value("sglang_supervisor_drains_total", {"result": "timeout"}) == 1
    assert reg.get_sample_value("sglang_supervisor_drains_total", {"result": "load_unknown"}) == 1


def test_a_gateway_failing_the_delete_gets_retries_and_the_drain_says_it_never_left(
        tmp_path: Path) -> None:
    """Issue 29: one DELETE against a 500, then "drained" after 0.26 s, was a lie."""
    gw = FakeGateway(DELETE=[httpx.Response(500, text="<html>oops</html>")])

    worker_id, reg, logs = drain_on_signal(tmp_path, gw, 5, drain_s=1.5)
    assert worker_id == WID  # still registered: the next start removes it
    deletes = sum(c[0] == "DELETE" for c in gw.calls)
    assert deletes >= 3 and calls(reg, "deregister", "server_error") == deletes
    line = next(e for e in logs if e["event"] == "gateway.drained")
    assert line["log_level"] == "warning" and line["result"] == "deregister_failed"
    assert line["deregistered"] is False and line["deregister_attempts"] == deletes
    assert "never" in line["hint"]
    assert reg.get_sample_value("sglang_supervisor_drains_total", {"result": "deregister_failed"}) == 1
    assert reg.get_sample_value("sglang_supervisor_drains_total", {"result": "drained"}) == 0
    warn = next(e for e in logs if e["event"] == "gateway.unavailable")
    assert "drain_s" in warn["hint"]  # the retry it promises is the one made


def test_a_delete_that_succeeds_on_a_retry_ends_in_an_honest_drained(tmp_path: Path) -> None:
    gw = FakeGateway(DELETE=[httpx.Response(500, text="busy"), httpx.Response(503, text="busy"),
                             httpx.Response(202, json={"status": "accepted"})])

    worker_id, _, logs = drain_on_signal(tmp_path, gw, 10, drain_s=10.0)
    assert worker_id is None
    line = next(e for e in logs if e["event"] == "gateway.drained")
    assert line["result"] == "drained" and line["log_level"] == "info"
    assert line["deregistered"] is True and line["deregister_attempts"] == 3
    assert line["still_listed"] is False
    methods = [c[0] for c in gw.calls]
    assert methods[:3] == ["DELETE"] * 3 and "GET" in methods[3:]  # the removal was checked


def test_a_gateway_that_keeps_listing_us_after_the_delete_is_named(tmp_path: Path) -> None:
    gw = FakeGateway(DELETE=[httpx.Response(202, json={"status": "accepted"})])

    # The job never completes: this gateway's list keeps our URL whatever DELETE said.
    gw.script["GET"] = [httpx.Response(200, json={"workers": [{"id": WID, "url": ENGINE}]})]
    _, _, logs = drain_on_signal(tmp_path, gw, 5, drain_s=0.5)
    line = next(e for e in logs if e["event"] == "gateway.drained")
    assert line["result"] == "still_listed" and line["still_listed"] is True
    assert line["log_level"] == "warning"


def test_a_crashed_engine_is_deregistered_once_and_the_warning_says_so(tmp_path: Path) -> None:
    gw = FakeGateway(DELETE=[httpx.Response(500, text="down")])

    async def go() -> list[dict[str, Any]]:
        a, _ = agent(tmp_path, gw)
        a.worker_id = WID
        with structlog.testing.capture_logs() as logs:
            a.on_engine_gone()
            await asyncio.wait_for(until(lambda: bool(gw.calls)), 5)
            await a.aclose()
        return logs

    logs = asyncio.run(go())
    assert gw.calls == [("DELETE", f"/workers/{WID}")]
    assert "not retried" in next(e for e in logs if e["event"] == "gateway.unavailable")["hint"]


def test_unknown_worker_on_delete_is_a_warning_and_counts_as_gone(tmp_path: Path) -> None:
    gw = FakeGateway(DELETE=[httpx.Response(404, json={"error": "not found", "code": "WORKER_NOT_FOUND"})])
    (tmp_path / RECORD_FILE).write_text(Registration("http://gw.invalid", ENGINE, WID).to_json())

    _, reg, logs = drain_on_signal(tmp_path, gw, None)
    assert calls(reg, "deregister", "unknown_worker") == 1
    warn = next(e for e in logs if e["event"] == "gateway.unavailable")
    assert warn["problem"] == "unknown_worker" and "not found" in warn["detail"]
    assert not (tmp_path / RECORD_FILE).exists()


def test_a_stale_registration_is_removed_at_start_before_registering_again(tmp_path: Path) -> None:
    stale = "11111111-2222-3333-4444-555555555555"
    (tmp_path / RECORD_FILE).write_text(Registration("http://gw.invalid", ENGINE, stale).to_json())
    gw = FakeGateway()

    async def go() -> None:
        a, _ = agent(tmp_path, gw)
        a.start()
        a.on_ready()
        await asyncio.wait_for(until(lambda: a.worker_id is not None), 5)
        await a.aclose()

    asyncio.run(go())
    assert gw.calls[:2] == [("DELETE", f"/workers/{stale}"), ("POST", "/workers")]
    assert json.loads((tmp_path / RECORD_FILE).read_text())["worker_id"] == WID


def test_a_damaged_record_is_ignored(tmp_path: Path) -> None:
    (tmp_path / RECORD_FILE).write_bytes(b"\x00garbage{")
    gw = FakeGateway()

    async def go() -> None:
        a, _ = agent(tmp_path, gw)
        a.start()
        await a.aclose()

    asyncio.run(go())
    assert gw.calls == []


def test_engine_gone_deregisters_in_the_background(tmp_path: Path) -> None:
    gw = FakeGateway()

    async def go() -> None:
        a, _ = agent(tmp_path, gw)
        a.worker_id = WID
        a.on_engine_gone()  # returns at once
        await asyncio.wait_for(until(lambda: a.worker_id is None), 5)
        await a.aclose()

    asyncio.run(go())
    assert gw.calls == [("DELETE", f"/workers/{WID}")]


def test_a_gateway_that_never_answers_costs_bounded_time(tmp_path: Path) -> None:
    async def go() -> CollectorRegistry:
        async def hang(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)
            writer.close()

        server = await asyncio.start_server(hang, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reg = CollectorRegistry()
        s = GatewaySettings(url=f"http://127.0.0.1:{port}", drain_s=1.0, timeout_s=0.3)
        a = GatewayAgent(s, ENGINE, str(tmp_path), reg, api_key=None)
        a.worker_id = WID

        async def idle() -> int | None:
            return 0

        await asyncio.wait_for(a.drain("signal", idle), 5)
        await a.aclose()
        server.close()
        return reg

    reg = asyncio.run(go())
    # Retried within drain_s (each retry bounded by what is left of it), then named as not done.
    assert calls(reg, "deregister", "timeout") >= 2
    assert reg.get_sample_value("sglang_supervisor_drains_total", {"result": "deregister_failed"}) == 1


def test_a_stop_before_any_registration_does_not_sit_out_drain_s(tmp_path: Path) -> None:
    gw = FakeGateway()

    async def unknown() -> int | None:
        return None  # an engine still loading has no HTTP yet

    async def go() -> CollectorRegistry:
        a, reg = agent(tmp_path, gw, drain_s=600.0)
        await asyncio.wait_for(a.drain("signal", unknown), 5)  # far less than drain_s
        await a.aclose()
        return reg

    reg = asyncio.run(go())
    assert gw.calls == []
    assert reg.get_sample_value("sglang_supervisor_drains_total", {"result": "load_unknown"}) == 0


def test_a_gateway_that_forgot_us_gets_us_again(tmp_path: Path) -> None:
    gw = FakeGateway()

    async def go() -> None:
        a, _ = agent(tmp_path, gw)
        a.watch_s = 0.05
        with structlog.testing.capture_logs() as logs:
            a.on_ready()
            await asyncio.wait_for(until(lambda: a.worker_id is not None), 5)
            gw.listed = False  # the gateway restarted: its list is empty
            await asyncio.wait_for(until(lambda: sum(c[0] == "POST" for c in gw.calls) >= 2), 5)
            await a.aclose()
        assert any(e["event"] == "gateway.forgot_us" for e in logs)

    asyncio.run(go())


def test_a_list_failing_during_the_drain_claims_no_retry(tmp_path: Path) -> None:
    gw = FakeGateway(GET=[httpx.Response(500, text="down")])

    _, _, logs = drain_on_signal(tmp_path, gw, 5)
    warn = next(e for e in logs if e["event"] == "gateway.unavailable" and e["op"] == "list")
    assert "not retried" in warn["hint"] and "retried with backoff" not in warn["hint"]
    line = next(e for e in logs if e["event"] == "gateway.drained")
    assert line["still_listed"] is None and line["result"] == "drained"
