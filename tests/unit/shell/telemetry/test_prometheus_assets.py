"""Operator assets: alert rules pass promtool's own unit tests, and every PromQL expression in the
alerts and the Grafana dashboard names only metrics we (or the engine) export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sglang_supervisor.shell.links.fleet import GatewayMetrics
from sglang_supervisor.shell.telemetry.gpu import GpuInfo, GpuProcess
from sglang_supervisor.shell.telemetry.metrics import GpuCollector, SupervisorMetrics
from tiers import apt_fix, require

ROOT = Path(__file__).resolve().parents[4]
PROM = ROOT / "etc" / "prometheus"
DASHBOARD = ROOT / "etc" / "grafana" / "sglang-supervisor.json"
ENGINE_METRICS = ROOT / "tests" / "fixtures" / "sglang-0.5.17-h200" / "graphs.metrics.txt"
NAME = re.compile(r"\b(sglang_supervisor_[a-zA-Z0-9_]+|sglang:[a-zA-Z0-9_:]+)")


def our_metric_names() -> set[str]:
    gpu = GpuInfo(0, "GPU-0", "H200", "9.0", "580", 1, 2, 0.5, 60.0, 87.0, 300.0, 700.0, 1.9e9, (),
                  (GpuProcess(1, 1),))
    m = SupervisorMetrics(gpu_collector=GpuCollector(lambda: [gpu], our_pids=lambda: {1}))
    m.restart("x")
    m.start_attempt("p", "ready")
    m.capture_seconds("target_decode", 1.0)
    m.fidelity_check("mismatch")
    GatewayMetrics(m.registry)  # present with gateway.url set
    return {s.name for fam in text_string_to_metric_families(m.exposition().decode()) for s in fam.samples}


def engine_metric_names() -> set[str]:
    text = ENGINE_METRICS.read_text()
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def alert_exprs() -> Iterator[tuple[str, str]]:
    rules = yaml.safe_load((PROM / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            yield f"alert {rule['alert']}", rule["expr"]


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())

    def walk(node: Any, where: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, dict):
            title = node.get("title", where)
            for key, value in node.items():
                if key in ("expr", "definition") and isinstance(value, str):
                    yield f"panel {title!r}", value
                elif key == "query" and isinstance(value, str) and "(" in value:
                    yield f"variable {node.get('name')}", value
                else:
                    yield from walk(value, title)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item, where)

    yield from walk(dash, "dashboard")


def test_every_expression_uses_exported_metrics() -> None:
    known = our_metric_names() | engine_metric_names()
    exprs = [*alert_exprs(), *dashboard_exprs()]
    assert len(exprs) > 20
    unknown = [(where, name) for where, expr in exprs for name in NAME.findall(expr) if name not in known]
    assert unknown == []
    used = {name for _, expr in exprs for name in NAME.findall(expr)}
    # The required families all appear in the dashboard or the alerts.
    for required in ("sglang_supervisor_probe_output_tokens_per_second", "sglang_supervisor_state",
                     "sglang_supervisor_restarts_total", "sglang_supervisor_fallback_level",
                     "sglang_supervisor_probe_ttft_seconds", "sglang_supervisor_gpu_memory_used_bytes"):
        assert required in used


def test_the_name_check_catches_a_typo() -> None:
    known = our_metric_names()
    assert [n for n in NAME.findall("rate(sglang_supervisor_restart_total[5m])") if n not in known]


def test_dashboard_has_the_promised_panels() -> None:
    dash = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"] for p in dash["panels"])
    for word in ("tok/s by profile", "first token", "state", "Restarts", "Fallbacks", "GPU"):
        assert word in titles
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_scrape_example_targets_the_default_address() -> None:
    cfg = yaml.safe_load((PROM / "scrape.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["sglang-supervisor"]["static_configs"][0]["targets"] == ["127.0.0.1:9400"]


@pytest.fixture
def promtool() -> str:
    path = shutil.which("promtool")
    require(path is not None, "promtool not installed", apt_fix("prometheus"))
    assert path is not None
    return path


def test_promtool_check_rules(promtool: str) -> None:
    proc = subprocess.run([promtool, "check", "rules", "alerts.yml"], cwd=PROM, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_test_rules(promtool: str) -> None:
    proc = subprocess.run([promtool, "test", "rules", "alerts.test.yml"], cwd=PROM, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
