"""Scenario multinode, s11_multinode (issue 17; --nnodes 2): leader and worker supervisors on one
host, one GPU each; READY after the worker's captures, a killed worker rank restarts the group."""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any

from .adapters import SupervisorRun, descendants, free_port
from .common import check
from .context import Context


def s11_multinode(ctx: Context) -> None:
    """Leader + worker supervisors, SGLang's --nnodes 2 --dist-init-addr 127.0.0.1:PORT, one
    GPU each (CUDA_VISIBLE_DEVICES): READY only after the worker's captures; a worker rank
    SIGKILLed -> the group restarts within the bound and is READY again."""
    if ctx.o.nnodes != 2 or ctx.o.tp % 2:
        ctx.skip("s11_multinode", "not run: needs --nnodes 2 and an even --tp")
        return
    host = ctx.o.dist_init_addr
    dist, link = f"{host}:{free_port()}", f"{host}:{free_port()}"
    runs: list[SupervisorRun] = []
    secret = write_group_secret(ctx)
    try:
        for rank in (0, 1):
            cfg = node_config(ctx, rank, dist, link, secret)
            runs.append(SupervisorRun(ctx.o.python, cfg, ctx.work / f"node{rank}", f"node{rank}"))
        leader, worker = runs
        ready, checks = group_ready(ctx, leader, worker)
        numbers: dict[str, Any] = {}
        ranks = [p for p in descendants(worker.proc.pid)
                 if "scheduler" in p["cmd"] or p["comm"].startswith("sglang::sched")]
        if ready and ranks:
            checks += kill_a_worker_rank(ctx, leader, ranks[0], numbers)
        else:
            checks.append(check("a scheduler process of the worker node was found", bool(ranks)))
        for run in (worker, leader):
            rc, secs = run.stop(60)
            checks.append(check(f"{run.cfg_path.stem} stopped with 0", rc == 0, {"rc": rc, "s": secs}))
        ctx.record("s11_multinode", checks, numbers)
    finally:
        for run in runs:
            run.close()


def write_group_secret(ctx: Context) -> Path:
    """The link's shared secret (group.secret_file): one owner-only file for both nodes."""
    secret = ctx.work / "group.secret"
    ctx.work.mkdir(parents=True, exist_ok=True)
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return secret


def node_config(ctx: Context, rank: int, dist: str, link: str, secret: Path) -> dict[str, Any]:
    """Node `rank`'s configuration: the group section, and on GPUs its half of the --tp GPUs."""
    cfg = ctx.config(f"node{rank}")
    cfg["group"] = {"nnodes": 2, "node_rank": rank, "dist_init_addr": dist, "link": link,
                    "leader_timeout_s": 10.0, "poll_interval_s": 0.5,
                    "secret_file": str(secret)}
    if ctx.real:  # SGLang uses GPU base_gpu_id + local rank on each node: split them
        per = ctx.o.tp // 2
        cfg["engine"]["env"]["CUDA_VISIBLE_DEVICES"] = ",".join(
            str(g) for g in range(rank * per, (rank + 1) * per))
    return cfg


def group_ready(ctx: Context, leader: SupervisorRun,
                worker: SupervisorRun) -> tuple[bool, list[dict[str, Any]]]:
    """Wait for the leader's READY=1; whether it came, and the checks of the group's start."""
    deadline = time.time() + min(ctx.left(), 600)
    ready = leader.wait(lambda: bool(leader.notify.times("READY=1")), deadline)
    # The log line comes through the supervisor's log writer thread: it may reach us some
    # ms after the READY=1 datagram (measured up to ~30 ms under load), so wait for it.
    leader.wait(lambda: bool(leader.named("supervisor.ready")), time.time() + 10)
    members = leader.named("group.members_ready")
    sup_ready = leader.named("supervisor.ready")
    return ready, [check("leader READY=1", bool(ready)),
                   check("members ready before supervisor.ready",
                         bool(members and sup_ready and members[0][0] <= sup_ready[0][0])),
                   check("worker engine started", bool(worker.named("group.engine_start")))]


def kill_a_worker_rank(ctx: Context, leader: SupervisorRun, rank: dict[str, Any],
                       numbers: dict[str, Any]) -> list[dict[str, Any]]:
    """SIGKILL one scheduler of the worker node: the group restarts and is READY again, the
    leader's engine ends within 30 s. Adds that time to `numbers`; returns the checks."""
    t_kill = time.time()
    os.kill(rank["pid"], signal.SIGKILL)
    again = leader.wait(lambda: len(leader.notify.times("READY=1")) >= 2,
                        time.time() + min(ctx.left(), 600))
    stopped = [t for t, d in leader.named("engine.stopped")
               if d.get("reason") == "group_member_failed"]
    numbers["worker_rank_kill_to_leader_engine_stopped_s"] = (
        round(stopped[0] - t_kill, 2) if stopped else None)
    return [check("group restarted and READY again", again),
            check("leader engine ended within 30 s",
                  bool(stopped) and stopped[0] - t_kill < 30,
                  numbers["worker_rank_kill_to_leader_engine_stopped_s"])]
