"""Supervisor metrics: names and units, bounded labels, GPU collector, promtool lint, HTTP endpoint."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_supervisor.shell.checks.probe import ProbeResult
from sglang_supervisor.shell.telemetry.gpu import GpuInfo, GpuProcess
from sglang_supervisor.shell.telemetry.metrics import (
    RESTART_REASONS,
    GpuCollector,
    MetricsServer,
    MetricsServerError,
    SupervisorMetrics,
)
from tiers import apt_fix, require


def h200(index: int = 0, reasons: tuple[str, ...] = ("sw_power_cap",)) -> GpuInfo:
    return GpuInfo(index, f"GPU-{index}", "NVIDIA H200", "9.0", "580", 3 * 2**30, 141 * 2**30, 0.5, 70.0,
                   87.0, 400.0, 700.0, 1.98e9, reasons, (GpuProcess(10, 2**30), GpuProcess(99, 2**20)))


def samples(m: SupervisorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m: SupervisorMetrics, metric: str, **labels: str) -> float:
    return samples(m)[(metric, tuple(sorted(labels.items())))]


def fed_metrics(with_gpu: bool = False) -> SupervisorMetrics:
    m = SupervisorMetrics(gpu_collector=GpuCollector(lambda: [h200()], our_pids=lambda: {10}),
                          with_gpu=with_gpu)
    m.set_state("ready")
    m.set_active_profile("fast", "0.5.17", "abc123", fallback_level=1)
    m.set_engine_up(True)
    m.restart("capture_oom")
    m.start_attempt("fast", "ready")
    m.startup_seconds(144.8)
    m.capture_seconds("target_decode", 3.42)
    m.set_baseline(500.0)
    m.observe_probe(ProbeResult(ok=True, error=None, ttft_s=0.012, decode_tps=450.0, itl_p50_s=0.0019,
                                itl_p90_s=0.0021, e2e_s=0.5, completion_tokens=128, prompt_tokens=256,
                                started_at=1_800_000_000.0))
    m.observe_probe(ProbeResult(ok=False, error="HTTP 500", started_at=1_800_000_100.0))
    m.set_ratio(0.9)
    m.set_passive_tps(3900.0)
    m.probe_cost(384, 0.5)
    m.decision("explained", ["gpu_throttle"])
    return m


def test_values_and_units() -> None:
    m = fed_metrics()
    assert value(m, "sglang_supervisor_state", sglang_supervisor_state="ready") == 1
    assert value(m, "sglang_supervisor_state", sglang_supervisor_state="starting") == 0
    assert value(m, "sglang_supervisor_active_profile_info", profile="fast", engine_version="0.5.17",
                 config_hash="abc123") == 1
    assert value(m, "sglang_supervisor_fallback_level") == 1
    assert value(m, "sglang_supervisor_engine_up") == 1
    assert value(m, "sglang_supervisor_restarts_total", reason="capture_oom") == 1
    assert value(m, "sglang_supervisor_start_attempts_total", profile="fast", result="ready") == 1
    assert value(m, "sglang_supervisor_startup_seconds") == 144.8
    assert value(m, "sglang_supervisor_capture_seconds", kind="target_decode") == 3.42
    assert value(m, "sglang_supervisor_probe_output_tokens_per_second") == 450.0
    assert value(m, "sglang_supervisor_probe_ttft_seconds") == 0.012
    assert value(m, "sglang_supervisor_probe_inter_token_latency_p90_seconds") == 0.0021
    assert value(m, "sglang_supervisor_probe_runs_total", result="ok") == 1
    assert value(m, "sglang_supervisor_probe_runs_total", result="failed") == 1
    assert value(m, "sglang_supervisor_baseline_output_tokens_per_second") == 500.0
    assert value(m, "sglang_supervisor_throughput_ratio") == pytest.approx(0.9)
    assert value(m, "sglang_supervisor_passive_output_tokens_per_second") == 3900.0
    assert value(m, "sglang_supervisor_last_probe_timestamp_seconds") == 1_800_000_100.0  # failed ones too
    assert value(m, "sglang_supervisor_probe_tokens_total") == 384
    assert value(m, "sglang_supervisor_probe_gpu_seconds_total") == 0.5
    assert value(m, "sglang_supervisor_regression_decisions_total", decision="explained") == 1
    assert value(m, "sglang_supervisor_slowdown_explanation", reason="gpu_throttle") == 1
    assert value(m, "sglang_supervisor_slowdown_explanation", reason="busy") == 0


def test_before_any_probe_ratio_is_nan_so_alerts_stay_quiet() -> None:
    m = SupervisorMetrics(with_gpu=False)
    r = value(m, "sglang_supervisor_throughput_ratio")
    assert r != r  # NaN


def test_ratio_is_the_policy_ratio_not_a_probe_that_raced_the_baseline() -> None:
    # The baseline's last probe is observed before the baseline exists: the ratio must still
    # follow the evaluation that /status reports (it stayed NaN until the next probe before).
    m = SupervisorMetrics(with_gpu=False)
    m.observe_probe(ProbeResult(ok=True, error=None, decode_tps=400.0, started_at=1.0))
    m.set_baseline(400.0)
    m.set_ratio(1.0)
    assert value(m, "sglang_supervisor_throughput_ratio") == 1.0
    m.set_ratio(None)
    r = value(m, "sglang_supervisor_throughput_ratio")
    assert r != r


def test_unknown_state_and_unbounded_labels_are_contained() -> None:
    m = SupervisorMetrics(with_gpu=False)
    m.set_state("something-new")
    assert value(m, "sglang_supervisor_state", sglang_supervisor_state="other") == 1
    for i in range(100):
        m.restart(f"reason_{i}")
    m.restart("bad label with spaces {}")
    reasons = {dict(k[1])["reason"] for k in samples(m) if k[0] == "sglang_supervisor_restarts_total"}
    assert len(reasons - set(RESTART_REASONS)) <= 32 and "other" in reasons
    assert value(m, "sglang_supervisor_restarts_total", reason="other") == 100 - 32 + 1


def test_every_restart_reason_exists_at_zero_from_the_start() -> None:
    # increase() cannot see a series' first increment when the series appears with it.
    m = SupervisorMetrics(with_gpu=False)
    for reason in ("capture_oom", "hang", "wedged", "child_crashed", "regression", "reload"):
        assert reason in RESTART_REASONS
        assert value(m, "sglang_supervisor_restarts_total", reason=reason) == 0
    for after_a_wait in ("gpu_busy", "port_in_use"):  # relaunched once the condition cleared
        assert after_a_wait in RESTART_REASONS
    assert "unknown_flag" not in RESTART_REASONS  # ends the run (78)


def test_gpu_collector_families_and_absence_without_nvml() -> None:
    m = fed_metrics(with_gpu=True)
    lv = {"gpu": "0", "uuid": "GPU-0", "name": "NVIDIA H200"}
    assert value(m, "sglang_supervisor_gpu_memory_used_bytes", **lv) == 3 * 2**30
    assert value(m, "sglang_supervisor_gpu_utilization_ratio", **lv) == 0.5
    assert value(m, "sglang_supervisor_gpu_power_watts", **lv) == 400.0
    assert value(m, "sglang_supervisor_gpu_sm_clock_hertz", **lv) == 1.98e9
    assert value(m, "sglang_supervisor_gpu_clock_throttle", reason="sw_power_cap", **lv) == 1
    assert value(m, "sglang_supervisor_gpu_clock_throttle", reason="hw_slowdown", **lv) == 0
    assert value(m, "sglang_supervisor_gpu_foreign_processes", **lv) == 1
    bare = SupervisorMetrics(gpu_collector=GpuCollector(lambda: None))
    assert not any(k[0].startswith("sglang_supervisor_gpu_") for k in samples(bare))


def test_promtool_check_metrics_is_clean() -> None:
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool not installed", apt_fix("prometheus"))
    assert promtool is not None
    text = fed_metrics(with_gpu=True).exposition()
    proc = subprocess.run([promtool, "check", "metrics"], check=False, input=text, capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    assert proc.stdout.strip() == b"" and proc.stderr.strip() == b"", proc.stderr.decode()


@pytest.mark.parametrize("address", ["9400", "localhost", ":9400", "host:port", "127.0.0.1:99999"])
def test_a_bad_listen_address_is_a_metrics_server_error(address: str) -> None:
    with pytest.raises(MetricsServerError, match="metrics address"):
        MetricsServer(address, SupervisorMetrics(with_gpu=False))


def test_server_serves_metrics_health_status_and_reports_a_taken_port() -> None:
    async def go() -> dict[str, Any]:
        m = fed_metrics()
        srv = MetricsServer("127.0.0.1:0", m, lambda: {"state": "ready", "profile": "fast"})
        await srv.start()
        out: dict[str, Any] = {}
        try:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                out["metrics"] = (await c.get("/metrics")).text
                out["healthz"] = (await c.get("/healthz")).status_code
                out["status"] = (await c.get("/status")).json()
            taken = MetricsServer(f"127.0.0.1:{srv.port}", m)
            with pytest.raises(MetricsServerError, match="cannot listen"):
                await taken.start()
        finally:
            await srv.stop()
        with socket.socket() as s:  # the port is free again after stop()
            s.bind(("127.0.0.1", srv.port))
        return out

    out = asyncio.run(go())
    assert "sglang_supervisor_probe_output_tokens_per_second 450.0" in out["metrics"]
    assert out["healthz"] == 200
    assert out["status"] == {"state": "ready", "profile": "fast"}


def test_status_provider_failure_is_a_500_not_a_crash() -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("boom")

    async def go() -> int:
        srv = MetricsServer("127.0.0.1:0", SupervisorMetrics(with_gpu=False), broken)
        await srv.start()
        try:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                return (await c.get("/status")).status_code
        finally:
            await srv.stop()

    assert asyncio.run(go()) == 500


def test_reload_results_count_a_rollback_as_not_successful() -> None:
    m = SupervisorMetrics(with_gpu=False)
    assert value(m, "sglang_supervisor_config_reloads_total", result="rolled_back") == 0
    m.reload_result("rolled_back")
    assert value(m, "sglang_supervisor_config_reloads_total", result="rolled_back") == 1
    assert value(m, "sglang_supervisor_config_last_reload_successful") == 0
    m.reload_result("applied")
    assert value(m, "sglang_supervisor_config_last_reload_successful") == 1
    assert value(m, "sglang_supervisor_config_reloads_total", result="applied") == 1
    m.restart("rollback")
    assert value(m, "sglang_supervisor_restarts_total", reason="rollback") == 1
