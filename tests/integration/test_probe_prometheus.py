"""A real Prometheus server scrapes our metrics endpoint while a monitor probes an engine, and we
read the probe tok/s and the state back through Prometheus' HTTP API."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from probe_stub import MemoryStore, ProbeSettings, StubEngine, no_nvml
from prometheus_server import aquery, prometheus
from sglang_supervisor.shell.checks.monitor import ThroughputMonitor
from sglang_supervisor.shell.telemetry.gpu import Nvml
from sglang_supervisor.shell.telemetry.metrics import MetricsServer, SupervisorMetrics

pytestmark = pytest.mark.integration



SETTINGS = ProbeSettings(interval_s=0.2, max_new_tokens=32, timeout_s=10.0)


def test_prometheus_reads_probe_tps_and_state(tmp_path: Path) -> None:
    async def scenario() -> tuple[float, list[dict[str, Any]], float]:
        engine = StubEngine(tokens_per_second=400.0)
        await engine.start()
        metrics = SupervisorMetrics(with_gpu=False)
        metrics.set_state("ready")
        metrics.set_active_profile("fast", "0.5.17", "cafe01")
        server = MetricsServer("127.0.0.1:0", metrics, lambda: {"state": "ready"})
        await server.start()
        mon = ThroughputMonitor(engine.url, SETTINGS, metrics, MemoryStore(), lambda d, t: None,
                                baseline_key="k", profile="fast", primary="fast", nvml=Nvml(loader=no_nvml))
        try:
            with prometheus(tmp_path, [f"127.0.0.1:{server.port}"]) as prom:
                first = await mon.first_probe()
                assert first.ok, first.error
                run = asyncio.ensure_future(mon.run())
                deadline = time.monotonic() + 60
                tps: list[dict[str, Any]] = []
                state: list[dict[str, Any]] = []
                async with httpx.AsyncClient(base_url=prom.url, timeout=5) as c:
                    while time.monotonic() < deadline:
                        try:
                            tps = await aquery(c, "sglang_supervisor_probe_output_tokens_per_second")
                            state = await aquery(c, "sglang_supervisor_state == 1")
                        except httpx.HTTPError:
                            pass
                        if tps and state:
                            break
                        prom.check_alive()
                        await asyncio.sleep(0.5)
                mon.stop()
                await run
                return float(tps[0]["value"][1]) if tps else 0.0, state, engine.tokens_per_second
        finally:
            await server.stop()
            await engine.stop()

    tps, state, configured = asyncio.run(scenario())
    assert tps == pytest.approx(configured, rel=0.1)  # loose: this test is about the plumbing
    assert [s["metric"]["sglang_supervisor_state"] for s in state] == ["ready"]
