"""The fault matrix (docs/FAULTS.md): `sglang-supervisor run` over the simulator, one fault each.

Every test starts the real daemon as a subprocess with a NOTIFY_SOCKET it owns and checks what
systemd and an operator would see: READY=1 (or not), the exit code, stable log events, and that no
engine process outlives the supervisor. Faults come from the simulator's fault grammar, from a
shell prelude in front of the engine command (garbage output), from the environment (a taken port,
a broken stdout, a fake NVML reporting a foreign GPU process, a wall clock that jumps) or from
signals. Simulated time is fast; deadlines are generous so a loaded machine slows the tests down
instead of failing them (no timing thresholds).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.shell.engineproc.process import group_members
from supervised import DEADLINE_S, Daemon, start
from supervised import base_config as config

pytestmark = pytest.mark.integration


def with_prelude(data: dict[str, Any], script: str) -> dict[str, Any]:
    """Run `script` (sh) in the engine's place first, then exec the real engine command."""
    data["engine"]["command"] = ["sh", "-c", script + '\nexec "$@"', "sh", *data["engine"]["command"]]
    return data


def wait_gone(pgids: list[int], timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while any(group_members(p) for p in pgids):
        if time.monotonic() > deadline:
            pytest.fail(f"engine processes left behind: {[group_members(p) for p in pgids]}")
        time.sleep(0.1)


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def ready_then_clean_stop(d: Daemon) -> None:
    d.notified("READY=1")
    pids = d.engine_pids()
    assert d.stop() == 0, d.named("supervisor.internal_error") or d.named("supervisor.exit")
    assert "STOPPING=1" in d.notes
    wait_gone(pids, timeout=5)  # the supervisor itself verified this before exiting 0


# -- crash and hang in each phase --------------------------------------------------------------

@pytest.mark.parametrize(("fault", "failure_class"), [
    ("crash:load", None),
    ("crash:capture", None),
    ("warmup-fail", "warmup_failed"),
])
def test_crash_in_each_startup_phase_falls_back(daemons: list[Daemon], tmp_path: Path, fault: str,
                                                failure_class: str | None) -> None:
    d = start(daemons, tmp_path, config(tmp_path, fault))
    failed = d.event("engine.failed", profile="tuned")
    if failure_class is not None:
        assert failed["failure_class"] == failure_class
    fb = d.event("profile.fallback")
    assert fb["from_profile"] == "tuned" and fb["to_profile"] != "tuned"
    d.event("supervisor.ready")
    ready_then_clean_stop(d)

def test_a_flag_sglang_refuses_on_this_gpu_rules_out_the_rungs_passing_it(
        daemons: list[Daemon], tmp_path: Path) -> None:
    """Real 0.5.17 refuses --enable-single-batch-overlap on any SM 9.x GPU and says "Please try
    removing --enable-single-batch-overlap argument": the rungs that pass it too (here
    no-prefill-graph, and low-mem through `extends`) would fail the same way, so they are skipped."""
    data = config(tmp_path)
    data["engine"]["env"]["SGLANG_SIM_GPU_SM"] = "9.0"
    data["profiles"][1]["args"]["enable-single-batch-overlap"] = True  # no-prefill-graph
    data["restart"]["derive"] = []  # the written ladder alone (derived: the tests below)
    d = start(daemons, tmp_path, data)
    failed = d.event("engine.failed", profile="tuned")
    assert failed["failure_class"] == "flag_refused"
    assert failed["refused_flag"] == "--enable-single-batch-overlap"
    assert "remove it from profile tuned" in failed["hint"]
    fb = d.event("profile.fallback")
    assert fb["to_profile"] == "no-spec", fb
    assert "not no-prefill-graph, low-mem" in fb["rule"]
    d.event("supervisor.ready")
    assert [e["profile"] for e in d.named("engine.spawned")] == ["tuned", "no-spec"]
    ready_then_clean_stop(d)


def test_a_refused_flag_is_dropped_from_the_same_profile_which_then_serves(
        daemons: list[Daemon], tmp_path: Path) -> None:
    """Issue 25: SGLang's refusal of --enable-single-batch-overlap on SM90 costs that flag only.
    The next start is `tuned` minus SBO (`tuned-no-sbo`), with every graph phase of `tuned` (the
    prefill graph included), not `no-prefill-graph`."""
    data = config(tmp_path)
    data["engine"]["env"]["SGLANG_SIM_GPU_SM"] = "9.0"
    d = start(daemons, tmp_path, data)
    assert d.event("engine.failed", profile="tuned")["failure_class"] == "flag_refused"
    derived = d.event("profile.derived")
    assert derived["from_profile"] == "tuned" and derived["to_profile"] == "tuned-no-sbo"
    assert derived["change"] == "drop --enable-single-batch-overlap"
    assert "Please try removing --enable-single-batch-overlap argument" in derived["asked_by"]
    assert d.event("supervisor.ready")["profile"] == "tuned-no-sbo"
    assert [e["profile"] for e in d.named("engine.spawned")] == ["tuned", "tuned-no-sbo"]
    graphs = {(e["owner"], e["graph"]) for e in d.named("engine.capture_end")}
    assert ("target", "prefill") in graphs  # the prefill graph `no-prefill-graph` gives up
    ready_then_clean_stop(d)
    # Remembered: the next start goes straight to the derived profile, no failed start first.
    again = start(daemons, tmp_path, data)
    assert again.event("supervisor.ready")["profile"] == "tuned-no-sbo"
    assert [e["profile"] for e in again.named("engine.spawned")] == ["tuned-no-sbo"]
    assert again.named("engine.failed") == []
    ready_then_clean_stop(again)


def test_a_capture_oom_halves_the_decode_graphs_max_batch_size_and_keeps_the_graphs(
        daemons: list[Daemon], tmp_path: Path) -> None:
    """Issue 25: a decode graph capture that OOMs at max batch 32 (the simulator's fault, only
    with that value on the command line) is answered with max batch 16 on the same profile,
    decode graphs still on, instead of `low-mem`."""
    data = config(tmp_path, "capture-fail:verify:oom+when=--cuda-graph-max-bs-decode=32")
    data["profiles"][0]["args"]["cuda-graph-max-bs-decode"] = 32
    d = start(daemons, tmp_path, data)
    assert d.event("engine.failed", profile="tuned")["failure_class"] == "capture_oom"
    derived = d.event("profile.derived")
    assert derived["to_profile"] == "tuned-graph-bs-16"
    assert derived["change"] == "--cuda-graph-max-bs-decode 32 -> 16"
    ready = d.event("supervisor.ready")
    assert ready["profile"] == "tuned-graph-bs-16"
    graphs = {(e["owner"], e["graph"]) for e in d.named("engine.capture_end")}
    assert ("target", "verify") in graphs
    ready_then_clean_stop(d)


def test_a_capture_oom_without_a_max_in_the_profile_halves_sglangs_resolved_default(
        daemons: list[Daemon], tmp_path: Path) -> None:
    """Issue 25 A: `tuned` sets no max batch size; SGLang resolved 16 for its verify graph (the
    simulator's server_args dump, as 0.5.23 prints it). The OOM goes away once the command sets
    the max (the simulator's `unless=`): half of 16, graphs kept."""
    data = config(tmp_path, "capture-fail:verify:oom+unless=--cuda-graph-max-bs-decode")
    d = start(daemons, tmp_path, data)
    assert d.event("engine.failed", profile="tuned")["failure_class"] == "capture_oom"
    derived = d.event("profile.derived")
    assert derived["to_profile"] == "tuned-graph-bs-8", derived
    assert derived["change"] == "--cuda-graph-max-bs-decode 16 -> 8"
    assert d.event("supervisor.ready")["profile"] == "tuned-graph-bs-8"
    assert ("target", "verify") in {(e["owner"], e["graph"]) for e in d.named("engine.capture_end")}
    ready_then_clean_stop(d)


def test_a_prefill_graph_oom_trims_the_prefill_graph_and_keeps_it(
        daemons: list[Daemon], tmp_path: Path) -> None:
    """Issue 25 B: the prefill graph's capture runs out of memory (the simulator's 0.5.23 text)
    until the command caps its tokens. The next start is `tuned` with half of SGLang's resolved
    8192 tokens, prefill graph still captured, not `no-prefill-graph`."""
    data = config(tmp_path, "capture-fail:prefill:oom+unless=--cuda-graph-max-bs-prefill")
    d = start(daemons, tmp_path, data)
    assert d.event("engine.failed", profile="tuned")["failure_class"] == "prefill_graph_failed"
    derived = d.event("profile.derived")
    assert derived["to_profile"] == "tuned-prefill-tokens-4096", derived
    assert derived["change"] == "--cuda-graph-max-bs-prefill 8192 -> 4096"
    assert d.event("supervisor.ready")["profile"] == "tuned-prefill-tokens-4096"
    assert ("target", "prefill") in {(e["owner"], e["graph"]) for e in d.named("engine.capture_end")}
    assert [e["profile"] for e in d.named("engine.spawned")] == ["tuned", "tuned-prefill-tokens-4096"]
    ready_then_clean_stop(d)


def test_a_missing_build_tool_exits_78_with_the_fix_and_blames_no_profile(
        daemons: list[Daemon], tmp_path: Path) -> None:
    """Issue 25 item 4: the JIT kernel build inside the first capture finds no ninja (torch's own
    text). No rung is tried after it and nothing is marked bad: the host needs the tool."""
    d = start(daemons, tmp_path, config(tmp_path, "capture-fail:verify:no-ninja"))
    assert d.exit_code() == 78
    failed = d.event("engine.failed", profile="tuned")
    assert failed["failure_class"] == "environment"
    assert "pip install ninja" in d.event("supervisor.exit")["reason"]
    assert [e["profile"] for e in d.named("engine.spawned")] == ["tuned"]
    assert d.named("profile.fallback") == [] and d.named("profile.derived") == []
    # Nothing was remembered against a profile: no state file was even written.
    states = [json.loads(p.read_text()) for p in (tmp_path / "state").rglob("*.json")]
    assert all(fs["bad"] == {} for st in states for fs in st["fingerprints"].values())


def test_hang_during_weight_load_is_detected_and_falls_back(daemons: list[Daemon], tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path, "hang:load", stall_s=4))
    hang = d.event("engine.hang")
    assert hang["profile"] == "tuned"
    fb = d.event("profile.fallback")
    assert fb["failure_class"] == "hang"
    assert d.event("supervisor.ready")["profile"] != "tuned"
    ready_then_clean_stop(d)


