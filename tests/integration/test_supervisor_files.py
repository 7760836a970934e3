"""The supervisor's own files and faults over the simulator (issue 12 items 2 and 4, issue 18
items 2 and 4): an exception inside the supervisor blames no profile; a corrupt state file, at
start or at a reload, is moved aside and the engine keeps serving; a reload that cannot apply
every changed key is refused with a reason where operators look; a profile whose known-bad entry
expired is tried again first, on probation.

Each test starts the real `sglang-supervisor run` as a subprocess with a NOTIFY_SOCKET it owns
(tests/supervised.py).
"""

from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervised import Daemon, base_config, free_port, start, stop_cleanly

pytestmark = pytest.mark.integration


def state_file(workdir: Path) -> Path:
    return workdir / "state" / "demo.state.json"  # demo.yaml's name: demo


def remembered_bad(workdir: Path) -> dict[str, Any]:
    path = state_file(workdir)
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {p: r for fp in data["fingerprints"].values() for p, r in fp["bad"].items()}


# A bug of the supervisor's own, injected where it once happened: a value it could not use while
# the engine's log was moving (an infinite stall_s overflowed EXTEND_TIMEOUT_USEC).
INJECTED_BUG = '''
"""sitecustomize: an injected supervisor bug, raised while the engine starts up."""
import os
if os.environ.get("FAULT_SUPERVISOR_BUG") and "sglang_supervisor.simulator" not in " ".join(os.sys.argv):
    from sglang_supervisor.shell.telemetry import notify

    def _broken(self, seconds):
        raise OverflowError("injected supervisor bug")

    notify.Notifier.extend_timeout = _broken
'''


def test_an_exception_inside_the_supervisor_blames_no_profile(daemons: list[Daemon],
                                                               tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(INJECTED_BUG)
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "FAULT_SUPERVISOR_BUG": "1"}
    d = start(daemons, tmp_path, base_config(tmp_path), env=env)
    err = d.event("supervisor.internal_error")
    assert "injected supervisor bug" in err["error"] and err["profile"] == "tuned"
    assert d.exit_code() == 1  # the supervisor's fault: systemd restarts it (Restart=on-failure)
    assert not d.named("engine.failed") and not d.named("profile.fallback")
    assert len(d.engine_pids()) == 1  # no second profile was launched
    assert remembered_bad(tmp_path) == {}  # nothing held against the profile
    assert json.loads(state_file(tmp_path).read_text())["internal_errors"] == 1  # counted
    assert any(n.startswith("STATUS=internal error") for n in d.notes), d.notes
    assert "READY=1" not in d.notes
    # The next start (systemd's restart) runs the same profile again, not a fallback.
    again = start(daemons, tmp_path, base_config(tmp_path))
    again.notified("READY=1")
    assert again.event("engine.launch")["profile"] == "tuned"
    stop_cleanly(again)


# ------------------------------------------------------------------------------ the way back

# tuned's prefill graph capture fails; the fault rides in the supervisor's environment and matches
# only tuned's command line, so the configuration (and the fingerprint) stay the same across runs.
TUNED_FAILS = {"SGLANG_SIM_FAULTS": "capture-fail:prefill:error+when=--enable-single-batch-overlap"}
DAY = 86400.0


def age_records(workdir: Path, seconds: float) -> None:
    """Time passes for the remembered failures (the file is what a later start reads)."""
    path = state_file(workdir)
    data = json.loads(path.read_text())
    for fp in data["fingerprints"].values():
        for record in fp["bad"].values():
            record["at"] -= seconds
        if fp.get("below_best_since") is not None:
            fp["below_best_since"] -= seconds
    path.write_text(json.dumps(data))


def serve_and_stop(daemons: list[Daemon], workdir: Path, data: dict[str, Any],
                   env: dict[str, str] | None = None) -> Daemon:
    d = start(daemons, workdir, data, env=env)
    d.notified("READY=1")
    stop_cleanly(d)
    return d


def launched(d: Daemon) -> list[tuple[str, str]]:
    return [(e["profile"], e["reason"]) for e in d.named("engine.launch")]


