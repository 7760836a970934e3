"""The shipped unit files, checked offline (no running systemd needed): `systemd-analyze verify`
prints nothing, the hardening score stays at or under 4.0, sglang-qwen.service is the template
rendered for qwen, and sglang-model renders, refreshes and removes per-model units."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiers import apt_fix, require

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "units"
TEMPLATE = UNITS / "sglang-supervisor@.service"
QWEN = UNITS / "sglang-qwen.service"
EXAMPLES = REPO / "etc" / "sglang-supervisor"
SGLANG_MODEL = UNITS / "sglang-model"
EXEC_START = "/opt/venvs/sglang-supervisor/bin/sglang-supervisor"
SCORE_LIMIT = 4.0


def _analyze() -> str:
    tool = shutil.which("systemd-analyze")
    require(tool is not None, "systemd-analyze is not installed", apt_fix("systemd"))
    assert tool is not None
    return tool


@pytest.fixture
def verify_root(tmp_path: Path) -> Path:
    """A root holding systemd's own units, the shipped units and the ExecStart binary."""
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "lib/systemd").mkdir(parents=True)
    shutil.copytree("/lib/systemd/system", root / "lib/systemd/system", symlinks=True)
    exe = root / EXEC_START.lstrip("/")
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (root / "bin").mkdir()
    shutil.copy2("/bin/kill", root / "bin/kill")
    for unit in (TEMPLATE, QWEN):
        shutil.copy2(unit, root / "etc/systemd/system" / unit.name)
    return root


@pytest.fixture(autouse=True)
def _keep_host_run_clean() -> object:
    # `systemd-analyze verify` leaves /run/systemd/systemd-units-load behind on the host
    marker = Path("/run/systemd/systemd-units-load")
    existed = marker.exists()
    yield None
    if not existed and marker.exists():
        marker.unlink()


def _verify(root: Path, *units: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_analyze(), "verify", "--man=no", f"--root={root}", *units],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_verify_prints_nothing_for_the_installed_units(verify_root: Path) -> None:
    proc = _verify(verify_root, "sglang-qwen.service", "sglang-supervisor@mistral.service")
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


def test_verify_would_report_a_broken_unit(verify_root: Path) -> None:
    # the check above can fail: verify speaks up about a misspelt key and a bad value
    unit = verify_root / "etc/systemd/system/sglang-qwen.service"
    unit.write_text(unit.read_text().replace("KillMode=mixed", "KillMode=mixd\nRestartPreventExitStatuss=78"))
    proc = _verify(verify_root, "sglang-qwen.service")
    assert "mixd" in proc.stderr and "RestartPreventExitStatuss" in proc.stderr


