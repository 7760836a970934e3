"""Multi-node groups (issue 17): a leader and a worker node's supervisor on loopback, each over
its own simulated SGLang node (`--nnodes 2`, TP 2: TP0 on the leader, TP1 on the worker)."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.group import Report
from sglang_supervisor.core.linkauth import AUTH_HEADER
from sglang_supervisor.shell.engineproc.process import group_members
from sglang_supervisor.shell.links.grouplink import stamp_now
from supervised import Daemon, base_config, free_port, start

pytestmark = pytest.mark.integration

SECRET = b"3a" * 32


def group_configs(tmp: Path, *faults: str, restart: str = "group", **timeouts: float
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(leader, worker) configurations: the same ladder, node ranks 0 and 1, own ports and dirs."""
    (tmp / "leader").mkdir()
    (tmp / "worker").mkdir()
    secret = tmp / "group.secret"  # one file for both nodes, as copied to every node
    secret.write_text(SECRET.decode() + "\n")
    secret.chmod(0o600)
    leader = base_config(tmp / "leader", *faults, **timeouts)
    leader["group"] = {"nnodes": 2, "node_rank": 0, "dist_init_addr": f"127.0.0.1:{free_port()}",
                       "link": f"127.0.0.1:{free_port()}", "restart": restart,
                       "leader_timeout_s": 2.0, "poll_interval_s": 0.2, "secret_file": str(secret)}
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
    # Only the worker says so (issue 29.1): the group moves on, the leader's state keeps no blame.
    leader.event("profile.bad_not_remembered", node_rank=1, profile=fallback["from_profile"])
    leader.notified("READY=1")
    worker.event("group.engine_start", generation=2, profile=fallback["to_profile"])
    for d in (worker, leader):
        assert d.stop() == 0
    state = json.loads((tmp_path / "leader" / "state" / "demo.state.json").read_text())
    assert all(not fp["bad"] for fp in state["fingerprints"].values())


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


def test_forged_and_replayed_reports_are_refused_and_blame_no_profile(daemons, tmp_path) -> None:
    """Issue 29.1: a caller of the link without the secret posts failed reports (the attack that
    marked every profile known-bad); one with a captured worker message replays it. Neither is
    believed: the group keeps serving generation 1 on its first profile, nothing is marked bad."""
    from sglang_supervisor.core.linkauth import sign

    leader_cfg, worker_cfg = group_configs(tmp_path)
    leader_cfg["metrics"] = {"enabled": True, "address": f"127.0.0.1:{free_port()}"}
    leader = start(daemons, tmp_path / "leader", leader_cfg)
    worker = start(daemons, tmp_path / "worker", worker_cfg)
    leader.notified("READY=1")
    worker.event("group.engine_start", generation=1, profile="tuned")
    link = "http://" + leader_cfg["group"]["link"]
    with httpx.Client(timeout=5.0) as client:
        view = client.get(link + "/group")  # an outsider learns nothing, not even the instance ids
        assert view.status_code == 401 and "generation" not in view.text
        forged = Report(1, "guess", 1, "failed", FailureClass.CAPTURE_OOM, "oom").to_json()
        for _ in range(10):
            assert client.post(link + "/group/report", content=forged).status_code == 401
        wrong = sign(b"w" * 64, "report", method="POST", path="/group/report", stamp=stamp_now(1),
                     body=forged)
        assert client.post(link + "/group/report", content=forged,
                           headers={AUTH_HEADER: wrong}).status_code == 401
        # A message the worker sends (its own instance, serving generation 1), captured off the
        # wire and sent twice: the first is the worker's, the second a replay.
        instance = worker.event("group.worker_start")["instance"]
        body = Report(1, instance, 1, "serving", None, "", 1, 1).to_json()
        header = sign(SECRET, "report", method="POST", path="/group/report", stamp=stamp_now(1),
                      body=body)
        assert client.post(link + "/group/report", content=body, headers={AUTH_HEADER: header}
                           ).status_code == 200
        again = client.post(link + "/group/report", content=body, headers={AUTH_HEADER: header})
        assert again.status_code == 401 and again.text == "refused: replayed\n"
        metrics = client.get(f"http://{leader_cfg['metrics']['address']}/metrics").text
    # the GET and the ten posts without a header:
    assert 'sglang_supervisor_group_link_rejected_total{reason="unauthenticated"} 11.0' in metrics
    assert 'sglang_supervisor_group_link_rejected_total{reason="forged"} 1.0' in metrics
    assert 'sglang_supervisor_group_link_rejected_total{reason="replayed"} 1.0' in metrics
    rejected = leader.named("group.link_rejected")
    assert [e["reason"] for e in rejected] == ["unauthenticated", "forged", "replayed"]  # one a reason
    assert not leader.named("group.member_failed") and not leader.named("profile.fallback")
    assert SECRET.decode() not in metrics + "".join(map(str, leader.events + worker.events))
    status = httpx.get(f"http://{leader_cfg['metrics']['address']}/status", timeout=5.0).json()
    assert status["group"]["generation"] == 1 and status["group"]["serving_nodes"] == [1]
    worker.wait_for("the worker still serves generation 1",
                    lambda: any(n.startswith("STATUS=node 1: serving generation 1") for n in worker.notes))
    for d in (worker, leader):
        assert d.stop() == 0


def test_a_worker_with_another_secret_never_joins(daemons, tmp_path) -> None:
    leader_cfg, worker_cfg = group_configs(tmp_path)
    other = tmp_path / "worker" / "other.secret"
    other.write_text("7b" * 32 + "\n")
    other.chmod(0o600)
    worker_cfg["group"]["secret_file"] = str(other)
    leader = start(daemons, tmp_path / "leader", leader_cfg)
    worker = start(daemons, tmp_path / "worker", worker_cfg)
    leader.event("group.link_rejected", reason="forged")
    refused = worker.event("group.leader_refused", status=401)
    assert "forged" in refused["body"]
    assert not worker.named("group.engine_start") and not leader.named("supervisor.ready")
    for d in (worker, leader):
        assert d.stop() == 0


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
