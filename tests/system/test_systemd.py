"""The Debian package under a real systemd (PID 1 of its own namespaces) with journald.

In order, on one sandbox: the package installs the user, units and configuration without starting
anything; a broken configuration fails with status 78 and is not restarted; sglang-qwen on the
demo configuration (simulator engine) is `activating` while capturing and `active` only after
capture and the first probe, says phase/profile/tok/s in StatusText and logs structured events
and engine lines to the journal; an engine hang is handled by the supervisor; a killed supervisor
is restarted by systemd with no old engine process left; a frozen supervisor trips WatchdogSec;
reload re-reads the configuration; stop drains within TimeoutStopSec; an upgrade keeps the edited
configuration; purge removes state; install.sh/uninstall.sh do the same job without a package.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from system.sandbox import EXAMPLES, TEST_DROPIN, Sandbox, unit_demo_config
from tiers import apt_fix, require

pytestmark = pytest.mark.system

UNIT = "sglang-qwen.service"
ETC = Path("/etc/sglang-supervisor")
QWEN_YAML = ETC / "qwen.yaml"
BROKEN = "systest-broken"
REPO = Path(__file__).resolve().parents[2]
# generous bounds, so a slow CI machine is not a failure; the simulator's clock runs fast
START_S = 120.0


def demo_config(**overrides: Any) -> dict[str, Any]:
    """The packaged demo configuration, placed where the unit's directories are."""
    cfg = unit_demo_config("qwen")
    # an engine that stops answering is noticed within seconds
    cfg["timeouts"].update(health_interval_s=1, health_timeout_s=2, health_failures=2)
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def write_config(cfg: dict[str, Any]) -> None:
    QWEN_YAML.write_text(yaml.safe_dump(cfg, sort_keys=False))


def events(box: Sandbox, unit: str = UNIT, since_cursor: str | None = None) -> list[dict[str, Any]]:
    args = [f"--after-cursor={since_cursor}"] if since_cursor else []
    return box.journal(*args, unit=unit)


def cursor(box: Sandbox) -> str:
    entries = box.journal("-n", "1")
    return str(entries[-1]["__CURSOR"]) if entries else ""


