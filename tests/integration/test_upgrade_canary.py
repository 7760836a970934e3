"""The upgrade canary over the simulator (issue 24): a candidate SGLang release in a second "venv"
(a wrapper interpreter that makes the simulator emulate another release at another speed, with
an `sglang` distribution of that version on its path) proves itself against the current release
or is rolled back: a faster one is promoted and keeps serving across a restart, a slower one is
rolled back and the old release serves again (and it is not retried while its venv is unchanged),
one that refuses the tuned profile is refused before anything stops (`upgrade --check` exits 78),
and an in-place upgrade is reported as a canary without a way back. With a fidelity reference
(taken on the current release: the key is the weights, not the release) a faster candidate whose
answers are garbage is rolled back for fidelity without blaming the profile, and one whose
outputs diverge late (within tolerance) is promoted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervised import Daemon, base_config, free_port, start, stop_cleanly

pytestmark = pytest.mark.integration

CURRENT = "0.5.22"
CANDIDATE = "0.5.23"


def fake_venv(root: Path, version: str, decode_tps: float, faults: str = "") -> str:
    """A venv-shaped directory whose bin/python runs our interpreter as SGLang `version` (with
    simulator `faults`, SGLANG_SIM_FAULTS, for that release only)."""
    site = root / "site"
    dist = site / f"sglang-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    (root / "bin").mkdir()
    python = root / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n"
        f"export SGLANG_SIM_VERSION={version} SGLANG_SIM_DECODE_TPS={decode_tps}\n"
        + (f"export SGLANG_SIM_FAULTS={faults}\n" if faults else "") +
        f'export PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return str(python)


def current_config(tmp_path: Path) -> tuple[dict[str, Any], str]:
    data = base_config(tmp_path)
    data["engine"]["version"] = CURRENT
    data["engine"]["env"].update({"SGLANG_SIM_VERSION": CURRENT, "SGLANG_SIM_DECODE_TPS": "100"})
    address = f"127.0.0.1:{free_port()}"
    data["metrics"] = {"enabled": True, "address": address}
    return data, address


def status(address: str) -> dict[str, Any]:
    return dict(httpx.get(f"http://{address}/status", timeout=10).json())


def upgrade(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_supervisor", "upgrade", "--config",
                           str(config), *args], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, "PYTHONPATH": os.environ.get(
                              "PYTHONPATH", "")})


def doctor_findings(config: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """`doctor --json` on the daemon's configuration: its findings by code, and what it printed."""
    doctor = subprocess.run([sys.executable, "-m", "sglang_supervisor", "doctor", "--config", str(config),
                             "--json"], capture_output=True, text=True, timeout=120, check=False)
    return {f["code"]: f for f in json.loads(doctor.stdout)["findings"]}, doctor.stdout


def trial(daemons: list[Daemon], tmp_path: Path, decode_tps: float, faults: str = "",
          fidelity_reference: bool = False) -> tuple[Daemon, str, str]:
    data, address = current_config(tmp_path)
    if fidelity_reference:  # the current release's first READY takes the model's reference
        data["fidelity"] = {"reference_profile": "tuned", "interval_s": 0}
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    if fidelity_reference:
        assert d.event("fidelity.reference_taken")["sglang_version"] == CURRENT
    python = fake_venv(tmp_path / "candidate", CANDIDATE, decode_tps, faults)
    data["engine"]["candidate"] = {"python": python}
    d.write_config(data)
    d.proc.send_signal(signal.SIGHUP)
    return d, address, python


def test_a_faster_candidate_is_promoted_and_keeps_serving_after_a_restart(
        daemons: list[Daemon], tmp_path: Path) -> None:
    d, address, python = trial(daemons, tmp_path, decode_tps=150)
    begun = d.event("upgrade.canary_begin")
    assert begun["current"] == CURRENT and begun["candidate"] == CANDIDATE
    verdict = d.event("upgrade.verdict")
    assert verdict["verdict"] == "promoted", verdict
    assert any(f"upgrade canary: SGLang {CURRENT} -> {CANDIDATE}" in n for n in d.notes), d.notes
    assert verdict["tps_ratio"] >= 0.98 and verdict["fidelity"] == "not_checked"
    d.notified("READY=1", count=2)
    st = status(address)
    assert st["engine_version"] == CANDIDATE
    assert st["upgrade"]["promoted"]["python"] == python
    assert st["upgrade"]["last_verdict"]["verdict"] == "promoted"
    metrics = httpx.get(f"http://{address}/metrics", timeout=10).text
    assert 'sglang_supervisor_upgrade_verdicts_total{verdict="promoted"} 1.0' in metrics
    assert not d.named("supervisor.reload_rolled_back")
    stop_cleanly(d)
    # the promoted release is what a restart runs while the configuration names it
    again = start(daemons, tmp_path, d_config(d))
    again.notified("READY=1")
    assert again.event("upgrade.promoted_in_use")["python"] == python
    assert status(address)["engine_version"] == CANDIDATE
    stop_cleanly(again)


