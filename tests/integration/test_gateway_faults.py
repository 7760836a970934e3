"""The real `sglang-supervisor run` over the simulator with a misbehaving SGLang Model Gateway:
down, answering 500 or HTML, refusing our key, forgetting our worker id, slow. Each is a clear
warning and a metric; the engine reaches READY=1, keeps serving and stops cleanly on SIGTERM.
And /readyz turns 503 the moment SIGTERM arrives, before the drain (a slow DELETE) is over."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from supervised import Daemon, base_config, free_port, start, stop_cleanly

pytestmark = pytest.mark.integration

WID = "266e4c64-98d9-488e-ae16-e4ab2644efa4"


class FakeGateway(ThreadingHTTPServer):
    """POST/GET/DELETE /workers answering as told by `mode`; records every call."""

    def __init__(self, mode: str, delete_delay_s: float = 0.0) -> None:
        self.mode = mode
        self.delete_delay_s = delete_delay_s
        self.calls: list[tuple[float, str, str, str | None]] = []
        self.registered = False
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    server: FakeGateway

    def log_message(self, *_: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self) -> None:
        gw = self.server
        gw.calls.append((time.monotonic(), self.command, self.path, self.headers.get("authorization")))
        if gw.mode == "500":
            return self._send(500, b"internal error")
        if gw.mode == "html":
            return self._send(200, b"<html><body>Welcome to nginx!</body></html>", "text/html")
        if gw.mode == "echo-auth":  # a proxy's error page quoting the request it refused
            return self._send(400, f"bad request, you sent authorization: {self.headers.get('authorization')}"
                              .encode(), "text/plain")
        if gw.mode == "wrong-key" and self.headers.get("authorization") != "Bearer right":
            return self._send(401, b'{"error":"Unauthorized"}')
        if self.command == "POST":
            gw.registered = True
            return self._send(202, json.dumps({"status": "accepted", "worker_id": WID}).encode())
        if self.command == "DELETE":
            time.sleep(gw.delete_delay_s)
            if gw.mode == "flaky-delete" and sum(c[1] == "DELETE" for c in gw.calls) <= 2:
                return self._send(500, b"internal error")  # issue 29: a gateway busy at the drain
            if gw.mode == "forgetful":
                return self._send(404, json.dumps({"error": f"Worker {WID} not found",
                                                   "code": "WORKER_NOT_FOUND"}).encode())
            gw.registered = False
            return self._send(202, b'{"status":"accepted"}')
        workers = [{"id": WID, "url": "x", "is_healthy": True}] if gw.registered else []
        return self._send(200, json.dumps({"workers": workers}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._answer()

    do_GET = do_DELETE = _answer


def gateway_config(tmp_path: Path, url: str, **gateway: Any) -> dict[str, Any]:
    data = base_config(tmp_path)
    data["metrics"] = {"enabled": True, "address": "127.0.0.1:0"}
    data["gateway"] = {"url": url, "timeout_s": 1.0, "drain_s": 5.0, "retry_max_s": 1.0, **gateway}
    return data


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read()
            return r.status, json.loads(body) if body.startswith(b"{") else body.decode()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def counter(metrics_url: str, op: str, result: str) -> float:
    _, text = get(metrics_url + "/metrics")
    line = f'sglang_supervisor_gateway_calls_total{{op="{op}",result="{result}"}} '
    return float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])


@pytest.mark.parametrize(("mode", "problem"), [("down", "unreachable"), ("500", "server_error"),
                                               ("html", "garbage"), ("wrong-key", "unauthorized")])
def test_a_bad_gateway_costs_a_warning_and_a_metric_never_the_engine(
        tmp_path: Path, daemons: list[Daemon], mode: str, problem: str) -> None:
    gw = None if mode == "down" else FakeGateway(mode)
    url = gw.url if gw else f"http://127.0.0.1:{free_port()}"  # nothing listens there
    key = tmp_path / "gateway-key"
    key.write_text("wrong-key-0123456789\n")
    key.chmod(0o600)
    d = start(daemons, tmp_path, gateway_config(tmp_path, url, api_key_file=str(key)))
    d.notified("READY=1")
    metrics = str(d.event("metrics.listening")["url"])
    warn = d.event("gateway.unavailable", op="register")
    assert warn["problem"] == problem and warn["detail"]
    d.wait_for("a few register retries",
               lambda: counter(metrics, "register", problem) >= 2, timeout=30)
    # Still serving: ready for traffic, one warning for the whole streak, no engine restart.
    assert get(metrics + "/readyz") == (200, {"ready": True, "reason": "serving"})
    assert len([e for e in d.named("gateway.unavailable") if e.get("op") == "register"]) == 1
    assert d.named("engine.stop") == []
    if gw is not None and mode == "wrong-key":
        assert {c[3] for c in gw.calls} == {"Bearer wrong-key-0123456789"}
    stop_cleanly(d)
    if gw is not None:
        gw.shutdown()


def test_readyz_is_503_from_sigterm_on_and_an_unknown_id_on_delete_is_a_warning(
        tmp_path: Path, daemons: list[Daemon]) -> None:
    gw = FakeGateway("forgetful", delete_delay_s=2.0)
    d = start(daemons, tmp_path, gateway_config(tmp_path, gw.url, timeout_s=8.0))
    d.notified("READY=1")
    metrics = str(d.event("metrics.listening")["url"])
    d.event("gateway.registered", worker_id=WID)
    assert get(metrics + "/readyz")[0] == 200
    assert json.loads((tmp_path / "state" / "gateway.json").read_text())["worker_id"] == WID

    d.proc.send_signal(signal.SIGTERM)
    d.wait_for("the DELETE to arrive", lambda: any(c[1] == "DELETE" for c in gw.calls), timeout=30)
    # The slow DELETE is still in flight: the drain has not ended, the engine still runs.
    assert get(metrics + "/readyz") == (503, {"ready": False, "reason": "draining"})
    assert d.named("engine.stopped") == []
    assert get(metrics + "/livez")[0] == 200
    assert d.exit_code() == 0
    warn = d.event("gateway.unavailable", op="deregister")
    assert warn["problem"] == "unknown_worker" and "not found" in warn["detail"]
    drained = d.event("gateway.drained")
    assert drained["result"] == "drained" and drained["reason"] == "signal"
    stopped = d.event("engine.stopped")
    assert stopped["reason"] == "signal"
    assert not (tmp_path / "state" / "gateway.json").exists()
    gw.shutdown()


def test_a_delete_answered_500_is_retried_before_the_engine_stops(
        tmp_path: Path, daemons: list[Daemon]) -> None:
    gw = FakeGateway("flaky-delete")
    d = start(daemons, tmp_path, gateway_config(tmp_path, gw.url, drain_s=20.0))
    d.notified("READY=1")
    d.event("gateway.registered", worker_id=WID)
    d.proc.send_signal(signal.SIGTERM)
    assert d.exit_code() == 0
    drained = d.event("gateway.drained")
    assert drained["result"] == "drained" and drained["deregistered"] is True
    assert drained["deregister_attempts"] == 3 and drained["still_listed"] is False
    # Every DELETE (two refused, the third taken) happened before the engine was told to stop.
    deletes = [c for c in gw.calls if c[1] == "DELETE"]
    assert len(deletes) == 3
    names = [e.get("event") for e in d.events]
    assert names.index("gateway.drained") < names.index("engine.stopped")
    assert not (tmp_path / "state" / "gateway.json").exists()
    gw.shutdown()


def test_a_registration_left_by_a_killed_supervisor_is_removed_by_the_next_one(
        tmp_path: Path, daemons: list[Daemon]) -> None:
    gw = FakeGateway("ok")
    data = gateway_config(tmp_path, gw.url)
    d = start(daemons, tmp_path, data)
    d.event("gateway.registered", worker_id=WID)
    d.proc.send_signal(signal.SIGKILL)  # no drain, no DELETE: the id stays in gateway.json
    d.proc.wait(30)
    assert json.loads((tmp_path / "state" / "gateway.json").read_text())["worker_id"] == WID
    assert not any(c[1] == "DELETE" for c in gw.calls)

    again = start(daemons, tmp_path, data)
    again.event("gateway.stale_removed", worker_id=WID)
    again.event("gateway.registered", worker_id=WID)
    methods = [c[1] for c in gw.calls]
    assert methods.index("DELETE") < len(methods) - 1 - methods[::-1].index("POST")  # DELETE first
    stop_cleanly(again)
    gw.shutdown()


def test_the_gateway_key_is_never_printed_even_when_the_gateway_quotes_it(
        tmp_path: Path, daemons: list[Daemon]) -> None:
    gw = FakeGateway("echo-auth")
    secret = "gw-0123456789abcdef-secret"
    key = tmp_path / "gateway-key"
    key.write_text(secret + "\n")
    key.chmod(0o600)
    d = start(daemons, tmp_path, gateway_config(tmp_path, gw.url, api_key_file=str(key)))
    d.notified("READY=1")
    metrics = str(d.event("metrics.listening")["url"])
    warn = d.event("gateway.unavailable", op="register")
    assert warn["problem"] == "rejected" and "you sent" in warn["detail"]
    assert {c[3] for c in gw.calls} == {f"Bearer {secret}"}  # the gateway did get it
    _, status = get(metrics + "/status")
    stop_cleanly(d)
    gw.shutdown()
    assert secret not in "\n".join(d.raw)
    assert secret not in json.dumps(status)