# -- the engine's environment ------------------------------------------------------------------

def test_engine_port_already_in_use_exits_temporary(daemons: list[Daemon], tmp_path: Path) -> None:
    data = config(tmp_path)
    data["restart"]["temporary_wait_s"] = 2  # waited out, bounded; then 75
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", data["engine"]["port"]))
        squatter.listen()
        d = start(daemons, tmp_path, data)
        assert d.exit_code() == 75  # EX_TEMPFAIL: systemd retries later, no profile is blamed
    assert "READY=1" not in d.notes
    assert any(n.startswith("STATUS=waiting: port_in_use") for n in d.notes)
    assert d.engine_pids() == []  # never started an engine onto a busy port
    exit_ev = d.event("supervisor.exit")
    assert exit_ev["code"] == 75
    assert StateKnownBad(tmp_path).profiles() == set()


class StateKnownBad:
    def __init__(self, workdir: Path) -> None:
        self.path = workdir / "state" / "demo.state.json"

    def profiles(self) -> set[str]:
        if not self.path.exists():
            return set()
        data = json.loads(self.path.read_text())
        return {p for fp in data["fingerprints"].values() for p in fp["bad"]}


FAKE_NVML = '''
"""A fake NVML: one H200 whose memory is held by a foreign process (pid {pid})."""
from types import SimpleNamespace


class NVMLError(Exception):
    pass


def nvmlInit():
    return None


def nvmlShutdown():
    return None


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(i):
    return ("gpu", i)


def nvmlSystemGetDriverVersion():
    return "580.65.06"


def nvmlDeviceGetName(h):
    return "NVIDIA H200"


def nvmlDeviceGetMemoryInfo(h):
    return SimpleNamespace(used=60 << 30, total=141 << 30, free=81 << 30)


def nvmlDeviceGetComputeRunningProcesses(h):
    return [SimpleNamespace(pid={pid}, usedGpuMemory=60 << 30)]


def __getattr__(name):
    if name.startswith("NVML_"):
        return 0

    def unsupported(*args):
        raise NVMLError(name + " is not supported by this fake")
    return unsupported
'''


