"""A real `sglang-supervisor run` over the simulator, as integration tests drive it.

`Daemon` starts the daemon as a subprocess with a NOTIFY_SOCKET it owns and collects its JSON log
records and sd_notify lines; `base_config` makes demo.yaml fast and private (simulated time,
tiny probes, short timeouts, its own port and directories). Deadlines are generous so a loaded
machine slows a test down instead of failing it.

`tests` is not a package: tests import this as `from supervised import ...` (see conftest.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_supervisor.shell.engineproc.process import group_members
from sglang_supervisor.shell.files.configfile import default_demo_config_path

TIME_SCALE = "0.02"
DEADLINE_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fault_first_profile(data: dict[str, Any], *specs: str) -> dict[str, Any]:
    """Simulator faults (SGLANG_SIM_FAULTS) for the first profile's engine only."""
    data["profiles"][0].setdefault("env", {})["SGLANG_SIM_FAULTS"] = ",".join(specs)
    return data


def base_config(workdir: Path, *faults: str, **timeouts: float) -> dict[str, Any]:
    """demo.yaml made quick: fast simulated time, tiny probes, short timeouts, own ports and dirs.
    `faults` go to the first profile; `timeouts` override the `timeouts:` section."""
    data = copy.deepcopy(yaml.safe_load(default_demo_config_path().read_text()))
    eng = data["engine"]
    eng["port"] = free_port()
    eng["log_file"] = str(workdir / "engine.log")
    eng.setdefault("env", {})["SGLANG_SIM_TIME_SCALE"] = TIME_SCALE
    data["state_dir"] = str(workdir / "state")
    data["runtime_dir"] = str(workdir / "run")
    data["metrics"] = {"enabled": False}
    data["probe"].update({"input_tokens": 16, "max_new_tokens": 8, "interval_s": 3600,
                          "timeout_s": 10, "baseline_runs": 1})
    data["timeouts"].update({"stall_s": 10, "start_s": 120, "ready_probe_s": 20, "drain_s": 3,
                             "kill_s": 5, "gpu_release_s": 0, "health_interval_s": 1,
                             "health_timeout_s": 2, "health_failures": 2, **timeouts})
    data["restart"]["backoff_s"] = 0.1
    return fault_first_profile(data, *faults) if faults else data


class Daemon:
    """One `sglang-supervisor run` process, its notify socket and its JSON log.

    `stdout`: where the daemon's output goes instead of our log reader (then `events` stays empty).
    `prefix`: a command that execs the daemon (same pid), e.g. `unshare --mount ... sh -c`.
    """

    def __init__(self, workdir: Path, data: dict[str, Any], *extra: str, stdout: Any = None,
                 env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.config_path = workdir / "config.yaml"
        self.write_config(data)
        self.sock_dir = Path(tempfile.mkdtemp(prefix="sn-", dir="/tmp"))  # short: AF_UNIX path limit
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.sock_dir / "n"))
        self.sock.settimeout(0.2)
        self.events: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.raw: list[str] = []
        self._cv = threading.Condition()
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM")}
        full_env.update({"NOTIFY_SOCKET": str(self.sock_dir / "n"), "PYTHONUNBUFFERED": "1"})
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "sglang_supervisor", "run", "--config",
             str(self.config_path), "--log-format", "json", *extra],
            stdout=subprocess.PIPE if stdout is None else stdout,
            stderr=subprocess.STDOUT if stdout is None else stdout, env=full_env, text=True)
        self._notify_reader = threading.Thread(target=self._read_notify, daemon=True)
        self._notify_reader.start()
        self._log_reader: threading.Thread | None = None
        if stdout is None:
            self._log_reader = threading.Thread(target=self._read_log, daemon=True)
            self._log_reader.start()

    def write_config(self, data: dict[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(data, sort_keys=False))

    def _read_log(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cv:
                self.raw.append(line.rstrip("\n"))
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        self.events.append(record)
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def _read_notify(self) -> None:
        # Until the daemon has exited AND the socket is drained: its last datagrams (STOPPING=1)
        # may still be queued when it exits.
        while True:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                if self.proc.poll() is not None:
                    return
                continue
            except OSError:  # closed by close()
                return
            with self._cv:
                self.notes.extend(data.decode().splitlines())
                self._cv.notify_all()

    def _finished(self) -> bool:
        """The daemon exited and everything it wrote has been read: waiting longer is useless."""
        readers = [t for t in (self._log_reader, self._notify_reader) if t is not None]
        return self.proc.poll() is not None and not any(t.is_alive() for t in readers)

    def _tail(self) -> str:
        return "\n".join(self.raw[-40:])

    def wait_for(self, what: str, pred: Callable[[], Any], timeout: float = DEADLINE_S) -> Any:
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                got = pred()
                if got:
                    return got
                left = deadline - time.monotonic()
                if left <= 0 or self._finished():
                    got = pred()
                    if got:
                        return got
                    pytest.fail(f"gave up waiting for {what}; daemon rc={self.proc.poll()}\n{self._tail()}")
                self._cv.wait(min(left, 0.2))

    def event(self, name: str, timeout: float = DEADLINE_S, after: int = 0, **fields: Any
              ) -> dict[str, Any]:
        """The first log record `name` (from index `after` on) whose fields match."""
        def find() -> dict[str, Any] | None:
            return next((e for e in self.events[after:] if e.get("event") == name
                         and all(e.get(k) == v for k, v in fields.items())), None)

        desc = name + "".join(f" {k}={v}" for k, v in fields.items())
        result: dict[str, Any] = self.wait_for(desc, find, timeout)
        return result

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._cv:
            return [e for e in self.events if e.get("event") == name]

    def notified(self, text: str, count: int = 1, timeout: float = DEADLINE_S) -> None:
        self.wait_for(f"{count}x {text} on NOTIFY_SOCKET",
                      lambda: sum(1 for n in self.notes if n == text) >= count, timeout)

    def exit_code(self, timeout: float = DEADLINE_S) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the daemon did not exit within {timeout} s\n{self._tail()}")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.exit_code()

    def engine_pids(self) -> list[int]:
        return [int(e["pid"]) for e in self.named("engine.spawned")]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.engine_pids():  # never leave an engine behind, whatever failed
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.sock.close()
        self._notify_reader.join(5)
        shutil.rmtree(self.sock_dir, ignore_errors=True)


def start(daemons: list[Daemon], workdir: Path, data: dict[str, Any], *extra: str, **kw: Any) -> Daemon:
    """A Daemon that the test's `daemons` list (closed by a fixture) cleans up."""
    d = Daemon(workdir, data, *extra, **kw)
    daemons.append(d)
    return d


def assert_no_engine_left(d: Daemon) -> None:
    for pid in d.engine_pids():
        assert group_members(pid) == [], f"processes of engine group {pid} outlived the stop"


def stop_cleanly(d: Daemon) -> None:
    """SIGTERM: exit 0, STOPPING=1 sent, no process of any engine left."""
    assert d.stop() == 0
    d.notified("STOPPING=1")
    assert_no_engine_left(d)
