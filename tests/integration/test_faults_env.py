"""Faults of the engine's environment (docs/FAULTS.md): a port lost to a race, an engine process
that escapes its session, a disk that fills up under the engine log.

The real `sglang-supervisor run` over the simulator (tests/supervised.py). What each test checks
is what an operator needs: no orphan left, no profile blamed, no lost log byte that fit on disk.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from supervised import Daemon, free_port, start, stop_cleanly
from supervised import base_config as config
from tiers import AS_ROOT, require

pytestmark = pytest.mark.integration


def known_bad(workdir: Path) -> set[str]:
    path = workdir / "state" / "state.json"
    if not path.exists():
        return set()
    data = json.loads(path.read_text())
    return {p for fp in data["fingerprints"].values() for p in fp["bad"]}


def listen_on(port: int) -> socket.socket:
    """A stranger listening on `port` (as uvicorn binds: SO_REUSEADDR)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


# -- the port lost to a race ---------------------------------------------------------------------

def test_port_taken_after_preflight_is_waited_out_without_blame(daemons: list[Daemon],
                                                                tmp_path: Path) -> None:
    data = config(tmp_path)
    # Slower simulated time: seconds between the preflight (port free) and uvicorn's bind, for
    # the stranger to take the port in between.
    data["engine"]["env"]["SGLANG_SIM_TIME_SCALE"] = "0.1"
    port = data["engine"]["port"]
    d = start(daemons, tmp_path, data)
    first = d.event("engine.spawned")
    stranger = listen_on(port)
    try:
        failed = d.event("engine.failed")
        assert failed["failure_class"] == "port_in_use" and failed["profile"] == "tuned"
        waiting = d.event("supervisor.waiting", failure_class="port_in_use")
        assert waiting["profile"] == "tuned"
        d.wait_for("a waiting STATUS=", lambda: any(
            n.startswith("STATUS=waiting: port_in_use") for n in d.notes))
        assert len(d.engine_pids()) == 1  # no relaunch while the port is taken
    finally:
        stranger.close()
    d.event("supervisor.wait_over", failure_class="port_in_use")
    ready = d.event("supervisor.ready")
    assert ready["profile"] == "tuned"  # the same profile: it did nothing wrong
    assert [e["profile"] for e in d.named("engine.launch")] == ["tuned", "tuned"]
    assert d.engine_pids()[0] == first["pid"]
    assert known_bad(tmp_path) == set()
    assert not d.named("profile.fallback")
    stop_cleanly(d)


@pytest.mark.parametrize(("fault", "fix"), [
    ("env:cache-perm", "TRITON_CACHE_DIR"),
    ("env:cache-readonly", "XDG_CACHE_HOME"),
    ("env:no-cudart", "LD_LIBRARY_PATH"),
    ("env:no-nvrtc", "LD_LIBRARY_PATH"),
    ("env:no-cc", "install gcc"),
    ("env:jit-build", "JIT kernel build failed"),
])
def test_a_host_problem_exits_78_with_its_fix_and_walks_no_ladder(daemons: list[Daemon],
                                                                  tmp_path: Path, fault: str,
                                                                  fix: str) -> None:
    """Issue 25 F: an unwritable JIT cache, a missing CUDA library, no C compiler, a kernel
    build that fails before any capture (the simulator prints the real lines): every rung would
    fail the same way, so the first failure ends the start: 78, the fix, nothing marked bad."""
    d = start(daemons, tmp_path, config(tmp_path, fault))
    assert d.exit_code() == 78
    assert d.event("engine.failed", profile="tuned")["failure_class"] == "environment"
    reason = d.event("supervisor.exit")["reason"]
    assert reason.startswith("environment: ") and fix in reason, reason
    assert [e["profile"] for e in d.named("engine.spawned")] == ["tuned"]
    assert d.named("profile.fallback") == [] and d.named("profile.derived") == []
    assert known_bad(tmp_path) == set()
    assert "READY=1" not in d.notes


@pytest.mark.parametrize(("fault", "words"), [
    ("port-race", b"error while attempting to bind on address"),  # uvicorn's own words
    ("port-race:precheck", b"ValueError: port_base at "),  # SGLang's check of its derived ports
])
def test_port_race_inside_the_engine_exits_75_after_the_bound(daemons: list[Daemon],
                                                               tmp_path: Path, fault: str,
                                                               words: bytes) -> None:
    data = config(tmp_path, fault)
    data["restart"]["temporary_wait_s"] = 3
    d = start(daemons, tmp_path, data)
    assert d.exit_code() == 75
    failed = d.named("engine.failed")
    assert failed and {f["failure_class"] for f in failed} == {"port_in_use"}
    assert {e["profile"] for e in d.named("engine.launch")} == {"tuned"}  # never down the ladder
    assert known_bad(tmp_path) == set()
    assert "READY=1" not in d.notes
    exit_ev = d.event("supervisor.exit")
    assert exit_ev["code"] == 75 and "did not clear within 3 s" in exit_ev["reason"]
    assert words in (tmp_path / "engine.log").read_bytes()


