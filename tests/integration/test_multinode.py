"""Multi-node groups (issue 17): a leader and a worker node's supervisor on loopback, each over
its own simulated SGLang node (`--nnodes 2`, TP 2: TP0 on the leader, TP1 on the worker)."""

from __future__ import annotations

import copy
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.shell.process import group_members
from supervised import Daemon, base_config, free_port, start

pytestmark = pytest.mark.integration


def group_configs(tmp: Path, *faults: str, restart: str = "group", **timeouts: float
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(leader, worker) configurations: the same ladder, node ranks 0 and 1, own ports and dirs."""
    (tmp / "leader").mkdir()
    (tmp / "worker").mkdir()
    leader = base_config(tmp / "leader", *faults, **timeouts)
    leader["group"] = {"nnodes": 2, "node_rank": 0, "dist_init_addr": f"127.0.0.1:{free_port()}",
                       "link": f"127.0.0.1:{free_port()}", "restart": restart,
                       "leader_timeout_s": 2.0, "poll_interval_s": 0.2}
    worker = copy.deepcopy(leader)
    worker["group"]["node_rank"] = 1
    worker["engine"]["port"] = free_port()
    worker["engine"]["log_file"] = str(tmp / "worker" / "engine.log")
    worker["state_dir"] = str(tmp / "worker" / "state")
    worker["runtime_dir"] = str(tmp / "worker" / "run")
    return leader, worker


def index_of(d: Daemon, name: str, after: int = 0, **fields: Any) -> int:
    ev = d.event(name, after=after, **fields)
    return d.events.index(ev)


def engine_gone(pid: int, timeout: float) -> float:
    """Seconds until every process of engine group `pid` is gone (fails after `timeout`)."""
    t0 = time.monotonic()
    while group_members(pid):
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"engine group {pid} still alive after {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def test_leader_ready_only_after_the_worker_nodes_captures(daemons, tmp_path) -> None:
    leader_cfg, worker_cfg = group_configs(tmp_path)
    leader = start(daemons, tmp_path / "leader", leader_cfg)
    worker = start(daemons, tmp_path / "worker", worker_cfg, env={"WATCHDOG_USEC": "2000000"})
    leader.notified("READY=1")
    members = index_of(leader, "group.members_ready", generation=1)
    assert members < index_of(leader, "supervisor.ready")
    worker.event("group.engine_start", generation=1, profile="tuned")
    worker.notified("READY=1")  # "following the leader": the group's READY is the leader's
    worker.wait_for("the worker's STATUS= says its node serves generation 1",
                    lambda: any(n.startswith("STATUS=node 1: serving generation 1") for n in worker.notes))
    log = (tmp_path / "worker" / "engine.log").read_text()
    assert re.search(r"TP1\] Capture target \w+ CUDA graph end", log)
    assert "Dummy health check server started in background thread at" in log  # 0.5.5+ wording
    assert "TP0]" not in log  # the worker node hosts only its own ranks
    assert "TP1]" not in (tmp_path / "leader" / "engine.log").read_text()
    worker.notified("WATCHDOG=1")  # the units' WatchdogSec= holds for worker nodes too
    worker.proc.send_signal(signal.SIGHUP)  # systemctl reload of a worker: logged, nothing stops
    worker.event("group.reload_ignored")
    assert worker.proc.poll() is None
    for d in (worker, leader):
        assert d.stop() == 0


def test_worker_rank_crash_after_ready_restarts_the_group(daemons, tmp_path) -> None:
    # TP1 (the worker node's rank) is SIGKILLed 300 simulated s (6 s) after the node is up, after
    # the leader's READY: the group's engines end at once and the group starts again, READY again.
    leader_cfg, worker_cfg = group_configs(tmp_path, "crash@300+rank=1")
    leader = start(daemons, tmp_path / "leader", leader_cfg)
    worker = start(daemons, tmp_path / "worker", worker_cfg)
    leader.notified("READY=1")
    failed = leader.event("group.member_failed", node_rank=1, failure_class="child_crashed")
    stopped = leader.event("engine.stopped", reason="group_member_failed")
    assert stopped["seconds"] < 10  # the leader's engine ends now, not after NCCL's 600 s
    worker.event("group.engine_failed", generation=failed["generation"])
    assert leader.event("engine.failed", attempt=failed["generation"])["after_ready"] is True
    leader.notified("READY=1", count=2)
    worker.event("group.engine_start", generation=failed["generation"] + 1)
    for d in (worker, leader):
        assert d.stop() == 0


def test_capture_failure_on_the_worker_falls_back_for_the_group(daemons, tmp_path) -> None:
    leader_cfg, worker_cfg = group_configs(tmp_path, "capture-fail:verify:oom+rank=1")
    leader = start(daemons, tmp_path / "leader", leader_cfg)
    worker = start(daemons, tmp_path / "worker", worker_cfg)
    leader.event("group.member_failed", node_rank=1, failure_class="capture_oom")
    fallback = leader.event("profile.fallback", failure_class="capture_oom")
    leader.notified("READY=1")
    worker.event("group.engine_start", generation=2, profile=fallback["to_profile"])
    for d in (worker, leader):
        assert d.stop() == 0


def test_leader_death_stops_the_worker_engines_within_the_bound(daemons, tmp_path) -> None:
    leader_cfg, worker_cfg = group_configs(tmp_path)
    leader = start(daemons, tmp_path / "leader", leader_cfg)
    worker = start(daemons, tmp_path / "worker", worker_cfg)
    leader.notified("READY=1")
    pid = int(worker.event("group.engine_start")["pid"])
    leader.proc.send_signal(signal.SIGKILL)
    # bound: leader_timeout_s (2) + poll (0.2) + stop (drain <= 2 + kill 5) + slack
    seconds = engine_gone(pid, 2.0 + 0.2 + 7.0 + 5.0)
    assert seconds >= 1.5  # it waited for the leader's silence to pass leader_timeout_s
    worker.event("group.engine_stop")
    assert worker.stop() == 0


def test_worker_supervisor_restarted_alone_rejoins_at_the_next_generation(daemons, tmp_path) -> None:
    leader_cfg, worker_cfg = group_configs(tmp_path)
    leader = start(daemons, tmp_path / "leader", leader_cfg)
    worker = start(daemons, tmp_path / "worker", worker_cfg)
    leader.notified("READY=1")
    first = worker.event("group.engine_start")["generation"]
    assert worker.stop() == 0
    again = start(daemons, tmp_path / "worker", worker_cfg)
    joined = again.event("group.engine_start")
    assert joined["generation"] > first
    leader.notified("READY=1", count=2)
    for d in (again, leader):
        assert d.stop() == 0


def test_external_restart_mode_exits_76_on_every_node(daemons, tmp_path) -> None:
    leader_cfg, worker_cfg = group_configs(tmp_path, "crash@300+rank=1", restart="external")
    leader = start(daemons, tmp_path / "leader", leader_cfg)
    worker = start(daemons, tmp_path / "worker", worker_cfg)
    leader.notified("READY=1")
    assert leader.exit_code() == ExitCode.GROUP_FAILED == 76
    assert worker.exit_code() == 76
    for d in (leader, worker):
        for pid in d.engine_pids() + [int(e["pid"]) for e in d.named("group.engine_start")]:
            assert group_members(pid) == []
    assert os.path.exists(tmp_path / "leader" / "engine.log")


def test_gpu_e2e_is_ready_for_two_nodes_on_one_host(tmp_path) -> None:
    """`scripts/gpu-e2e --nnodes 2` (the real run waits for a two-GPU machine) in simulator mode."""
    import json
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OUT=str(tmp_path / "out"), GPU_E2E_WORKDIR=str(tmp_path / "work"))
    proc = subprocess.run([str(root / "scripts" / "gpu-e2e"), "--engine", "sim", "--tp", "2",
                           "--nnodes", "2", "--dist-init-addr", "127.0.0.1", "--budget-s", "280"],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    s7 = report["scenarios"]["s11_multinode"]
    assert proc.returncode == 0 and s7["status"] == "pass", proc.stdout[-2000:] + proc.stderr[-2000:]
    assert s7["numbers"]["worker_rank_kill_to_leader_engine_stopped_s"] < 10
