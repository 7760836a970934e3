"""`sglang-supervisor run` driving the simulator through every lifecycle path of issue 3.

Each test starts the real daemon as a subprocess with a NOTIFY_SOCKET we own, reads its JSON log
lines, and checks what systemd and an operator would see: READY/STOPPING/RELOADING datagrams,
stable event names with their fields, exit codes, the persisted state, and that no engine
process outlives a stop. Simulated time runs fast (SGLANG_SIM_TIME_SCALE); deadlines are generous
so a loaded CI machine slows the tests down instead of failing them.
"""

from __future__ import annotations

import copy
import json
import signal
from pathlib import Path

import pytest
import yaml

from sglang_supervisor.shell.engineproc.process import group_members
from supervised import (
    DEADLINE_S,
    Daemon,
    assert_no_engine_left,
    base_config,
    fault_first_profile,
    start,
    stop_cleanly,
)

pytestmark = pytest.mark.integration

# test_probe_supervised.py uses this module as its harness (these names and the fixtures below).
__all__ = ["DEADLINE_S", "Daemon", "base_config", "fault_first_profile", "start", "stop_cleanly"]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


# ------------------------------------------------------------------------------------ tests

def test_capture_success_ready_after_every_capture_and_probe(daemons, workdir) -> None:
    d = start(daemons, workdir, base_config(workdir), env={"WATCHDOG_USEC": "2000000"})
    spawned = d.event("engine.spawned")
    engine_env = Path(f"/proc/{spawned['pid']}/environ").read_bytes().split(b"\0")
    assert not any(v.startswith((b"NOTIFY_SOCKET=", b"WATCHDOG_USEC=")) for v in engine_env)
    d.notified("READY=1")
    assert any(n.startswith("EXTEND_TIMEOUT_USEC=") for n in d.notes)  # while the log moved
    d.notified("WATCHDOG=1")
    ready = d.event("supervisor.ready")
    assert ready["profile"] == "tuned" and ready["tok_s"] > 0
    ends = d.named("engine.capture_end")
    # TP 2 with NEXTN on the hybrid Qwen3.6: verify + prefill on both ranks, draft decode and
    # extend on TP0; the MTP draft's prefill graph (expected on both ranks with a breakable prefill
    # backend) is settled by its `Disable prefill CUDA graph because ...` line on each rank, as real
    # 0.5.17 logs it (tests/fixtures/sglang-0.5.17-h200-seed). Every expected capture was settled.
    settled = d.named("engine.prefill_graph_disabled")
    assert {e["event"] for e in settled} and len(ends) + 2 == spawned["captures_expected"] == 8
    assert sorted((e["owner"], e["graph"], e["rank"]) for e in ends) == [
        ("draft", "decode", "TP0"), ("draft", "extend", "TP0"), ("target", "prefill", "TP0"),
        ("target", "prefill", "TP1"), ("target", "verify", "TP0"), ("target", "verify", "TP1")]
    order = [e["event"] for e in d.events]
    assert order.index("engine.ready") < order.index("supervisor.ready")
    assert max(i for i, n in enumerate(order) if n == "engine.capture_end") < order.index(
        "supervisor.ready")
    assert any(n.startswith("STATUS=") and "profile=tuned" in n for n in d.notes)
    state = json.loads((workdir / "state" / "demo.state.json").read_text())
    assert "tuned" in json.dumps(state)
    log_text = (workdir / "engine.log").read_text()
    assert "The server is fired up and ready to roll!" in log_text
    stop_cleanly(d)


def test_periodic_probes_refresh_status_tok_s(daemons, workdir) -> None:
    data = base_config(workdir)
    data["probe"].update({"interval_s": 0.2, "baseline_runs": 2})
    d = start(daemons, workdir, data)
    d.notified("READY=1")
    d.wait_for("two periodic probes", lambda: len(d.named("probe.ok")) >= 2)
    ready_at = d.notes.index("READY=1")
    # the ready probe's figure, then one per periodic probe (systemctl status shows the latest)
    d.wait_for("STATUS= after each periodic probe", lambda: len(
        [n for n in d.notes[ready_at:] if n.startswith("STATUS=serving profile=tuned tok/s=")]) >= 3)
    stop_cleanly(d)


@pytest.mark.parametrize(("fault", "failure_class", "next_profile"), [
    ("capture-fail:prefill", "prefill_graph_failed", "no-prefill-graph"),
    ("capture-fail:verify:oom", "capture_oom", "low-mem"),
    ("capture-fail:verify:error", "capture_failed", "no-prefill-graph"),
    ("capture-fail:draft-extend", "draft_capture_failed", "no-spec"),
    ("kv-oom", "kv_cache_oom", "no-prefill-graph"),
])
def test_failed_start_falls_back_by_remediation(daemons, workdir, fault, failure_class,
                                                next_profile) -> None:
    data = fault_first_profile(base_config(workdir), fault)
    data["restart"]["derive"] = []  # the remediation table alone (derived profiles: test_faults.py)
    d = start(daemons, workdir, data)
    fb = d.event("profile.fallback")
    assert (fb["from_profile"], fb["failure_class"], fb["to_profile"]) == (
        "tuned", failure_class, next_profile)
    d.notified("READY=1")
    assert d.event("supervisor.ready")["profile"] == next_profile
    failed = d.event("engine.failed", profile="tuned")
    assert failed["failure_class"] == failure_class and failed["seconds"] >= 0
    stop_cleanly(d)