# -- an engine process that escapes its session ---------------------------------------------------

def gone(pid: int) -> bool:
    """Dead and reaped (a zombie would still be a process table entry)."""
    return not Path(f"/proc/{pid}").exists()


def test_setsid_escapee_is_named_and_stopped_with_the_engine(daemons: list[Daemon],
                                                             tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path, "setsid-escape"))
    d.notified("READY=1")
    escaped = d.event("engine.escaped_process")
    pid = escaped["pid"]
    assert escaped["comm"] == "sim-escapee"
    assert escaped["session"] not in d.engine_pids()  # out of the engine's session and group
    assert not gone(pid)
    stop_cleanly(d)
    stopped = d.event("engine.escapees_stopped")
    assert f"{pid}:sim-escapee" in stopped["processes"]
    assert gone(pid)  # killed, and reaped by the supervisor (its subreaper)


def test_setsid_escapee_of_a_failed_start_is_gone_before_the_fallback(daemons: list[Daemon],
                                                                      tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path, "setsid-escape", "crash:load"))
    failed = d.event("engine.failed", profile="tuned")
    assert failed["failure_class"] != "port_in_use"
    orphans = d.event("engine.orphans")
    escapee = next(e for e in d.named("engine.escapees_stopped"))
    d.notified("READY=1")  # the next profile, without the first one's runaway around
    pid = int(escapee["processes"].split(":")[0])
    assert pid in orphans["pids"] and gone(pid)
    stop_cleanly(d)


# -- a disk that fills up under the engine log ---------------------------------------------------

def mount_namespace_prefix(mountpoint: Path, size: str) -> tuple[str, ...]:
    """Run the daemon in a mount namespace of its own with a small tmpfs on `mountpoint`: the
    disk fills for it alone, the host's disks are never touched."""
    script = f'mount -t tmpfs -o size={size},mode=0755 sglang-test {mountpoint} && exec "$@"'
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh")


def can_mount_tmpfs(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        return subprocess.run([*mount_namespace_prefix(probe, "64k"), "true"],
                              check=False, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
    return float(line.split()[1])


def test_disk_full_under_the_engine_log_is_an_event_and_a_metric(daemons: list[Daemon],
                                                                 tmp_path: Path) -> None:
    require(can_mount_tmpfs(tmp_path), "needs root (mount namespaces and tmpfs) for a real full disk",
            AS_ROOT)
    disk = tmp_path / "disk"
    disk.mkdir()
    data = config(tmp_path)
    data["engine"]["log_file"] = str(disk / "engine.log")
    data["metrics"] = {"enabled": True, "address": f"127.0.0.1:{free_port()}"}
    d = start(daemons, tmp_path, data, prefix=mount_namespace_prefix(disk, "512k"))
    d.notified("READY=1")
    url = "http://" + data["metrics"]["address"]
    assert metric(url, "sglang_supervisor_engine_log_writable") == 1
    theirs = Path(f"/proc/{d.proc.pid}/root") / str(disk).lstrip("/")  # the daemon's tmpfs
    before = (theirs / "engine.log").read_bytes()
    assert b"The server is fired up and ready to roll!" in before
    filler = theirs / "filler"
    with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as fh:
        while True:  # fill it (ENOSPC ends the loop); health checks keep the engine writing
            fh.write(b"\0" * 4096)
    failed = d.event("engine_log.write_failed")
    assert "No space left on device" in failed["error"]
    assert metric(url, "sglang_supervisor_engine_log_writable") == 0
    assert metric(url, "sglang_supervisor_engine_log_write_failures_total") == 1
    filler.unlink()  # the operator frees space
    recovered = d.event("engine_log.write_recovered")
    assert recovered["dropped_bytes"] > 0
    d.wait_for("engine output after the gap", lambda: (theirs / "engine.log").read_bytes().split(
        b"bytes of engine output are missing here")[-1].count(b"\n") >= 3)
    after = (theirs / "engine.log").read_bytes()
    assert after.startswith(before)  # nothing that was on disk was lost
    assert after.count(b"[sglang-supervisor] ") == 1  # one gap, one note
    assert metric(url, "sglang_supervisor_engine_log_writable") == 1
    assert metric(url, "sglang_supervisor_engine_log_dropped_bytes_total") == recovered["dropped_bytes"]
    assert len(d.named("engine_log.write_failed")) == 1  # once per spell, not per write
    stop_cleanly(d)
