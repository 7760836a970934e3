"""deploy/kubernetes: valid against the Kubernetes schemas (kubernetes-validate, offline, strict),
and consistent with the supervisor's own configuration in the ConfigMap: probes on /readyz and
/livez of the supervisor's port, a grace period that covers drain + kill, /dev/shm in memory,
secrets from Secrets."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_supervisor.core.config import Config

pytestmark = pytest.mark.fleet

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
MANIFESTS = sorted(K8S.glob("*.yaml"))


def validate(tool: str, *paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool, "--strict", "--kubernetes-version", "1.33.0", *map(str, paths)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_manifests_pass_strict_schema_validation(k8s_validate: str) -> None:
    assert len(MANIFESTS) >= 4
    proc = validate(k8s_validate, *MANIFESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_validator_does_reject_a_broken_manifest(k8s_validate: str, tmp_path: Path) -> None:
    broken = (K8S / "deployment.yaml").read_text().replace("periodSeconds: 10", "periodSecondz: 10", 1)
    (tmp_path / "broken.yaml").write_text(broken)
    proc = validate(k8s_validate, tmp_path / "broken.yaml")
    assert proc.returncode != 0 and "periodSecondz" in proc.stdout + proc.stderr


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((K8S / name).read_text())
    return doc


def test_the_deployment_matches_the_supervisor_config() -> None:
    config = Config.model_validate(yaml.safe_load(load("configmap.yaml")["data"]["config.yaml"]))
    pod = load("deployment.yaml")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["engine"] == config.engine.port
    assert ports["supervisor"] == int(config.metrics.address.rsplit(":", 1)[1])
    assert config.metrics.address.startswith("0.0.0.0:")  # the kubelet probes the pod's IP
    probes = (("startupProbe", "/readyz"), ("readinessProbe", "/readyz"), ("livenessProbe", "/livez"))
    for probe, path in probes:
        assert c[probe]["httpGet"] == {"path": path, "port": "supervisor"}, probe
    t = config.timeouts
    gateway_drain = config.gateway.drain_s if config.gateway.enabled else 0.0
    assert pod["terminationGracePeriodSeconds"] >= gateway_drain + t.drain_s + t.kill_s
    # As if the gateway were on with its default drain: the comment's arithmetic holds.
    assert pod["terminationGracePeriodSeconds"] >= 30 + t.drain_s + t.kill_s
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "persistentVolumeClaim" in volumes[mounts["/cache"]]
    assert config.state_dir.startswith("/cache/")
    key_dir = str(Path(config.engine.api_key_file or "").parent)
    assert "secret" in volumes[mounts[key_dir]]
    assert volumes[mounts[key_dir]]["secret"]["defaultMode"] & 0o004 == 0  # not world-readable
    hf = next(e for e in c["env"] if e["name"] == "HF_TOKEN")
    assert "secretKeyRef" in hf["valueFrom"]
    assert c["command"][1] == "run" and config.logging.format == "json"