def d_config(d: Daemon) -> dict[str, Any]:
    import yaml
    return dict(yaml.safe_load(d.config_path.read_text()))


def test_a_slower_candidate_is_rolled_back_and_the_old_release_serves_again(
        daemons: list[Daemon], tmp_path: Path) -> None:
    d, address, python = trial(daemons, tmp_path, decode_tps=40)
    verdict = d.event("upgrade.verdict")
    assert verdict["verdict"] == "rolled_back" and verdict["tps_ratio"] < 0.98, verdict
    assert "upgrade.min_tps_ratio" in verdict["reason"]
    rolled = d.event("supervisor.reload_rolled_back")
    assert rolled["failure_class"] == "canary_rejected" and rolled["profile"] == "tuned"
    d.notified("READY=1", count=2)  # the old release serves again
    st = status(address)
    assert st["engine_version"] == CURRENT
    assert st["upgrade"]["promoted"] is None
    assert st["upgrade"]["last_verdict"]["verdict"] == "rolled_back"
    metrics = httpx.get(f"http://{address}/metrics", timeout=10).text
    assert 'sglang_supervisor_upgrade_verdicts_total{verdict="rolled_back"} 1.0' in metrics
    assert 'sglang_supervisor_restarts_total{reason="rollback"} 1.0' in metrics
    # the same venv is not tried again by the next reload
    n = len(d.events)
    d.proc.send_signal(signal.SIGHUP)
    assert d.event("upgrade.not_retried", after=n)["python"] == python
    assert not [e for e in d.events[n:] if e.get("event") == "upgrade.canary_begin"]
    # doctor lists the remembered release and warns about the last verdict
    codes, doctor_out = doctor_findings(d.config_path)
    assert "rolled back" in codes["upgrade.last_verdict"]["what"], doctor_out[-2000:]
    assert CANDIDATE in codes["upgrade.release"]["what"]
    stop_cleanly(d)


def test_a_candidate_refusing_the_tuned_flags_is_refused_before_anything_stops(
        daemons: list[Daemon], tmp_path: Path) -> None:
    data, address = current_config(tmp_path)
    # a flag of the current release that the candidate removed (tc_piecewise, gone in 0.5.22)
    data["engine"]["version"] = "0.5.21"
    data["engine"]["env"]["SGLANG_SIM_VERSION"] = "0.5.21"
    data["profiles"][0]["args"].pop("enforce-piecewise-cuda-graph", None)
    data["profiles"][0]["args"]["cuda-graph-backend-prefill"] = "tc_piecewise"
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    engine = d.engine_pids()
    python = fake_venv(tmp_path / "candidate", CANDIDATE, 150)
    checked = upgrade(d.config_path, "--to", python, "--check")
    assert checked.returncode == 78, checked.stdout + checked.stderr
    assert "profile tuned: REFUSED" in checked.stdout and "fix:" in checked.stdout
    data["engine"]["candidate"] = {"python": python}
    d.write_config(data)
    d.proc.send_signal(signal.SIGHUP)
    refused = d.event("upgrade.refused")
    assert refused["candidate"] == CANDIDATE
    d.event("supervisor.reload_failed")
    assert d.engine_pids() == engine and not d.named("engine.launch")[1:]
    assert status(address)["upgrade"]["last_verdict"]["verdict"] == "refused"
    stop_cleanly(d)


def test_upgrade_now_asks_the_running_daemon(daemons: list[Daemon], tmp_path: Path) -> None:
    data, address = current_config(tmp_path)
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    python = fake_venv(tmp_path / "candidate", CANDIDATE, 150)
    asked = upgrade(d.config_path, "--to", python, "--now")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert "reloads with the candidate" in asked.stdout
    assert d.event("upgrade.verdict")["verdict"] == "promoted"
    d.notified("READY=1", count=2)
    assert status(address)["engine_version"] == CANDIDATE
    stop_cleanly(d)
    # the configuration does not name the candidate: the request does, for later starts
    again = start(daemons, tmp_path, data)
    again.notified("READY=1")
    assert status(address)["engine_version"] == CANDIDATE
    stop_cleanly(again)