def test_crash_after_ready_same_profile_once_then_next(daemons, workdir) -> None:
    d = start(daemons, workdir, fault_first_profile(base_config(workdir), "crash@50"))
    retry = d.event("profile.retry_same")
    assert retry["profile"] == "tuned"
    fb = d.event("profile.fallback")
    assert fb["from_profile"] == "tuned" and fb["to_profile"] == "no-prefill-graph"
    d.notified("READY=1", count=3)  # tuned, tuned again, then no-prefill-graph
    # the log line may trail the datagram (the log is written by a background thread)
    assert d.event("supervisor.ready", profile="no-prefill-graph")["attempt"] == 3
    stop_cleanly(d)


def test_hang_during_capture_is_detected_and_falls_back(daemons, workdir) -> None:
    data = fault_first_profile(base_config(workdir, stall_s=4), "hang:capture")
    d = start(daemons, workdir, data)
    hang = d.event("engine.hang")
    assert hang["profile"] == "tuned"
    fb = d.event("profile.fallback")
    assert fb["failure_class"] == "hang"
    d.notified("READY=1")
    stop_cleanly(d)


def test_hang_while_serving_is_wedged_and_restarted(daemons, workdir) -> None:
    # 100 simulated s (2 s) after ready: the READY probe must finish first, on a loaded machine too
    data = fault_first_profile(base_config(workdir), "hang:serving@100")
    data["restart"]["same_profile_retries"] = 0
    d = start(daemons, workdir, data)
    d.notified("READY=1")
    assert d.event("engine.wedged")["profile"] == "tuned"
    fb = d.event("profile.fallback")
    assert fb["failure_class"] == "wedged"
    d.notified("READY=1", count=2)
    stop_cleanly(d)


@pytest.mark.parametrize("phase_event", [
    "engine.spawned", "engine.weights_begin", "engine.capture_begin", "supervisor.ready",
])
def test_sigterm_in_each_phase_exits_zero_and_leaves_nothing(daemons, workdir, phase_event) -> None:
    d = start(daemons, workdir, base_config(workdir))
    d.event(phase_event)
    stop_cleanly(d)
    assert d.event("supervisor.exit")["code"] == 0


def test_sighup_unchanged_changed_and_broken(daemons, workdir) -> None:
    data = base_config(workdir)
    d = start(daemons, workdir, data)
    d.notified("READY=1")
    first_pid = d.engine_pids()[0]

    d.proc.send_signal(signal.SIGHUP)
    d.event("supervisor.reload", changed=False)
    d.notified("READY=1", count=2)
    assert d.engine_pids() == [first_pid]

    d.config_path.write_text("engine: [this is not a mapping\n")
    n = len(d.events)
    d.proc.send_signal(signal.SIGHUP)
    d.event("supervisor.reload_failed", after=n)
    assert d.engine_pids() == [first_pid] and d.proc.poll() is None

    changed = copy.deepcopy(data)
    changed["profiles"][0]["args"]["mem-fraction-static"] = 0.85
    d.write_config(changed)
    d.proc.send_signal(signal.SIGHUP)
    d.event("supervisor.reload", changed=True)
    d.wait_for("a second engine", lambda: len(d.engine_pids()) == 2)
    d.notified("RELOADING=1", count=2)
    d.notified("READY=1", count=4)  # start, unchanged reload, failed reload, changed reload
    assert d.event("supervisor.ready", attempt=2)["profile"] == "tuned"
    assert group_members(first_pid) == []
    stop_cleanly(d)


