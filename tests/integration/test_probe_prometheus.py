"""A real Prometheus server scrapes our metrics endpoint while a monitor probes an engine, and we
read the probe tok/s and the state back through Prometheus' HTTP API."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from probe_stub import StubEngine
from sglang_supervisor.gpu import Nvml
from sglang_supervisor.metrics import MetricsServer, SupervisorMetrics
from sglang_supervisor.monitor import ThroughputMonitor
from tiers import require

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MemoryStore:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def baseline(self, key: str) -> Any:
        return None

    def set_baseline(self, key: str, value: float, now: float) -> bool:
        self.values[key] = value
        return True


class Settings:
    enabled = True
    interval_s = 0.2
    input_tokens = 16
    max_new_tokens = 32
    timeout_s = 10.0
    baseline_runs = 3
    regression_delta = 0.15
    regression_window = 3
    cooldown_s = 60.0
    act_on_regression = True


def _no_nvml(name: str) -> Any:
    raise ImportError("NVML is not used in this test")


async def _query(client: httpx.AsyncClient, expr: str) -> list[dict[str, Any]]:
    resp = await client.get("/api/v1/query", params={"query": expr})
    body = resp.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_prometheus_reads_probe_tps_and_state(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    require(binary is not None, "prometheus server not installed (Debian package prometheus)")
    assert binary is not None

    async def scenario() -> tuple[float, list[dict[str, Any]], float]:
        engine = StubEngine(tokens_per_second=400.0)
        await engine.start()
        metrics = SupervisorMetrics(with_gpu=False)
        metrics.set_state("ready")
        metrics.set_active_profile("fast", "0.5.17", "cafe01")
        server = MetricsServer("127.0.0.1:0", metrics, lambda: {"state": "ready"})
        await server.start()
        prom_port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n"
            "scrape_configs:\n  - job_name: sglang-supervisor\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{server.port}']\n"
        )
        prom_log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=prom_log,
        )
        mon = ThroughputMonitor(engine.url, Settings(), metrics, MemoryStore(), lambda d, t: None,
                                baseline_key="k", profile="fast", primary="fast", nvml=Nvml(loader=_no_nvml))
        try:
            first = await mon.first_probe()
            assert first.ok, first.error
            run = asyncio.ensure_future(mon.run())
            deadline = time.monotonic() + 60
            tps: list[dict[str, Any]] = []
            state: list[dict[str, Any]] = []
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{prom_port}", timeout=5) as c:
                while time.monotonic() < deadline:
                    try:
                        tps = await _query(c, "sglang_supervisor_probe_output_tokens_per_second")
                        state = await _query(c, "sglang_supervisor_state == 1")
                    except httpx.HTTPError:
                        pass
                    if tps and state:
                        break
                    assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
                    await asyncio.sleep(0.5)
            mon.stop()
            await run
            return float(tps[0]["value"][1]) if tps else 0.0, state, engine.tokens_per_second
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            prom_log.close()
            await server.stop()
            await engine.stop()

    tps, state, configured = asyncio.run(scenario())
    assert tps == pytest.approx(configured, rel=0.1)  # loose: this test is about the plumbing
    assert [s["metric"]["sglang_supervisor_state"] for s in state] == ["ready"]