def _exposure(unit: Path) -> float:
    proc = subprocess.run(
        [_analyze(), "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout + proc.stderr)
    assert match, proc.stdout + proc.stderr
    return float(match.group(1))


@pytest.mark.parametrize("unit", [QWEN, TEMPLATE], ids=lambda p: p.name)
def test_security_exposure_is_at_most_4(unit: Path, tmp_path: Path) -> None:
    copy = tmp_path / unit.name  # security --offline loads from the file's directory
    shutil.copy2(unit, copy)
    score = _exposure(copy)
    print(f"{unit.name}: systemd-analyze security exposure {score}")
    assert score <= SCORE_LIMIT


def test_security_score_reacts_to_hardening(tmp_path: Path) -> None:
    loose = tmp_path / "sglang-loose.service"
    text = QWEN.read_text()
    for key in ("ProtectSystem", "ProtectHome", "PrivateTmp", "NoNewPrivileges", "CapabilityBoundingSet",
                "SystemCallFilter", "RestrictNamespaces", "ProtectKernelTunables"):
        text = re.sub(rf"^{key}=.*$", "", text, flags=re.M)
    loose.write_text(text)
    shipped = tmp_path / QWEN.name
    shutil.copy2(QWEN, shipped)
    assert _exposure(loose) > _exposure(shipped)


def _unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def test_unit_carries_the_contract_with_the_supervisor() -> None:
    s = _unit_settings(QWEN.read_text())
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["ExecStart"] == [f"{EXEC_START} run --config /etc/sglang-supervisor/qwen.yaml"]
    assert s["KillMode"] == ["mixed"] and s["Restart"] == ["on-failure"]
    assert s["RestartPreventExitStatus"] == ["78"]
    # a broken file fails `systemctl reload` before the running supervisor sees it
    assert s["ExecReload"] == [f"{EXEC_START} check --alone --config /etc/sglang-supervisor/qwen.yaml",
                               "/bin/kill -HUP $MAINPID"]
    assert s["DevicePolicy"] == ["closed"] and s["DeviceAllow"] == ["char-nvidia* rw"]
    assert s["LimitMEMLOCK"] == ["infinity"] and s["User"] == ["sglang"]
    # stop budget: the config's default drain (30 s) + kill (10 s) fit, with room for the exit
    assert _seconds(s["TimeoutStopSec"][0]) >= 30 + 10 + 20
    # a start limit that can trip with minute-long starts: the window spans several starts
    assert _seconds(s["StartLimitIntervalSec"][0]) >= 4 * _seconds(s["TimeoutStartSec"][0])


def _seconds(value: str) -> float:
    units = {"s": 1, "min": 60, "h": 3600}
    match = re.fullmatch(r"(\d+)(s|min|h)?", value)
    assert match, value
    return int(match.group(1)) * units[match.group(2) or "s"]


def _sglang_model(tmp_path: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SGLANG_MODEL_TEMPLATE": str(TEMPLATE),
        "SGLANG_MODEL_UNIT_DIR": str(tmp_path / "units"),
        "SGLANG_MODEL_CONFIG_DIR": str(tmp_path / "etc"),
        "SGLANG_MODEL_NO_RELOAD": "1",
        "SGLANG_MODEL_EXAMPLES": str(EXAMPLES),
        "SGLANG_MODEL_SUPERVISOR": f"{sys.executable} -m sglang_supervisor",
    }
    (tmp_path / "units").mkdir(exist_ok=True)
    (tmp_path / "etc").mkdir(exist_ok=True)
    proc = subprocess.run(
        ["sh", str(SGLANG_MODEL), *args], capture_output=True, text=True, env=env, check=False
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_shipped_qwen_unit_is_the_template_rendered_for_qwen(tmp_path: Path) -> None:
    assert _sglang_model(tmp_path, "render", "qwen").stdout == QWEN.read_text()


def test_add_renders_a_unit_per_config_and_refresh_follows_the_template(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/mistral.yaml").write_text("name: mistral\n")
    _sglang_model(tmp_path, "add", "mistral")
    unit = tmp_path / "units/sglang-mistral.service"
    settings = _unit_settings(unit.read_text())
    assert settings["ExecStart"] == [f"{EXEC_START} run --config /etc/sglang-supervisor/mistral.yaml"]
    assert settings["RuntimeDirectory"] == ["sglang-supervisor/mistral"]
    unit.write_text(unit.read_text().replace("WatchdogSec=60s", "WatchdogSec=1s"))
    _sglang_model(tmp_path, "refresh")
    assert _unit_settings(unit.read_text())["WatchdogSec"] == ["60s"]
    _sglang_model(tmp_path, "remove", "mistral")
    assert not unit.exists() and (tmp_path / "etc/mistral.yaml").exists()


def test_add_without_a_config_starts_from_the_shipped_example_under_the_models_name(tmp_path: Path) -> None:
    proc = _sglang_model(tmp_path, "add", "llama")
    text = (tmp_path / "etc/llama.yaml").read_text()
    example = (EXAMPLES / "qwen.yaml").read_text()
    # alone on the host it keeps the example's ports, but the engine log is always its own
    assert text == example.replace("\nname: qwen\n", "\nname: llama\n").replace(
        "/qwen-engine.log", "/llama-engine.log") and text != example
    assert "  - name: tuned" in text  # profile names are not the model's name
    assert "check engine.model_path and engine.env.CUDA_VISIBLE_DEVICES" in proc.stderr
    assert (tmp_path / "units/sglang-llama.service").is_file()
    kept = _sglang_model(tmp_path, "add", "llama", "--from", str(EXAMPLES / "sim.yaml"))
    assert (tmp_path / "etc/llama.yaml").read_text() == text  # an existing configuration is never overwritten
    assert "llama.yaml from" not in kept.stderr


def test_add_copies_a_starting_config_and_refuses_bad_names_and_foreign_units(tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text("name: x\n")
    _sglang_model(tmp_path, "add", "llama-3.1", "--from", str(seed))
    assert (tmp_path / "etc/llama-3.1.yaml").read_text() == "name: llama-3.1\n"  # the copy is this model's
    bad = _sglang_model(tmp_path, "add", "Bad/Name", check=False)
    assert bad.returncode != 0 and "model name 'Bad/Name'" in bad.stderr
    (tmp_path / "units/sglang-mine.service").write_text("[Service]\nExecStart=/bin/true\n")
    (tmp_path / "etc/mine.yaml").write_text("name: mine\n")
    foreign = _sglang_model(tmp_path, "add", "mine", check=False)
    assert foreign.returncode != 0 and "not made by sglang-model" in foreign.stderr


def test_add_picks_ports_and_a_log_file_no_other_model_claims(tmp_path: Path) -> None:
    _sglang_model(tmp_path, "add", "qwen")
    proc = _sglang_model(tmp_path, "add", "llama", "--from", str(tmp_path / "etc/qwen.yaml"))
    text = (tmp_path / "etc/llama.yaml").read_text()
    assert "\n  port: 30001\n" in text and '\n  address: "127.0.0.1:9401"\n' in text
    assert "\n  log_file: /var/log/sglang-supervisor/llama-engine.log\n" in text
    assert "set engine.port: 30001 (was 30000" in proc.stderr
    # what it cannot pick, the GPUs, is named with both models
    assert "still to fix: engine.env.CUDA_VISIBLE_DEVICES" in proc.stderr and "'qwen'" in proc.stderr
    third = _sglang_model(tmp_path, "add", "mistral", "--from", str(tmp_path / "etc/qwen.yaml"))
    assert "set engine.port: 30002" in third.stderr
    assert '\n  address: "127.0.0.1:9402"\n' in (tmp_path / "etc/mistral.yaml").read_text()