def test_gpu_memory_held_by_a_foreign_process_exits_temporary(daemons: list[Daemon], tmp_path: Path) -> None:
    fake = tmp_path / "fakenvml"
    fake.mkdir()
    foreign = subprocess.Popen(["sleep", "300"])  # the "foreign" GPU user, outside our engine
    try:
        (fake / "pynvml.py").write_text(FAKE_NVML.format(pid=foreign.pid))
        pythonpath = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])
        data = config(tmp_path)
        data["restart"]["temporary_wait_s"] = 2
        d = start(daemons, tmp_path, data, env={"PYTHONPATH": pythonpath})
        assert d.exit_code() == 75
        assert any(n.startswith("STATUS=waiting: gpu_busy") for n in d.notes)
        busy = d.event("gpu.busy")
        assert str(foreign.pid) in json.dumps(busy)
        assert d.engine_pids() == []  # never started an engine onto a busy GPU
        assert "READY=1" not in d.notes
    finally:
        foreign.kill()
        foreign.wait()


def test_engine_that_ignores_sigterm_is_killed_with_its_group(daemons: list[Daemon], tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path, "ignore-sigterm", drain_s=1, kill_s=5))
    d.notified("READY=1")
    pids = d.engine_pids()
    assert d.stop() == 0, d.named("supervisor.internal_error") or d.named("supervisor.exit")
    stopped = d.event("engine.stopped")
    assert stopped.get("killed") is True or stopped.get("drained") is False
    wait_gone(pids, timeout=5)


