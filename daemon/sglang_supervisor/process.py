"""Engine process control: spawn in its own session, stop the whole group, verify nothing is left.

The engine runs nohup-style: its own session and process group (no controlling terminal, SIGHUP
ignored), stdin from /dev/null, stdout and stderr into ONE pipe that `enginelog` drains. It gets
PDEATHSIG=SIGKILL, so a supervisor killed with SIGKILL takes the engine's launcher with it (SGLang's
schedulers already follow their launcher the same way).

PDEATHSIG fires when the *thread* that forked exits, not the process: `spawn` must be called from
a thread that lives as long as the supervisor (the asyncio loop's thread), never from a pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sglang_supervisor.notify import clean_child_env

PR_SET_PDEATHSIG = 1
POLL_S = 0.05


@dataclass(frozen=True)
class Leftover:
    pid: int
    name: str


@dataclass(frozen=True)
class StopResult:
    returncode: int | None  # of the leader; None if it could not be reaped
    terminated: bool  # SIGTERM was sent to the leader
    drained: bool  # the leader exited within the drain time
    killed: bool  # SIGKILL was sent to the group
    seconds: float
    leftover: tuple[Leftover, ...] = field(default_factory=tuple)  # still alive after kill_s


def _load_prctl() -> Callable[..., int] | None:
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no PDEATHSIG, the group kill still applies
        return None
    return fn


# Resolved once in the parent: dlopen/dlsym after fork in a threaded process could deadlock.
_PRCTL = _load_prctl()


def _child_setup(parent_pid: int) -> None:
    """Runs in the child between fork and exec: keep it tiny."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may have died before prctl took effect: then nobody would ever kill us.
    if os.getppid() != parent_pid:
        os._exit(1)


def engine_env(base: Mapping[str, str], overlay: Mapping[str, str], venv_bin: str | None = None
               ) -> dict[str, str]:
    """The engine's environment: ours plus the profile's, minus systemd's notify/watchdog/fd vars.

    `venv_bin` (the engine's virtual environment's bin directory) goes first on PATH, as
    `source .venv/bin/activate` would do: SGLang JIT-compiles kernels with the `ninja` that pip
    installed beside it, and systemd's PATH does not hold that directory (measured on an H200 under
    the shipped unit: `FileNotFoundError: [Errno 2] No such file or directory: 'ninja'` while
    capturing the first CUDA graph, on every rung of the ladder)."""
    env = {**base, **overlay}
    if venv_bin:
        parts = [p for p in env.get("PATH", "").split(os.pathsep) if p]
        if venv_bin not in parts:
            env["PATH"] = os.pathsep.join([venv_bin, *parts])
    return clean_child_env(env)


def venv_bin_dir(executable: str) -> str | None:
    """The bin directory of the virtual environment `executable` lives in (not resolving
    symlinks: a venv's python links to the system one), or None outside a venv."""
    path = Path(executable)
    if not path.is_absolute():
        return None
    with contextlib.suppress(OSError):
        if (path.parent.parent / "pyvenv.cfg").is_file():
            return str(path.parent)
    return None


class EngineProcess:
    """One running engine. Output is read by the caller from `stdout_fd`."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.pgid = popen.pid  # start_new_session makes the leader its session and group leader
        self.we_stopped = False

    @classmethod
    def spawn(cls, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None
              ) -> EngineProcess:
        parent = os.getpid()
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            # PDEATHSIG and SIGHUP-immunity can only be set in the child; the hook only makes a
            # pre-resolved libc call, so no lock another thread might hold is taken after fork.
            preexec_fn=lambda: _child_setup(parent),  # noqa: PLW1509
            close_fds=True,
        )
        return cls(popen)

    @property
    def stdout_fd(self) -> int:
        assert self.popen.stdout is not None
        return self.popen.stdout.fileno()

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    async def wait(self) -> int:
        """Wait for the leader to exit (polling: no SIGCHLD handler fights with asyncio's)."""
        while True:
            rc = self.popen.poll()
            if rc is not None:
                return rc
            await asyncio.sleep(POLL_S)

    def group_members(self) -> list[Leftover]:
        return group_members(self.pgid)

    async def stop(self, drain_s: float, kill_s: float) -> StopResult:
        """SIGTERM the leader, wait up to `drain_s`, SIGKILL the whole group, verify it is gone.

        SGLang's drain has no limit of its own and keeps accepting requests, and a wedged
        scheduler makes it wait a minute for core dumps: the bound is ours.
        """
        self.we_stopped = True
        began = time.monotonic()
        terminated = drained = killed = False
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
                terminated = True
            drained = await self._wait_leader(drain_s)
        else:
            drained = True
        # Children (schedulers, detokenizer) may outlive the leader for a moment: kill the group
        # whether or not the leader drained, then wait until /proc shows none of them.
        if group_members(self.pgid) or self.popen.poll() is None:
            killed = True
            _killpg(self.pgid)
        leftover = await self._wait_group_gone(kill_s)
        if self.popen.poll() is None:
            await self._wait_leader(kill_s)
        return StopResult(
            returncode=self.popen.poll(),
            terminated=terminated,
            drained=drained,
            killed=killed,
            seconds=round(time.monotonic() - began, 3),
            leftover=tuple(leftover),
        )

    async def _wait_leader(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.popen.poll() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    async def _wait_group_gone(self, seconds: float) -> list[Leftover]:
        deadline = time.monotonic() + seconds
        while True:
            self.popen.poll()  # reap the leader so it does not linger as our zombie
            members = group_members(self.pgid)
            if not members:
                return []
            if time.monotonic() >= deadline:
                return members
            # Something joined late or survived: kill it again (by group and by pid).
            _killpg(self.pgid)
            for m in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(m.pid, signal.SIGKILL)
            await asyncio.sleep(POLL_S)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _stat_fields(text: str) -> tuple[str, str, int, int]:
    """(name, state, pgrp, session) from /proc/PID/stat; the name may hold spaces and parens."""
    lpar, rpar = text.index("("), text.rindex(")")
    name = text[lpar + 1:rpar]
    rest = text[rpar + 2:].split()
    return name, rest[0], int(rest[2]), int(rest[3])


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[Leftover]:
    """Live processes whose process group or session is `pgid` (zombies are already dead)."""
    found: list[Leftover] = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            name, state, pgrp, session = _stat_fields((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
        if state in ("Z", "X"):
            continue
        if pgid in (pgrp, session):
            found.append(Leftover(int(entry.name), name))
    return found