def test_the_way_back_after_an_expired_known_bad_entry(daemons: list[Daemon], tmp_path: Path) -> None:
    data = base_config(tmp_path)
    data["restart"].update(known_bad_ttl_s=7 * DAY, transient_retry_s=3600)  # the defaults
    first = serve_and_stop(daemons, tmp_path, data, TUNED_FAILS)
    assert launched(first) == [("tuned", "first profile"),
                               ("no-prefill-graph", "fallback after prefill_graph_failed")]
    assert remembered_bad(tmp_path)["tuned"]["count"] == 1

    # a day later: tuned is still in its back-off (a week for a capture failure)
    age_records(tmp_path, DAY)
    second = serve_and_stop(daemons, tmp_path, data, TUNED_FAILS)
    assert launched(second) == [("no-prefill-graph", "last known good")]
    assert second.event("profile.known_bad_skipped")["profile"] == "tuned"

    # eight days later the entry expired: tuned goes first, on probation; the fault is still
    # there, so it fails and the next attempt is the last good profile at once
    age_records(tmp_path, 8 * DAY)
    third = serve_and_stop(daemons, tmp_path, data, TUNED_FAILS)
    assert launched(third) == [("tuned", "probation"),
                               ("no-prefill-graph", "fallback after prefill_graph_failed")]
    assert third.event("profile.fallback")["rule"] == "probation failed: back to the last good profile"
    assert remembered_bad(tmp_path)["tuned"]["count"] == 2  # the next back-off is two weeks
    spell = json.loads(state_file(tmp_path).read_text())["fingerprints"]
    assert all(fp["below_best_since"] is not None for fp in spell.values())

    # fifteen days later, the cause fixed: the probation passes and tuned serves again
    age_records(tmp_path, 15 * DAY)
    fourth = serve_and_stop(daemons, tmp_path, data)
    assert launched(fourth) == [("tuned", "probation")]
    assert fourth.event("profile.probation_passed")["profile"] == "tuned"
    assert remembered_bad(tmp_path) == {}
    spell = json.loads(state_file(tmp_path).read_text())["fingerprints"]
    assert all(fp["below_best_since"] is None for fp in spell.values())


# ------------------------------------------------------------------------------ reload

def status_notes(d: Daemon) -> list[str]:
    return [n for n in d.notes if n.startswith("STATUS=")]