# -- what the engine writes --------------------------------------------------------------------

def test_log_flood_invalid_utf8_and_megabyte_lines(daemons: list[Daemon], tmp_path: Path) -> None:
    prelude = textwrap.dedent("""\
        printf 'garbage \\377\\376\\300 not utf-8\\n'
        head -c 3000000 /dev/zero | tr '\\0' x; echo
        i=0; while [ $i -lt 20000 ]; do echo "flood line $i"; i=$((i+1)); done
        printf 'a\\rprogress\\rframes\\r'
    """)
    d = start(daemons, tmp_path, with_prelude(config(tmp_path), prelude))
    d.notified("READY=1")
    log_bytes = (tmp_path / "engine.log").read_bytes()
    assert b"\xff\xfe\xc0 not utf-8" in log_bytes  # the file keeps every byte as written
    assert b"x" * 3_000_000 in log_bytes
    assert b"flood line 19999" in log_bytes
    assert d.stop() == 0
    forwarded = [e for e in d.events if e.get("source") == "engine"]
    assert forwarded, "engine output is forwarded to the supervisor's log"
    assert max(len(str(e.get("text", ""))) for e in forwarded) < 100_000  # megabyte line truncated


def test_engine_log_file_deleted_mid_run_is_recreated(daemons: list[Daemon], tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path))
    d.notified("READY=1")
    log_path = tmp_path / "engine.log"
    log_path.unlink()
    pids = d.engine_pids()
    assert d.stop() == 0  # the drain writes more engine output after the deletion
    wait_gone(pids, timeout=5)
    assert log_path.exists(), "the engine log file is re-created after it was deleted"


def test_disk_full_for_the_engine_log_does_not_stop_the_engine(daemons: list[Daemon],
                                                               tmp_path: Path) -> None:
    data = config(tmp_path)
    data["engine"]["log_file"] = "/dev/full"  # every write fails with ENOSPC
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")  # the pipe kept draining; the events still arrived
    assert d.stop() == 0