@pytest.mark.parametrize("merged", [False, True], ids=["as-sent", "merged-while-stopped"])
def test_quick_sighups_are_handled_one_at_a_time_and_the_last_file_wins(
        daemons, workdir, merged: bool) -> None:
    """Three SIGHUPs back to back, each after a new file: the lifecycle loop takes them from its
    inbox one at a time (a reload ends before the next begins), every SIGHUP is answered by a
    reload that began after it, and what runs at the end is the last file.

    POSIX may merge a pending SIGHUP with the next one before our handler runs, so the test
    cannot count reloads or requests; it asserts what the design promises whatever the kernel
    merged. Each file adds one key to the one before (file k = base + keys 1..k), so a reload's
    `changed` says which file it read: a reload that read file 3 can only have begun after the
    third write, and one always does, because the third SIGHUP (merged or not) is delivered after
    that write and answered by a reload that reads the file when it begins. `merged`: the daemon
    is stopped (SIGSTOP) while the three are sent, so the kernel surely merges them."""
    data = base_config(workdir)
    d = start(daemons, workdir, data)
    d.notified("READY=1")
    engine = d.engine_pids()
    n = len(d.events)
    steps = (("health_interval_s", 2), ("health_timeout_s", 3), ("health_failures", 3))
    keys = [f"timeouts.{key}" for key, _ in steps]
    changed = copy.deepcopy(data)
    if merged:
        d.proc.send_signal(signal.SIGSTOP)
    for key, value in steps:
        assert changed["timeouts"][key] != value  # each file really changes its key
        changed["timeouts"][key] = value
        tmp = d.config_path.with_suffix(".tmp")  # whole files only: a reload never reads half of one
        tmp.write_text(yaml.safe_dump(changed, sort_keys=False))
        tmp.replace(d.config_path)
        d.proc.send_signal(signal.SIGHUP)
    if merged:
        d.proc.send_signal(signal.SIGCONT)

    def reload_records() -> list[dict]:
        return [e for e in d.events[n:] if e.get("event") in (
            "supervisor.reload_begin", "supervisor.reload_end")]

    def newest_file_read(records: list[dict]) -> int:
        """Which file (1..3) the reloads so far had read, from the keys they changed (0: none)."""
        seen = {k for e in records if e["event"] == "supervisor.reload_end"
                for k in e.get("changed") or ()}
        return max((i + 1 for i, k in enumerate(keys) if k in seen), default=0)

    def settled() -> list[dict] | None:
        records = reload_records()
        begun = [e for e in records if e["event"] == "supervisor.reload_begin"]
        ended = [e for e in records if e["event"] == "supervisor.reload_end"]
        return records if newest_file_read(records) == 3 and len(ended) == len(begun) else None

    records = d.wait_for("the last file read by a reload that ended", settled)
    # begin 1, end 1, begin 2, end 2, ...: never two reloads at once, in the order they began
    first = records[0]["seq"]
    assert [(e["event"].rsplit("_", 1)[1], e["seq"]) for e in records] == [
        (step, seq) for seq in range(first, first + len(records) // 2) for step in ("begin", "end")]
    assert all(e["result"] == "applied" for e in records if e["event"] == "supervisor.reload_end")
    # files are read in the order written: the keys a reload changed are the next ones in line
    applied = [e["changed"] for e in records if e["event"] == "supervisor.reload_end"]
    read = 0
    for change in applied:
        if change:
            assert sorted(change) == sorted(keys[read:read + len(change)]), applied
            read += len(change)
    assert read == 3
    # merged or not, a reload answers at least one SIGHUP and none is counted twice
    asked = sum(e["requests"] for e in records if e["event"] == "supervisor.reload_begin")
    assert 1 <= asked <= 3
    # what runs is the last file: reloading it once more changes nothing
    n = len(d.events)
    d.proc.send_signal(signal.SIGHUP)
    again = d.event("supervisor.reload_end", after=n)
    assert again["result"] == "applied" and again["changed"] == []
    assert d.engine_pids() == engine and d.proc.poll() is None
    stop_cleanly(d)


def test_good_and_bad_profiles_persist_across_restarts(daemons, workdir) -> None:
    data = fault_first_profile(base_config(workdir), "capture-fail:prefill")
    d = start(daemons, workdir, data)
    d.notified("READY=1")
    stop_cleanly(d)

    d2 = start(daemons, workdir, data)
    launch = d2.event("engine.launch")
    assert launch["profile"] == "no-prefill-graph" and launch["reason"] == "last known good"
    assert d2.event("profile.known_bad_skipped")["profile"] == "tuned"
    d2.notified("READY=1")
    stop_cleanly(d2)

    d3 = start(daemons, workdir, data, "--retry-known-bad")
    d3.notified("READY=1")
    assert not d3.named("profile.known_bad_skipped")
    stop_cleanly(d3)


def test_every_profile_failing_exits_69(daemons, workdir) -> None:
    data = base_config(workdir)
    data["engine"]["env"]["SGLANG_SIM_FAULTS"] = "crash:load"
    d = start(daemons, workdir, data)
    assert d.exit_code() == 69
    launched = [e["profile"] for e in d.named("engine.launch")]
    assert launched == [p["name"] for p in data["profiles"]]
    assert d.event("supervisor.exit")["code"] == 69
    assert not any(n == "READY=1" for n in d.notes)
    assert_no_engine_left(d)


@pytest.mark.parametrize("breakage", ["unknown_key", "removed_flag"])
def test_bad_config_exits_78_with_a_clear_report(daemons, workdir, breakage) -> None:
    data = base_config(workdir)
    if breakage == "unknown_key":
        data["timeouts"]["stal_s"] = 3
    else:
        data["profiles"][1]["args"]["definitely-not-a-flag"] = True
    d = start(daemons, workdir, data)
    assert d.exit_code() == 78
    text = "\n".join(d.raw)
    assert "fix" in text and "Traceback" not in text
    assert not d.named("engine.launch")