def test_a_refused_reload_keeps_the_engine_serving_and_says_why(daemons: list[Daemon],
                                                              tmp_path: Path) -> None:
    data = base_config(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    data["metrics"] = {"enabled": True, "address": address}
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    engine = d.engine_pids()

    # a key a reload cannot apply (the metrics endpoint is bound at start): refused, not ignored
    moved = copy.deepcopy(data)
    moved["metrics"]["address"] = f"127.0.0.1:{free_port()}"
    d.write_config(moved)
    n = len(d.events)
    d.proc.send_signal(signal.SIGHUP)
    refused = d.event("supervisor.reload_failed", after=n)
    assert refused["kind"] == "not_applicable" and refused["keys"] == "metrics.address"
    assert "restart the unit" in refused["reason"]
    d.wait_for("STATUS= naming the refused reload",
               lambda: any("reload refused: metrics.address changed" in s for s in status_notes(d)))
    status = httpx.get(f"http://{address}/status", timeout=10).json()
    assert status["last_reload"]["result"] == "refused"
    metrics = httpx.get(f"http://{address}/metrics", timeout=10).text
    assert "sglang_supervisor_config_last_reload_successful 0.0" in metrics
    assert 'sglang_supervisor_config_reloads_total{result="refused"} 1.0' in metrics
    assert d.engine_pids() == engine and d.proc.poll() is None
    assert not d.named("supervisor.reload")  # nothing of the new file was applied

    # a broken file: refused the same way, the first problem named
    d.config_path.write_text("engine: [this is not a mapping\n")
    n = len(d.events)
    d.proc.send_signal(signal.SIGHUP)
    broken = d.event("supervisor.reload_failed", after=n)
    assert broken["kind"] == "invalid" and "YAML syntax error" in broken["reason"]

    # the file fixed (a key a reload applies): applied, the note and the gauge clear
    fixed = copy.deepcopy(data)
    fixed["timeouts"]["health_interval_s"] = 2
    d.write_config(fixed)
    d.proc.send_signal(signal.SIGHUP)
    d.event("supervisor.reload", changed=False)
    d.wait_for("STATUS= without the note", lambda: not status_notes(d)[-1].count("reload refused"))
    metrics = httpx.get(f"http://{address}/metrics", timeout=10).text
    assert "sglang_supervisor_config_last_reload_successful 1.0" in metrics
    assert httpx.get(f"http://{address}/status", timeout=10).json()["last_reload"]["changed"] == [
        "timeouts.health_interval_s"]
    assert d.engine_pids() == engine
    stop_cleanly(d)


# ------------------------------------------------------------------------------ the state file

CORRUPT = b'{"version": 1, "fingerprints": {"x": {"touched": 1e999, "bad": ' + b"[" * 50_000


def test_a_corrupt_state_file_at_start_is_moved_aside(daemons: list[Daemon], tmp_path: Path) -> None:
    state_file(tmp_path).parent.mkdir(parents=True)
    state_file(tmp_path).write_bytes(CORRUPT)
    d = start(daemons, tmp_path, base_config(tmp_path))
    d.notified("READY=1")
    warning = d.event("state.corrupt")
    assert Path(warning["moved_to"]).read_bytes() == CORRUPT
    assert d.event("engine.launch")["profile"] == "tuned"
    assert json.loads(state_file(tmp_path).read_text())["version"] == 1  # a fresh, valid file
    stop_cleanly(d)


def test_a_state_file_corrupted_while_running_then_a_reload(daemons: list[Daemon],
                                                            tmp_path: Path) -> None:
    d = start(daemons, tmp_path, base_config(tmp_path))
    d.notified("READY=1")
    engine = d.engine_pids()
    state_file(tmp_path).write_bytes(CORRUPT)
    d.proc.send_signal(signal.SIGHUP)  # the reload reads the state for the new settings
    d.event("supervisor.reload", changed=False)
    warning = d.event("state.corrupt")
    assert Path(warning["moved_to"]).read_bytes() == CORRUPT
    d.notified("READY=1", count=2)
    assert d.engine_pids() == engine and d.proc.poll() is None  # the healthy engine serves on
    stop_cleanly(d)


# ------------------------------------------------------------------- files other users can write

def test_a_state_file_writable_by_others_is_refused_at_start_and_kept(daemons: list[Daemon],
                                                                      tmp_path: Path) -> None:
    """Issue 29.4: a forged known-bad entry in a world-writable state file made the healthy first
    profile be skipped. Now `run` refuses it (exit 78, the chmod named) and leaves it as it is."""
    forged = {"version": 1, "fingerprints": {}, "baselines": {}}
    state_file(tmp_path).parent.mkdir(parents=True)
    state_file(tmp_path).write_text(json.dumps(forged))
    state_file(tmp_path).chmod(0o666)
    d = start(daemons, tmp_path, base_config(tmp_path))
    assert d.exit_code() == 78
    invalid = d.event("config.invalid")
    assert f"chmod o-w {state_file(tmp_path)}" in invalid["report"]
    assert "writable by every user (mode 0666)" in invalid["report"]
    assert d.named("engine.spawned") == []
    assert json.loads(state_file(tmp_path).read_text()) == forged  # nothing moved or rewritten
    assert sorted(os.listdir(state_file(tmp_path).parent)) == [state_file(tmp_path).name]


def test_status_on_every_address_is_redacted_and_the_exposure_is_warned_about(
        daemons: list[Daemon], tmp_path: Path) -> None:
    """Issue 29.5: metrics on 0.0.0.0 and a keyless engine off loopback are said at start, and
    /status off loopback shows no pid, path or fingerprint."""
    data = base_config(tmp_path)
    data["metrics"] = {"enabled": True, "address": "0.0.0.0:0"}
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    warning = d.event("config.warning", path="metrics.address")
    assert "0.0.0.0:0" in warning["problem"] and "redacted" in warning["problem"]
    port = str(d.event("metrics.listening")["url"]).rsplit(":", 1)[1]
    status = httpx.get(f"http://127.0.0.1:{port}/status", timeout=5).json()
    stop_cleanly(d)
    assert status["redacted"] is True and status["phase"] in ("ready", "serving")
    assert status["engine_pid"] == "***" and status["fingerprint"] == "***"
    assert status["engine_log"] in ("***", None)
    text = json.dumps(status)
    assert str(tmp_path) not in text