# -- the supervisor's own surroundings ---------------------------------------------------------

def test_journald_unavailable_stdout_closed(daemons: list[Daemon], tmp_path: Path) -> None:
    r, w = os.pipe()
    os.close(r)  # whoever read our stdout is gone: every write gets EPIPE
    with os.fdopen(w, "w") as broken:
        d = start(daemons, tmp_path, config(tmp_path), stdout=broken)
    d.notified("READY=1")
    pids = children(d.proc.pid)  # no log to read the engine pid from
    assert pids
    d.proc.send_signal(signal.SIGTERM)
    assert d.exit_code() == 0
    d.notified("STOPPING=1")
    wait_gone(pids)


def test_journald_stuck_stdout_never_read(daemons: list[Daemon], tmp_path: Path) -> None:
    r, w = os.pipe()  # nobody reads: once the pipe buffer is full every write would block
    try:
        with os.fdopen(w, "w") as stuck:
            d = start(daemons, tmp_path, with_prelude(
                config(tmp_path), 'i=0; while [ $i -lt 5000 ]; do echo "chatty $i"; i=$((i+1)); done'),
                stdout=stuck)
        d.notified("READY=1")
        d.proc.send_signal(signal.SIGTERM)
        assert d.exit_code() == 0
    finally:
        os.close(r)


def test_metrics_port_taken_is_logged_and_serving_continues(daemons: list[Daemon], tmp_path: Path) -> None:
    data = config(tmp_path)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        data["metrics"] = {"enabled": True, "address": f"127.0.0.1:{squatter.getsockname()[1]}"}
        d = start(daemons, tmp_path, data)
        unavailable = d.event("metrics.unavailable")
        assert str(squatter.getsockname()[1]) in json.dumps(unavailable)
        ready_then_clean_stop(d)


def test_sighup_during_startup_keeps_starting(daemons: list[Daemon], tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path))
    d.event("engine.capture_begin")
    d.proc.send_signal(signal.SIGHUP)
    d.event("supervisor.reload")
    d.notified("READY=1")
    assert len(d.engine_pids()) == 1  # unchanged command: the starting engine was not restarted
    ready_then_clean_stop(d)


def test_supervisor_sigkilled_leaves_no_orphan_engine(daemons: list[Daemon], tmp_path: Path) -> None:
    d = start(daemons, tmp_path, config(tmp_path))
    d.event("engine.capture_begin")
    pids = d.engine_pids()
    assert pids and all(group_members(p) for p in pids)
    d.proc.kill()  # no chance to clean up: PDEATHSIG must take the engine down
    d.proc.wait()
    wait_gone(pids)


CLOCK_JUMP = '''
"""sitecustomize: the wall clock (time.time) jumps by OFFSET s once FLAG exists (an NTP step)."""
import os
import time

_real = time.time
_flag = os.environ["FAULT_CLOCK_FLAG"]
_offset = float(os.environ["FAULT_CLOCK_OFFSET"])


def _time():
    return _real() + (_offset if os.path.exists(_flag) else 0.0)


time.time = _time
'''


@pytest.mark.parametrize("offset", [86400.0 * 30, -86400.0 * 30])
def test_wall_clock_jump_while_serving(daemons: list[Daemon], tmp_path: Path, offset: float) -> None:
    site = tmp_path / "clockjump"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CLOCK_JUMP)
    flag = tmp_path / "jumped"
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "FAULT_CLOCK_FLAG": str(flag), "FAULT_CLOCK_OFFSET": str(offset)}
    d = start(daemons, tmp_path, config(tmp_path, health_interval_s=0.5), env=env)
    d.notified("READY=1")
    flag.touch()
    time.sleep(3)  # several health checks after the jump; timers run on the monotonic clock
    assert d.proc.poll() is None
    assert not d.named("engine.hang") and not d.named("engine.wedged") and not d.named("engine.failed")
    assert len(d.engine_pids()) == 1
    ready_then_clean_stop(d)
