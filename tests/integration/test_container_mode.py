"""Container mode: `sglang-supervisor run` as PID 1 of its own PID namespace (what a container
runtime gives it), without NOTIFY_SOCKET. The engine's launcher is SIGKILLed: its schedulers die
with it and are reparented to PID 1 -- the supervisor must reap them (no `<defunct>` left), restart
the engine, and on SIGTERM drain and exit 0 like under systemd. Logs are JSON on stdout.

Needs root for the PID namespace (`unshare --pid`); skips without, fails under CI."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervised import DEADLINE_S, base_config
from tiers import AS_ROOT, require

pytestmark = pytest.mark.integration


def children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            kids += [int(p) for p in (task / "children").read_text().split()]
    return kids


def stat(pid: int) -> tuple[str, str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()[0]


class Pid1:
    """unshare --pid --fork --mount-proc -- python -m sglang_supervisor run (auto log format)."""

    def __init__(self, workdir: Path, data: dict[str, Any]) -> None:
        cfg = workdir / "config.yaml"
        cfg.write_text(yaml.safe_dump(data, sort_keys=False))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SGLANG_SIM", "NOTIFY_SOCKET", "JOURNAL_STREAM", "WATCHDOG"))}
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
             sys.executable, "-m", "sglang_supervisor", "run", "--config", str(cfg)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        self.records: list[dict[str, Any]] = []
        self.non_json: list[str] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cv:
                try:
                    self.records.append(json.loads(line))
                except ValueError:
                    self.non_json.append(line)
                self._cv.notify_all()

    def wait(self, what: str, pred: Any, timeout: float = DEADLINE_S) -> Any:
        deadline = time.monotonic() + timeout
        with self._cv:
            while not (got := pred()):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    tail = "\n".join(json.dumps(r) for r in self.records[-20:])
                    pytest.fail(f"gave up waiting for {what}; rc={self.proc.poll()}\n{tail}")
                self._cv.wait(0.2)
            return got

    def count(self, event: str) -> int:
        return sum(1 for r in self.records if r.get("event") == event)

    def supervisor_pid(self) -> int:
        """PID 1 of the namespace, as this (the parent) namespace numbers it."""
        return self.wait("the supervisor process", lambda: children(self.proc.pid))[0]


@pytest.fixture
def pid1_runs() -> Iterator[list[Pid1]]:
    runs: list[Pid1] = []
    yield runs
    for r in runs:  # killing the namespace's init kills everything in it
        if r.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, pytest.fail.Exception):
                os.kill(r.supervisor_pid(), signal.SIGKILL)
            r.proc.wait(30)


def test_pid1_reaps_the_orphans_of_a_killed_launcher_and_drains_on_sigterm(
        tmp_path: Path, pid1_runs: list[Pid1]) -> None:
    require(os.geteuid() == 0 and shutil.which("unshare") is not None,
            "container mode needs root and unshare(1) for a PID namespace", AS_ROOT)
    data = base_config(tmp_path)
    data.setdefault("logging", {})["format"] = "auto"  # JSON must follow from "no journald, no tty"
    run = Pid1(tmp_path, data)
    pid1_runs.append(run)
    sup = run.supervisor_pid()
    run.wait("supervisor.ready", lambda: run.count("supervisor.ready") >= 1)
    launcher = next(p for p in children(sup) if stat(p)[1] != "Z")
    ranks = children(launcher)
    assert ranks, "the simulated launcher has scheduler/detokenizer children"

    os.kill(launcher, signal.SIGKILL)  # its children die with it (PDEATHSIG) and land on PID 1
    run.wait("the restart", lambda: run.count("supervisor.ready") >= 2)
    run.wait("orphans reaped", lambda: run.count("supervisor.reaped") >= 1)
    # Nothing of the dead engine lingers as a zombie under PID 1.
    zombies = [(p, stat(p)[0]) for p in children(sup) if stat(p)[1] == "Z"]
    assert zombies == []
    assert all(not Path(f"/proc/{p}").exists() for p in ranks)

    os.kill(sup, signal.SIGTERM)  # what the kubelet sends; a PID 1 gets it only with a handler
    assert run.proc.wait(DEADLINE_S) == 0
    assert run.count("engine.stopped") >= 1
    assert run.non_json == []  # no journald, no tty: JSON lines on stdout


# The engine as a wrapper: it starts a grandchild that a container's PID 1 adopts at once (a
# double fork, its own session, re-executed without the engine's tag: the engine's stop neither
# sees nor kills it; named like SGLang's children), then execs the simulator. The grandchild
# exits a second after the launcher: during the supervisor's shutdown, after the heartbeat's
# reaping has ended.
LINGER_ENGINE = r'''
import os, sys
leader = os.getpid()
if os.fork() == 0:
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_SUPERVISOR_ENGINE_TAG"}
    os.execve(sys.executable, [sys.executable, "-c", LINGER, str(leader)], env)
os.execv(sys.executable, [sys.executable, "-m", "sglang_supervisor.simulator", *sys.argv[1:]])
'''
LINGER = r'''
import ctypes, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ctypes.CDLL(None).prctl(15, b"sglang::linger", 0, 0, 0)  # PR_SET_NAME
while os.path.exists(f"/proc/{sys.argv[1]}/stat"):
    time.sleep(0.05)
time.sleep(1.0)  # the launcher is gone: exit a little after it, while the supervisor stops
'''


def test_pid1_reaps_the_children_that_die_during_its_shutdown(
        tmp_path: Path, pid1_runs: list[Pid1]) -> None:
    require(os.geteuid() == 0 and shutil.which("unshare") is not None,
            "container mode needs root and unshare(1) for a PID namespace", AS_ROOT)
    wrapper = tmp_path / "linger_engine.py"
    wrapper.write_text(LINGER_ENGINE.replace("LINGER,", repr(LINGER) + ","))
    data = base_config(tmp_path)
    data["engine"]["command"] = ["{python}", str(wrapper)]
    data.setdefault("logging", {})["format"] = "json"
    run = Pid1(tmp_path, data)
    pid1_runs.append(run)
    sup = run.supervisor_pid()
    run.wait("supervisor.ready", lambda: run.count("supervisor.ready") >= 1)

    os.kill(sup, signal.SIGTERM)
    assert run.proc.wait(DEADLINE_S) == 0
    events = [r.get("event") for r in run.records]
    stopped = events.index("engine.stopped")
    # The grandchild died after the engine's stop, under PID 1: the supervisor waited for it
    # before exiting, rather than leaving a zombie to the namespace's end.
    reaped = [r for r in run.records[stopped:] if r.get("event") == "supervisor.reaped"]
    tail = [(r.get("event"), r.get("names")) for r in run.records[stopped:]]
    assert any("sglang::linger" in r.get("names", "") for r in reaped), tail