def test_an_in_place_upgrade_is_reported_as_a_canary_without_a_way_back(
        daemons: list[Daemon], tmp_path: Path) -> None:
    data, address = current_config(tmp_path)
    python = fake_venv(tmp_path / "venv", CURRENT, 100)
    data["engine"]["command"] = [python, "-m", "sglang_supervisor.simulator"]
    data["engine"]["version"] = "auto"
    data["engine"]["interpreter"] = python
    data["fidelity"] = {"reference_profile": "tuned", "interval_s": 0}
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    assert d.event("fidelity.reference_taken")["sglang_version"] == CURRENT
    stop_cleanly(d)
    # `pip install -U` in that same venv: the installed release changes under the same python
    site = tmp_path / "venv" / "site"
    (site / f"sglang-{CURRENT}.dist-info").rename(site / f"sglang-{CANDIDATE}.dist-info")
    (site / f"sglang-{CANDIDATE}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {CANDIDATE}\n")
    text = Path(python).read_text().replace(f"SGLANG_SIM_VERSION={CURRENT}",
                                            f"SGLANG_SIM_VERSION={CANDIDATE}")
    Path(python).write_text(text)
    again = start(daemons, tmp_path, data)
    loud = again.event("upgrade.in_place")
    assert loud["old_version"] == CURRENT and loud["new_version"] == CANDIDATE
    again.notified("READY=1")
    verdict = again.event("upgrade.in_place_verdict")
    assert verdict["verdict"] in ("in_place_ok", "in_place_worse")
    # The ready gate compared the new release's answers with the reference the old one took.
    assert verdict["fidelity"] == "pass"
    st = status(address)["upgrade"]
    assert st["in_place"]["from"] == CURRENT and st["in_place"]["to"] == CANDIDATE
    book = (tmp_path / "state" / "demo.releases.json").read_text()
    assert '"old_release": true' in book  # the old release's numbers stay, marked
    codes, doctor_out = doctor_findings(again.config_path)
    assert "upgrade.in_place" in codes, doctor_out[-2000:]
    stop_cleanly(again)


def test_a_faster_candidate_with_garbage_outputs_is_rolled_back_for_fidelity(
        daemons: list[Daemon], tmp_path: Path) -> None:
    d, address, python = trial(daemons, tmp_path, decode_tps=150, faults="garbage-output",
                               fidelity_reference=True)
    verdict = d.event("upgrade.verdict")
    assert verdict["verdict"] == "rolled_back" and verdict["fidelity"] == "fail", verdict
    # Measured and recorded; that speed cannot redeem a mismatch is the pure judge's test
    # (tests/unit/core/test_upgrade_canary.py): the ratio of 8-token probes on a loaded 2-core
    # host is not a fact this test may depend on (it read 0.955 once for 150 vs 100 tok/s).
    assert verdict["tps_ratio"] is not None
    reason = verdict["reason"]
    assert reason.startswith("fidelity:") and "prompt " in reason, reason
    assert "expected " in reason and "received " in reason and len(reason) <= 500
    rolled = d.event("supervisor.reload_rolled_back")
    assert rolled["failure_class"] == "canary_rejected" and rolled["profile"] == "tuned"
    assert rolled["message"] == reason
    # the old release serves again, the same profile, and still agrees with the reference
    ready = d.event("supervisor.ready", after=d.events.index(rolled))
    assert ready["profile"] == "tuned"
    assert d.named("fidelity.check")[-1]["result"] == "pass"
    # the candidate is rejected, not the profile: no rung walked, nothing marked bad
    assert not d.named("profile.fallback") and not d.named("fidelity.mismatch")
    assert "output_mismatch" not in (tmp_path / "state" / "demo.state.json").read_text()
    st = status(address)
    assert st["engine_version"] == CURRENT and st["profile"] == "tuned"
    assert st["upgrade"]["fidelity"] == "fail" and st["upgrade"]["promoted"] is None
    assert st["upgrade"]["last_verdict"]["fidelity"] == "fail"
    book = json.loads((tmp_path / "state" / "demo.releases.json").read_text())
    assert book["releases"][-1]["fidelity"] == "fail" and book["releases"][-1]["python"] == python
    codes, doctor_out = doctor_findings(d.config_path)
    assert "fidelity fail" in codes["upgrade.release"]["what"], doctor_out[-2000:]
    assert "fidelity reference" in codes["upgrade.last_verdict"]["fix"]
    stop_cleanly(d)


def test_a_candidate_whose_outputs_diverge_late_is_promoted(
        daemons: list[Daemon], tmp_path: Path) -> None:
    d, address, _ = trial(daemons, tmp_path, decode_tps=150, faults="late-divergence",
                          fidelity_reference=True)
    verdict = d.event("upgrade.verdict")
    assert verdict["verdict"] == "promoted" and verdict["fidelity"] == "pass", verdict
    d.notified("READY=1", count=2)
    st = status(address)
    assert st["engine_version"] == CANDIDATE and st["upgrade"]["fidelity"] == "pass"
    assert not d.named("supervisor.reload_rolled_back")
    stop_cleanly(d)
