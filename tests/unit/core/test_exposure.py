"""Issue 29.5: exposure is never silent. A metrics port or an engine without a key off loopback
is a `check` warning (and a start-up `config.warning`); `/status` off loopback hides pids, paths
and fingerprints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.cli import main
from sglang_supervisor.core.config import Config, ConfigProblem, parse_config
from sglang_supervisor.core.exposure import (
    REDACTED,
    exposure_warnings,
    is_loopback,
    redact_status,
    status_redacted,
)
from sglang_supervisor.shell.files.configfile import load_config


def config(metrics: str = "127.0.0.1:9400", host: str = "127.0.0.1", key: bool = False,
           detail: str = "auto") -> Config:
    key_line = "  api_key_credential: engine-key\n" if key else ""
    return parse_config(
        f"engine:\n  command: [sglang, serve]\n  model_path: org/m\n  host: '{host}'\n{key_line}"
        f"metrics:\n  address: '{metrics}'\n  status_detail: {detail}\n"
        "profiles:\n  - name: tuned\n", "t")


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("gpu-host.example", False),
])
def test_loopback_is_only_what_surely_stays_here(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_the_defaults_expose_nothing() -> None:
    assert exposure_warnings(config()) == []


def test_metrics_on_every_address_is_a_warning_naming_the_redaction() -> None:
    (w,) = exposure_warnings(config(metrics="0.0.0.0:9400"))
    assert w.path == "metrics.address" and "0.0.0.0:9400" in w.problem
    assert "redacted" in w.problem and "127.0.0.1" in w.fix
    (w,) = exposure_warnings(config(metrics="0.0.0.0:9400", detail="full"))
    assert "in full" in w.problem


def test_an_engine_off_loopback_without_a_key_is_a_warning_and_with_one_is_not() -> None:
    (w,) = exposure_warnings(config(host="0.0.0.0"))
    assert w.path == "engine.host" and "without an API key" in w.problem
    assert "engine.api_key_file" in w.fix
    assert exposure_warnings(config(host="0.0.0.0", key=True)) == []


def test_check_prints_the_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("engine:\n  command: [sglang, serve]\n  model_path: org/m\n  version: 0.5.23\n"
                    "  host: 0.0.0.0\nmetrics:\n  address: 0.0.0.0:9400\n"
                    f"state_dir: {tmp_path / 'state'}\nprofiles:\n  - name: tuned\n")
    seen: list[ConfigProblem] = []
    load_config(path, on_warning=seen.append)
    assert [w.path for w in seen] == ["metrics.address", "engine.host"]
    assert main(["check", "--config", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [w["path"] for w in out["warnings"]] == ["metrics.address", "engine.host"]


def test_redaction_follows_the_bind_unless_configured() -> None:
    assert status_redacted("auto", "0.0.0.0:9400") and status_redacted("auto", "10.0.0.5:9400")
    assert not status_redacted("auto", "127.0.0.1:0")
    assert not status_redacted("full", "0.0.0.0:9400")
    assert status_redacted("redacted", "127.0.0.1:9400")


STATUS: dict[str, Any] = {
    "phase": "serving", "profile": "tuned", "tok_s": 54.2, "engine_pid": 4242,
    "engine_log": "/var/log/sglang/qwen.log", "fingerprint": "0123456789abcdef",
    "waiting_for": {"failure_class": "gpu_busy",
                    "detail": "GPU 0 memory held by pid 777 (/usr/bin/python3)"},
    "attempts": [{"profile": "tuned", "reason": "fallback no-graph after capture_oom",
                  "seconds": 3.5}],
    "gateway": {"url": "http://10.0.0.5:30080", "advertised": "http://10.0.0.6:30000",
                "registered": True, "worker_id": "266e4c64", "last_problem": None},
    "throughput": {"ratio": 0.98, "shape": "decode"},
}


def test_redacted_status_keeps_the_verdicts_and_hides_ids_paths_and_places() -> None:
    red = redact_status(STATUS, redact=True)
    text = json.dumps(red)
    for secret in ("4242", "/var/log", "0123456789abcdef", "777", "/usr/bin", "10.0.0.5",
                   "10.0.0.6", "266e4c64"):
        assert secret not in text, secret
    assert red["engine_pid"] == REDACTED and red["redacted"] is True
    assert red["phase"] == "serving" and red["tok_s"] == 54.2 and red["profile"] == "tuned"
    assert red["attempts"] == STATUS["attempts"] and red["gateway"]["registered"] is True
    assert red["waiting_for"]["failure_class"] == "gpu_busy"
    assert redact_status(STATUS, redact=False) == STATUS