def named(entries: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [e for e in entries if e.get("EVENT") == event]


def engine_pids(box: Sandbox) -> list[int]:
    main = int(box.prop(UNIT, "MainPID") or 0)
    return [p for p in box.unit_pids(UNIT) if p != main]


def seconds(box: Sandbox, timespan: str) -> float:
    """systemd's '1min 30s' as seconds (systemd-analyze parses its own format)."""
    out = box.run("systemd-analyze", "timespan", timespan).stdout
    match = re.search(r"μs: (\d+)", out)
    assert match, out
    return int(match.group(1)) / 1e6


@pytest.fixture(scope="module")
def box(installed: Sandbox) -> Iterator[Sandbox]:
    installed.dropin(UNIT, "50-systest", TEST_DROPIN)
    installed.dropin(f"sglang-supervisor@{BROKEN}.service", "50-systest", TEST_DROPIN)
    yield installed
    installed.systemctl("stop", UNIT, f"sglang-supervisor@{BROKEN}.service", check=False)
    (ETC / f"{BROKEN}.yaml").unlink(missing_ok=True)


# ------------------------------------------------------------------------------------- install
def test_package_installs_user_units_and_config_but_starts_nothing(box: Sandbox) -> None:
    assert box.run("id", "-u", "sglang").stdout.strip().isdigit()
    assert box.prop(UNIT, "FragmentPath") == f"/lib/systemd/system/{UNIT}"
    assert box.prop(UNIT, "ActiveState") == "inactive"
    assert box.systemctl("is-enabled", UNIT, check=False).strip() == "disabled"
    # /etc holds the operator's files only: qwen.yaml was created from the example, not a conffile
    conffiles = box.run("dpkg-query", "-W", "-f=${Conffiles}", "sglang-supervisor").stdout
    assert "/etc/sglang-supervisor" not in conffiles, conffiles
    assert QWEN_YAML.read_bytes() == (EXAMPLES / "qwen.yaml").read_bytes()
    assert not (ETC / "demo.yaml").exists()
    assert (Path("/usr/share/doc/sglang-supervisor/examples") / "sim.yaml").is_file()
    # what OPERATIONS.md points to: the alert rules (with their promtool tests), the dashboard, the guides
    shipped = Path("/usr/share/sglang-supervisor")
    for asset in ("prometheus/alerts.yml", "prometheus/alerts.test.yml", "prometheus/scrape.yml",
                  "grafana/sglang-supervisor.json"):
        assert (shipped / asset).is_file(), asset
    for guide in ("OPERATIONS.md", "CONFIG.md", "LOGSCAN.md", "FAULTS.md"):
        assert (Path("/usr/share/doc/sglang-supervisor") / guide).is_file(), guide
    version = box.run("sglang-supervisor", "--version").stdout
    assert "sglang-supervisor" in version
    assert box.run("sglang-sim", "--help").returncode == 0  # the README's and the docs' simulator
    # Documentation= names files that exist (dh_compress would have made OPERATIONS.md.gz)
    docs = box.prop(UNIT, "Documentation").split()
    files = [d.removeprefix("file:") for d in docs if d.startswith("file:")]
    assert files and all(Path(f).is_file() for f in files), docs


def test_sglang_model_list_shows_deployments_and_units_in_every_unit_directory(box: Sandbox) -> None:
    local = Path("/usr/local/lib/systemd/system/sglang-systestlocal.service")
    cfg = ETC / "systestlocal.yaml"
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_text("[Service]\nExecStart=/bin/true\n")
    cfg.write_text("name: systestlocal\n")
    try:
        rows = [line.split("\t") for line in box.run("sglang-model", "list").stdout.splitlines()]
    finally:
        local.unlink()
        cfg.unlink()
    by_name = {r[0]: r[2] for r in rows}
    assert by_name == {"qwen": UNIT, "systestlocal": "sglang-systestlocal.service"}, rows  # no demo
def test_broken_config_fails_with_78_and_is_not_restarted(box: Sandbox) -> None:
    unit = f"sglang-supervisor@{BROKEN}.service"
    (ETC / f"{BROKEN}.yaml").write_text("name: broken\nengine: 3\n")
    try:
        box.systemctl("start", unit, check=False)
        box.wait_for("the unit to fail", lambda: box.prop(unit, "ActiveState") == "failed", 60)
        time.sleep(3)  # > RestartSec of the test drop-in: a restart would have happened by now
    finally:
        (ETC / f"{BROKEN}.yaml").unlink()
    props = box.show(unit, "ActiveState", "ExecMainStatus", "Result", "NRestarts")
    assert props == {"ActiveState": "failed", "ExecMainStatus": "78", "Result": "exit-code", "NRestarts": "0"}
    text = " ".join(str(e.get("MESSAGE", "")) for e in box.journal(unit=unit))
    assert "engine" in text  # the report names the offending key


def test_a_credential_the_unit_does_not_load_names_load_credential_not_chmod(box: Sandbox) -> None:
    # The operator's drop-in loads the key as "api-key", the YAML asks for "apikey": systemd's copy
    # in $CREDENTIALS_DIRECTORY is not theirs to chmod; the fix is the LoadCredential= line.
    name = "systestcred"
    unit = f"sglang-supervisor@{name}.service"
    key = ETC / f"{name}.key"
    key.write_text("k\n")
    key.chmod(0o600)
    cfg = demo_config()
    cfg["name"] = name
    cfg["engine"]["api_key_credential"] = "apikey"
    (ETC / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    box.dropin(unit, "50-systest", TEST_DROPIN + f"LoadCredential=api-key:{key}\n")
    try:
        box.systemctl("start", unit, check=False, timeout=START_S)
        box.wait_for("the unit to fail", lambda: box.prop(unit, "ActiveState") == "failed", 60)
        assert box.prop(unit, "ExecMainStatus") == "78"
        text = " ".join(str(e.get("MESSAGE", "")) for e in box.journal(unit=unit))
    finally:
        box.systemctl("reset-failed", unit, check=False)
        (ETC / f"{name}.yaml").unlink()
        key.unlink()
    assert "engine.api_key_credential" in text and "LoadCredential=apikey:" in text, text
    assert "chmod 600" not in text, text  # the file hint; the credential hint says no chmod is needed


# ---------------------------------------------------------------------------------- lifecycle
# The first profile crashes during CUDA graph capture (a simulator fault): the journal then holds an
# engine traceback (priority err) and the supervisor falls back to the next profile by itself.
CRASHING_PROFILE_FAULT = "crash:capture"


def engine_lines(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Forwarded engine output: native entries carry SOURCE=engine; a line that fell back to stdout
    (journal socket busy) reads `engine.output source=engine ...` and keeps its priority prefix."""
    return [e for e in entries if e.get("SOURCE") == "engine"
            or str(e.get("MESSAGE", "")).startswith("engine.output source=engine")]


def test_start_is_activating_while_capturing_and_active_after_the_first_probe(box: Sandbox) -> None:
    cfg = demo_config()
    cfg["profiles"][0].setdefault("env", {})["SGLANG_SIM_FAULTS"] = CRASHING_PROFILE_FAULT
    first, second = cfg["profiles"][0]["name"], cfg["profiles"][1]["name"]
    write_config(cfg)
    box.systemctl("start", "--no-block", UNIT)
    seen: list[tuple[str, str]] = []

    def sample() -> bool:
        p = box.show(UNIT, "ActiveState", "StatusText")
        seen.append((p["ActiveState"], p["StatusText"]))
        assert p["ActiveState"] != "failed", box.systemctl("status", UNIT, check=False)
        return p["ActiveState"] == "active"

    try:
        box.wait_for("active", sample, START_S, interval=0.05)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{box.diagnose(UNIT)}") from None
    activating = [status for state, status in seen if state == "activating"]
    assert any(s.startswith(f"capturing_graphs profile={first}") for s in activating), seen
    assert any(s.startswith(f"capturing_graphs profile={second}") for s in activating), seen
    assert not any(s.startswith(("ready", "serving")) for s in activating), seen  # READY=1 came with it
    entries = box.journal(unit=UNIT)
    started = [e for e in entries if str(e.get("MESSAGE", "")).startswith("Started ")]
    assert len(started) == 1, "systemd logged no (or more than one) 'Started' line"
    ready_at = int(started[0]["__REALTIME_TIMESTAMP"])
    captured = [e for e in named(entries, "engine.capture_end") if e.get("PROFILE") == second]
    ready = named(entries, "supervisor.ready")  # logged when the first probe succeeded
    assert captured and len(ready) == 1, sorted({str(e.get("EVENT")) for e in entries})
    assert captured[-1]["DONE"] == captured[-1]["EXPECTED"], captured[-1]  # every graph captured
    assert max(int(e["__REALTIME_TIMESTAMP"]) for e in captured) <= ready_at
    # Supervisor events are sent to journald from a writer thread: their own EVENT_TIME_USEC says
    # when they happened (the journal's timestamp is when the datagram arrived).
    assert ready[0]["PROFILE"] == second and int(ready[0]["EVENT_TIME_USEC"]) <= ready_at
    # the crash was the supervisor's business: a fallback, not a restart of the unit
    assert box.prop(UNIT, "NRestarts") == "0"


def test_status_text_shows_phase_profile_and_tokens_per_second(box: Sandbox) -> None:
    status = box.prop(UNIT, "StatusText")
    # this unit fell back at its start: STATUS= says from which profile and why
    match = re.fullmatch(r"serving profile=([a-z0-9_.-]+) \(fallback from ([a-z0-9_.-]+): [a-z_]+\) "
                         r"tok/s=(\d+\.\d)", status)
    assert match, status
    assert match.group(1) == "no-prefill-graph" and match.group(2) != match.group(1), status
    assert float(match.group(3)) > 0, status


def test_journal_holds_structured_events_and_engine_lines_at_their_priorities(box: Sandbox) -> None:
    entries = box.journal(unit=UNIT)
    supervisor = [e for e in entries if e.get("EVENT") and e.get("SOURCE") != "engine"]
    assert supervisor and all(e["SYSLOG_IDENTIFIER"] == "sglang-supervisor" for e in supervisor)
    # each event's fields are journal fields, at the event's priority
    launch = named(entries, "engine.launch")
    assert [(e["PROFILE"], e["ATTEMPT"], e["PRIORITY"]) for e in launch] == [
        ("tuned", "1", "6"), ("no-prefill-graph", "2", "6")], launch
    failed = named(entries, "engine.failed")
    assert len(failed) == 1 and failed[0]["PRIORITY"] == "3", failed
    assert failed[0]["PROFILE"] == "tuned" and failed[0]["FAILURE_CLASS"], failed[0]
    fallback = named(entries, "profile.fallback")
    assert [(e["FROM_PROFILE"], e["TO_PROFILE"], e["PRIORITY"]) for e in fallback] == [
        ("tuned", "no-prefill-graph", "4")], fallback
    ready = named(entries, "supervisor.ready")
    assert float(ready[0]["TOK_S"]) > 0 and ready[0]["PRIORITY"] == "6", ready
    # the engine's own lines: its traceback at err, its ready line at info, each line once
    engine = engine_lines(entries)
    text = [str(e.get("MESSAGE", "")) for e in engine]
    traceback = [e for e, t in zip(engine, text, strict=True) if "Traceback (most recent call last)" in t]
    assert len(traceback) == 1 and traceback[0]["PRIORITY"] == "3", traceback
    ready_line = [e for e, t in zip(engine, text, strict=True) if "fired up and ready to roll" in t]
    assert len(ready_line) == 1 and ready_line[0]["PRIORITY"] == "6", ready_line
    assert {e["_PID"] for e in engine} == {supervisor[0]["_PID"]}  # forwarded, not inherited
    # journalctl's own filters work on them
    errors = box.journal("-p", "err", unit=UNIT)
    assert {str(e.get("EVENT")) for e in errors} >= {"engine.failed"}
    assert not [e for e in errors if "fired up" in str(e.get("MESSAGE", ""))]
    by_field = box.journal("EVENT=profile.fallback", unit=UNIT)
    assert [e["TO_PROFILE"] for e in by_field] == ["no-prefill-graph"]


def test_logscan_reads_the_engine_log_run_by_run(box: Sandbox) -> None:
    # Issue 18 item 6, as an operator types it: the documented engine log now holds two runs, the
    # tuned engine that crashed during capture and no-prefill-graph serving. logscan summarises the
    # last run, lists the other with its failure, and counts lines as `wc -l` does.
    log = Path("/var/log/sglang-supervisor/qwen-engine.log")
    out = box.run("sglang-supervisor", "logscan", "--json", str(log)).stdout
    doc = json.loads(out)
    runs = doc["runs"]
    assert len(runs) >= 2 and doc["run"] == runs[-1]["run"], runs
    assert doc["ready"] and doc["failure"] is None, doc
    failed = [r for r in runs[:-1] if r["failure"]]
    assert failed and not failed[-1]["ready"], runs
    wc_l = log.read_bytes().count(b"\n")
    assert runs[-1]["last_line"] <= wc_l and runs[0]["first_line"] == 1, (runs, wc_l)
    text = box.run("sglang-supervisor", "logscan", str(log)).stdout
    assert "READY" in text.upper() and "FAILED" not in text.split("\n")[0].upper(), text


def test_doctor_sees_the_fallback_and_the_units_view_and_accepts_a_hub_id(box: Sandbox) -> None:
    # the server above serves no-prefill-graph after the tuned profile crashed during capture
    cfg = yaml.safe_load(QWEN_YAML.read_text())
    assert "/" in cfg["engine"]["model_path"] and not cfg["engine"]["model_path"].startswith("/")
    url = f"http://127.0.0.1:{cfg['engine']['port']}"
    proc = box.run("sglang-supervisor", "doctor", "--config", str(QWEN_YAML), "--url", url, check=False,
                   timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr  # a Hugging Face id is not an error
    assert "is a Hugging Face id" in out, out
    assert ("the live server runs the fallback profile no-prefill-graph (level 1 of the ladder), "
            "not tuned") in out, out
    assert "tuned failed (" in out, out
    assert f"{UNIT} sees the supervisor's interpreter /opt/venvs/sglang-supervisor/bin/python" in out, out


def test_doctor_refuses_paths_the_unit_cannot_see(box: Sandbox, tmp_path: Path) -> None:
    # an engine venv and a model under /root pass as root in the shell; the unit (ProtectHome=yes)
    # would fail 203/EXEC or not find the weights
    name = "systestdoctor"
    cfg = demo_config()
    cfg["name"] = name
    cfg["engine"]["command"] = ["/root/.venvs/sglang/bin/python3", "-m", "sglang.launch_server"]
    models = Path("/root/.systest-doctor/models")
    (models / "Qwen3.6-27B").mkdir(parents=True, exist_ok=True)  # there for root (check validates it)
    cfg["engine"]["model_path"] = str(models / "Qwen3.6-27B")
    cfg["engine"]["version"] = "0.5.23"
    path = ETC / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    try:
        proc = box.run("sglang-supervisor", "doctor", "--config", str(path), check=False, timeout=300)
    finally:
        path.unlink()
        shutil.rmtree(models.parent)
    out = proc.stdout
    assert proc.returncode == 1, out
    unit = f"sglang-supervisor@{name}.service"
    assert f"{unit} cannot see the engine command /root/.venvs/sglang/bin/python3" in out, out
    assert f"{unit} cannot see the model {models}/Qwen3.6-27B" in out, out
    assert "ProtectHome=yes hides /root" in out and f"BindReadOnlyPaths={models}" in out, out


def test_engine_hang_is_detected_and_the_supervisor_restarts_the_engine(box: Sandbox) -> None:
    before = box.show(UNIT, "NRestarts", "MainPID")
    old = engine_pids(box)
    assert old, "no engine process in the unit"
    mark = cursor(box)
    box.run("kill", "-STOP", *map(str, old))
    try:
        box.wait_for("a new engine", lambda: set(engine_pids(box)) - set(old), START_S)
    finally:
        box.run("kill", "-CONT", *map(str, box.alive(old)), check=False)
    box.wait_active(UNIT, START_S)
    assert box.show(UNIT, "NRestarts", "MainPID") == before  # the supervisor did it, not systemd
    new = events(box, since_cursor=mark)
    assert named(new, "engine.wedged"), sorted({str(e.get("EVENT")) for e in new})
    assert [e["FAILURE_CLASS"] for e in named(new, "engine.failed")] == ["wedged"]
    # a stopped engine cannot drain (booleans: "True" in journal fields, "true" in MESSAGE)
    assert named(new, "engine.stopped")[0]["KILLED"].lower() == "true"
    box.wait_for("old engine gone", lambda: not box.alive(old), 30)


def test_killed_supervisor_is_restarted_by_systemd_and_no_old_engine_survives(box: Sandbox) -> None:
    restarts = int(box.prop(UNIT, "NRestarts"))
    main = box.prop(UNIT, "MainPID")
    old = engine_pids(box)
    assert old
    mark = cursor(box)
    box.run("kill", "-KILL", main)
    box.wait_for("systemd restart", lambda: int(box.prop(UNIT, "NRestarts")) > restarts, 60)
    # systemd starts the unit again only once its cgroup is empty: nothing of the old engine is left
    assert not box.alive(old), old
    box.wait_active(UNIT, START_S)
    assert box.prop(UNIT, "MainPID") != main
    assert engine_pids(box) and not set(engine_pids(box)) & set(old)
    new = events(box, since_cursor=mark)
    messages = [str(e.get("MESSAGE", "")) for e in new]
    assert any("Main process exited, code=killed, status=9/KILL" in m for m in messages), messages
    assert named(new, "supervisor.start") and named(new, "supervisor.ready")


def test_frozen_supervisor_trips_the_watchdog(box: Sandbox) -> None:
    box.dropin(UNIT, "60-watchdog", "[Service]\nWatchdogSec=3s\n")
    box.systemctl("restart", UNIT, timeout=START_S)
    box.wait_active(UNIT, START_S)
    restarts = int(box.prop(UNIT, "NRestarts"))
    mark = cursor(box)
    box.run("kill", "-STOP", box.prop(UNIT, "MainPID"))
    box.wait_for("watchdog restart", lambda: int(box.prop(UNIT, "NRestarts")) > restarts, 60)
    messages = " ".join(str(e.get("MESSAGE", "")) for e in events(box, since_cursor=mark))
    assert "Watchdog timeout" in messages and "Failed with result 'watchdog'" in messages, messages
    box.wait_active(UNIT, START_S)
    (box.root / f"run/systemd/system/{UNIT}.d/60-watchdog.conf").unlink()
    box.systemctl("daemon-reload")


def test_reload_rereads_the_configuration(box: Sandbox) -> None:
    box.wait_active(UNIT, START_S)
    main = box.prop(UNIT, "MainPID")
    old = engine_pids(box)
    cfg = demo_config()
    running = yaml.safe_load(QWEN_YAML.read_text())
    cfg["engine"]["port"] = running["engine"]["port"]
    # the metrics endpoint is bound at start: a reload that moved it would be refused
    cfg["metrics"]["address"] = running["metrics"]["address"]
    cfg["engine"]["env"] = {"SYSTEST_RELOADED": "1"}  # changes the engine's environment
    write_config(cfg)
    mark = cursor(box)
    box.systemctl("reload", UNIT, timeout=START_S)
    # supervisor events reach journald from a writer thread: wait for the record, do not race it
    reload = box.wait_for("the supervisor.reload record",
                          lambda: named(events(box, since_cursor=mark), "supervisor.reload"), 30)
    assert [e["CHANGED"].lower() for e in reload] == ["true"], reload

    def reloaded_engine() -> bool:
        for pid in set(engine_pids(box)) - set(old):
            with_env = box.run("cat", f"/proc/{pid}/environ", check=False).stdout
            if "SYSTEST_RELOADED=1" in with_env:
                return True
        return False

    box.wait_for("an engine started with the new configuration", reloaded_engine, START_S)
    box.wait_active(UNIT, START_S)
    assert box.prop(UNIT, "MainPID") == main  # a reload, not a restart of the unit


def test_stop_drains_and_leaves_no_process_within_timeout_stop(box: Sandbox) -> None:
    box.wait_active(UNIT, START_S)
    pids = box.unit_pids(UNIT)
    limit = seconds(box, box.prop(UNIT, "TimeoutStopUSec"))
    assert limit >= 60
    t0 = time.monotonic()
    mark = cursor(box)
    box.systemctl("stop", UNIT, timeout=limit + 30)
    took = time.monotonic() - t0
    props = box.show(UNIT, "ActiveState", "Result", "ExecMainStatus")
    assert props == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}, props
    assert took < limit
    assert not box.alive(pids)
    new = events(box, since_cursor=mark)
    assert named(new, "supervisor.stopping"), [e.get("EVENT") for e in new]
    stopped = named(new, "engine.stopped")
    assert [(e["REASON"], e["DRAINED"].lower(), e["KILLED"].lower()) for e in stopped] == [
        ("signal", "true", "false")], stopped
    assert [e["CODE"] for e in named(new, "supervisor.exit")] == ["0"]


# ---------------------------------------------------------------------------------- packaging
def repack(deb: Path, tmp_path: Path, suffix: str, example_note: str) -> tuple[Path, str]:
    """The package as the next release: a newer version whose example qwen.yaml changed upstream."""
    unpacked = tmp_path / "pkg"
    subprocess.run(["dpkg-deb", "-R", str(deb), str(unpacked)], check=True)
    control = unpacked / "DEBIAN" / "control"
    version = re.search(r"^Version: (.+)$", control.read_text(), re.M)
    assert version
    newer = f"{version.group(1)}+{suffix}"
    control.write_text(control.read_text().replace(f"Version: {version.group(1)}", f"Version: {newer}"))
    example = unpacked / str(EXAMPLES).lstrip("/") / "qwen.yaml"
    example.write_text(example.read_text() + f"# {example_note}\n")
    # the md5sums must stay true, or dpkg --verify would flag the example
    sums = unpacked / "DEBIAN" / "md5sums"
    rel = str(example.relative_to(unpacked))
    digest = subprocess.run(["md5sum", rel], cwd=unpacked, capture_output=True, text=True, check=True).stdout
    sums.write_text("".join(digest if line.endswith(f"  {rel}\n") else line
                            for line in sums.read_text().splitlines(keepends=True)))
    upgrade = tmp_path / f"upgrade-{suffix}.deb"
    subprocess.run(["dpkg-deb", "-b", "-Zgzip", "-z1", str(unpacked), str(upgrade)], check=True,
                   capture_output=True)
    return upgrade, newer


SECOND = "systest2"
SECOND_UNIT = f"sglang-{SECOND}.service"


def test_upgrade_restarts_every_running_unit_and_never_stops_at_a_prompt(
    box: Sandbox, deb: Path, tmp_path: Path
) -> None:
    """Issue 18 items 1 and 7: dpkg as an unattended upgrade runs it (stdin at EOF, the policy of a
    real server: see conftest.allow_service_actions), while sglang-qwen and a unit made by
    `sglang-model add` serve, and the operator has edited qwen.yaml while the example changed."""
    second = demo_config()
    second["name"] = SECOND
    second["engine"]["log_file"] = f"/var/log/sglang-supervisor/{SECOND}-engine.log"
    source = tmp_path / "second.yaml"
    source.write_text(yaml.safe_dump(second, sort_keys=False))
    box.run("sglang-model", "add", SECOND, "--from", str(source))
    try:
        box.dropin(SECOND_UNIT, "50-systest", TEST_DROPIN)
        write_config(demo_config())  # the operator's edit
        edited = QWEN_YAML.read_bytes()
        box.systemctl("start", UNIT, SECOND_UNIT, timeout=START_S)
        before = {u: box.prop(u, "MainPID") for u in (UNIT, SECOND_UNIT)}
        upgrade, newer = repack(deb, tmp_path, "systest1", "changed upstream")
        mark = cursor(box)
        proc = box.run("dpkg", "-i", str(upgrade), input="", check=False, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "conffile" not in proc.stdout + proc.stderr
        assert box.run("dpkg-query", "-W", "-f=${Version} ${Status}", "sglang-supervisor").stdout == (
            f"{newer} install ok installed")
        assert box.run("dpkg", "--audit").stdout.strip() == ""  # nothing half-configured
        assert QWEN_YAML.read_bytes() == edited
        assert (EXAMPLES / "qwen.yaml").read_text().endswith("# changed upstream\n")
        for unit in (UNIT, SECOND_UNIT):
            state = box.show(unit, "ActiveState", "MainPID")
            assert state["ActiveState"] == "active", box.diagnose(UNIT)
            assert state["MainPID"] != before[unit], f"{unit} was not restarted by the upgrade"
            messages = [str(e.get("MESSAGE", "")) for e in box.journal(f"--after-cursor={mark}", unit=unit)]
            stops = [m for m in messages if m.startswith("Stopping ")]
            starts = [m for m in messages if m.startswith("Started ")]
            assert len(stops) == 1 and len(starts) == 1, messages  # one restart, not stop + skip
    finally:
        box.systemctl("stop", SECOND_UNIT, check=False)
        box.run("sglang-model", "remove", SECOND, check=False)
        (ETC / f"{SECOND}.yaml").unlink(missing_ok=True)


def test_security_exposure_is_the_one_the_docs_state(box: Sandbox) -> None:
    """OPERATIONS.md quotes what `systemd-analyze security sglang-qwen` prints on a running systemd."""
    out = box.run("systemd-analyze", "security", "--no-pager", UNIT).stdout
    measured = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out)
    assert measured, out
    docs = (REPO / "docs" / "OPERATIONS.md").read_text()
    stated = re.search(r"`systemd-analyze security sglang-qwen` rates the unit \*\*(\d+\.\d+)\*\*", docs)
    assert stated, "OPERATIONS.md no longer states the exposure level"
    print(f"systemd-analyze security {UNIT}: {measured.group(1)}")
    assert stated.group(1) == measured.group(1)


def test_purge_removes_what_the_package_made_and_keeps_what_the_operator_added(box: Sandbox) -> None:
    box.systemctl("stop", UNIT, check=False)
    box.run("mkdir", "-p", "/var/lib/sglang-supervisor", "/var/log/sglang-supervisor")
    added = ETC / "qwen.key"  # e.g. the API key a LoadCredential= drop-in reads
    added.write_text("secret\n")
    try:
        proc = box.run("dpkg", "--purge", "sglang-supervisor", timeout=300)
        for path in ("/var/lib/sglang-supervisor", "/var/log/sglang-supervisor",
                     "/var/cache/sglang-supervisor", str(QWEN_YAML), "/usr/share/sglang-supervisor",
                     "/opt/venvs/sglang-supervisor", f"/lib/systemd/system/{UNIT}"):
            assert not Path(path).exists(), path
        assert added.read_text() == "secret\n"
        assert "kept /etc/sglang-supervisor: it holds files you added: qwen.key" in proc.stderr, proc.stderr
        assert box.prop(UNIT, "LoadState") == "not-found"
    finally:
        added.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            ETC.rmdir()
    assert not ETC.exists()


def test_install_script_is_idempotent_and_uninstall_purges(box: Sandbox) -> None:
    require(Path("/usr/bin/python3").exists(),
            "scripts/install.sh needs the system python3", apt_fix("python3-venv"))
    for _ in range(2):
        box.run(str(REPO / "scripts" / "install.sh"), timeout=600)
    assert box.prop(UNIT, "FragmentPath") == f"/usr/local/lib/systemd/system/{UNIT}"
    assert box.run("/usr/local/bin/sglang-supervisor", "--version").returncode == 0
    assert box.run("sglang-sim", "--help").returncode == 0
    # the venv is built on the system interpreter, which the unit (ProtectHome=yes) can run
    home = box.run("sed", "-n", "s/^home = //p", "/opt/venvs/sglang-supervisor/pyvenv.cfg").stdout.strip()
    assert home == "/usr/bin", home
    assert QWEN_YAML.exists() and not (ETC / "demo.yaml").exists()
    box.run(str(REPO / "scripts" / "uninstall.sh"), "--purge", timeout=120)
    for path in ("/opt/venvs/sglang-supervisor", "/usr/local/lib/systemd/system/sglang-qwen.service",
                 "/etc/sglang-supervisor", "/usr/local/sbin/sglang-model",
                 "/usr/local/share/sglang-supervisor"):
        assert not Path(path).exists(), path
    assert box.run("id", "sglang", check=False).returncode != 0


def test_install_script_refuses_an_interpreter_the_unit_cannot_run(box: Sandbox, tmp_path: Path) -> None:
    """A pyenv (or any) python under /root: the unit would fail 203/EXEC while check passes as root."""
    require(Path("/usr/bin/python3").exists(), "needs the system python3")
    hidden = Path("/root/.systest-pyenv/bin")
    hidden.mkdir(parents=True, exist_ok=True)
    (hidden / "python3").unlink(missing_ok=True)
    (hidden / "python3").symlink_to("/usr/bin/python3")
    try:
        proc = box.run(str(REPO / "scripts" / "install.sh"), check=False, timeout=120,
                       env={"PYTHON": str(hidden / "python3")})
    finally:
        shutil.rmtree(hidden.parent)
        box.run(str(REPO / "scripts" / "uninstall.sh"), "--purge", check=False, timeout=120)
    assert proc.returncode != 0
    assert "ProtectHome=yes hides /home, /root and /run/user" in proc.stderr, proc.stderr
    assert "PYTHON=/usr/bin/python3" in proc.stderr  # the fix
    assert not Path("/opt/venvs/sglang-supervisor").exists()
