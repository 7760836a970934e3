"""Engine process control: spawn in its own session, stop the whole group, verify nothing is left.

The engine runs nohup-style: its own session and process group (no controlling terminal, SIGHUP
ignored), stdin from /dev/null, stdout and stderr into two pipes that `enginelog` drains (SGLang's
own log is on stderr, request records and access lines, which carry user text, on stdout: the
supervisor parses only stderr). It gets
PDEATHSIG=SIGKILL, so a supervisor killed with SIGKILL takes the engine's launcher with it (SGLang's
schedulers already follow their launcher the same way).

PDEATHSIG fires when the *thread* that forked exits, not the process: `spawn` must be called from
a thread that lives as long as the supervisor (the asyncio loop's thread), never from a pool.

Escapes: a descendant that calls setsid() leaves the engine's session and process group, so the
group kill misses it and it keeps its port or GPU memory. The unit gives the supervisor no cgroup
of its own (no `Delegate=`: systemd kills the unit's leftovers only when the supervisor exits), so
`EngineFamily` tracks the engine's descendants by /proc: their PPid chains from the leader, walked
at intervals, and the engine's tag in their environment. The supervisor is a child subreaper, so
an escapee whose parent died is re-parented to us (not to init) and its chain stays visible; such
adopted processes are ours to reap.

Long because: one engine's process family: spawn (own session, PDEATHSIG), stop of the whole group
and of the descendants that left it, and the /proc walk that finds them; they share the tag and the
pid bookkeeping that makes stopping complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05
PROC = Path("/proc")
# In every engine's environment (inherited by its descendants, setsid or not): names its family.
ENGINE_TAG_VAR = "SGLANG_SUPERVISOR_ENGINE_TAG"
ENVIRON_MAX_BYTES = 1 << 20


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
    escaped: tuple[Leftover, ...] = field(default_factory=tuple)  # outside the session, killed too


def _load_prctl() -> Callable[..., int] | None:
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no PDEATHSIG, the group kill still applies
        return None
    return fn


# Resolved once in the parent: dlopen/dlsym after fork in a threaded process could deadlock.
_PRCTL = _load_prctl()


@functools.cache
def become_subreaper() -> bool:
    """Make orphaned descendants our children instead of init's (once; False if refused)."""
    return _PRCTL is not None and _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _child_setup(parent_pid: int) -> None:
    """Runs in the child between fork and exec: keep it tiny."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may have died before prctl took effect: then nobody would ever kill us.
    if os.getppid() != parent_pid:
        os._exit(1)


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
    """One running engine. Output is read by the caller from `stderr_fd` and `stdout_fd`."""

    def __init__(self, popen: subprocess.Popen[bytes], tag: str | None = None) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.pgid = popen.pid  # start_new_session makes the leader its session and group leader
        self.we_stopped = False
        self.family = EngineFamily(popen.pid, tag)
        # The pump owns (and closes) the read ends. Popen's own file objects would close the same
        # fd numbers again when they are collected, by then maybe a later engine's pipes: keep a
        # dup (close-on-exec) of each and close Popen's now.
        self._stdout_fd = _take_fd(popen.stdout)
        self._stderr_fd = _take_fd(popen.stderr)

    @classmethod
    def spawn(cls, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None
              ) -> EngineProcess:
        parent = os.getpid()
        become_subreaper()
        tag = uuid.uuid4().hex
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**env, ENGINE_TAG_VAR: tag},
            cwd=cwd,
            start_new_session=True,
            # PDEATHSIG and SIGHUP-immunity can only be set in the child; the hook only makes a
            # pre-resolved libc call, so no lock another thread might hold is taken after fork.
            preexec_fn=lambda: _child_setup(parent),  # noqa: PLW1509
            close_fds=True,
        )
        return cls(popen, tag)

    @property
    def stdout_fd(self) -> int:
        """The engine's stdout: SGLang's request records, uvicorn's access lines (user text)."""
        assert self._stdout_fd >= 0
        return self._stdout_fd

    @property
    def stderr_fd(self) -> int:
        """The engine's stderr: SGLang's own log, tracebacks, argparse errors, progress bars."""
        assert self._stderr_fd >= 0
        return self._stderr_fd

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def exit_fd(self) -> int | None:
        """A new pidfd of the leader, readable once it exits (the caller closes it); None where
        the kernel has none or it was reaped already."""
        return None if self.popen.poll() is not None else _pidfd(self.pid)

    async def wait(self) -> int:
        """Wait for the leader to exit: on its pidfd where the kernel has them (Linux 5.3+: no
        wake-up until it exits), else polling; either way no SIGCHLD handler fights with asyncio's."""
        rc = self.popen.poll()
        if rc is not None:
            return rc
        fd = _pidfd(self.pid)
        if fd is not None:
            try:
                await _readable(fd)
            finally:
                os.close(fd)
        while True:  # the pidfd said it exited (poll reaps it now), or there was none
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
        # whether or not the leader drained, then wait until /proc shows none of them. Processes
        # that left the session (setsid) go with it: the whole family is the engine.
        escaped = await asyncio.to_thread(self.family.escapees, sweep=True)  # reads /proc
        if group_members(self.pgid) or self.popen.poll() is None or escaped:
            killed = True
            _killpg(self.pgid)
            _kill_each(escaped)
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
            escaped=tuple(Leftover(e.pid, e.name) for e in escaped),
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
            self.family.reap()  # and the adopted ones (we are their subreaper)
            members = group_members(self.pgid) + [
                Leftover(e.pid, e.name) for e in self.family.escapees()]
            if not members:
                # One that died since the reap above is a zombie now (not a member): ours to
                # collect before the next engine starts, not at some later scan.
                self.family.reap()
                return []
            if time.monotonic() >= deadline:
                return members
            # Something joined late or survived: kill it again (by group and by pid).
            _killpg(self.pgid)
            for m in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(m.pid, signal.SIGKILL)
            await asyncio.sleep(POLL_S)


def _take_fd(pipe: IO[bytes] | None) -> int:
    if pipe is None:
        return -1
    fd = os.dup(pipe.fileno())
    pipe.close()
    return fd


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_each(entries: Iterable[ProcEntry]) -> None:
    for e in entries:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(e.pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- the family

@dataclass(frozen=True)
class ProcEntry:
    """One line of /proc/PID/stat. (pid, start) names a process even after its pid is reused."""

    pid: int
    ppid: int
    pgrp: int
    session: int
    state: str
    name: str
    start: int  # clock ticks after boot


def _pidfd(pid: int) -> int | None:
    """A pidfd of our not yet reaped child `pid` (readable once it exits); None where the kernel or
    Python has none."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


async def _readable(fd: int) -> None:
    """Until `fd` is readable (returns at once where the loop cannot watch it)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    try:
        loop.add_reader(fd, wake)
    except (NotImplementedError, OSError, ValueError):
        return
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def parse_stat(pid: int, text: str) -> ProcEntry:
    """/proc/PID/stat; the name may hold spaces and parens. Raises ValueError/IndexError."""
    lpar, rpar = text.index("("), text.rindex(")")
    rest = text[rpar + 2:].split()
    return ProcEntry(pid=pid, ppid=int(rest[1]), pgrp=int(rest[2]), session=int(rest[3]),
                     state=rest[0], name=text[lpar + 1:rpar], start=int(rest[19]))


STAT_MAX_BYTES = 4096  # /proc/PID/stat is one line of a few hundred bytes (the name is at most 16)


def read_stat(proc: Path, pid: str) -> str:
    """/proc/PID/stat's text in three syscalls (open, read, close): a scan reads one per process
    on the host every few seconds, and Path.read_text's buffered file costs twice the syscalls and
    three times the time (issue 26). Raises OSError when the process is gone."""
    fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, STAT_MAX_BYTES).decode("utf-8", "replace")
    finally:
        os.close(fd)


def proc_pids(proc: Path = PROC) -> list[str]:
    """The pids /proc lists now, as its entry names (none when it cannot be read)."""
    try:
        return [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []


def proc_table(proc: Path = PROC) -> dict[int, ProcEntry]:
    """Every process /proc shows now (those that exit while we look are skipped)."""
    table: dict[int, ProcEntry] = {}
    for name in proc_pids(proc):
        with contextlib.suppress(OSError, ValueError, IndexError):
            table[int(name)] = parse_stat(int(name), read_stat(proc, name))
    return table


def has_tag(pid: int, tag: str, proc: Path = PROC) -> bool:
    """Whether pid's initial environment holds our engine tag (unreadable: no)."""
    try:
        with open(proc / str(pid) / "environ", "rb") as fh:
            data = fh.read(ENVIRON_MAX_BYTES)
    except OSError:
        return False
    return f"{ENGINE_TAG_VAR}={tag}".encode() in data.split(b"\0")


class EngineFamily:
    """Every process descended from one engine leader, also those that left its session.

    `scan()` walks /proc (called at intervals while the engine runs) and remembers each member by
    (pid, start time); a member is a descendant of the leader by PPid, a process remembered
    before (its parent may have died since), or a child adopted by us (the subreaper) that carries
    the engine's tag or session. Escapees are the live members outside the engine's session.
    """

    def __init__(self, leader: int, tag: str | None, *, me: int | None = None,
                 proc: Path = PROC) -> None:
        self.leader = leader
        self.session = leader  # the leader was spawned as its session's leader
        self.tag = tag
        self.me = os.getpid() if me is None else me
        self.proc = proc
        self.seen: dict[int, ProcEntry] = {}
        self._reported: set[tuple[int, int]] = set()

    def _adopted(self, e: ProcEntry) -> bool:
        if e.ppid != self.me or e.pid == self.leader:
            return False
        return e.session == self.session or (
            self.tag is not None and e.state not in ("Z", "X") and has_tag(e.pid, self.tag, self.proc))

    def members(self, table: Mapping[int, ProcEntry]) -> list[ProcEntry]:
        roots = {self.leader} | {p for p, old in self.seen.items()
                                 if p in table and table[p].start == old.start}
        roots |= {p for p, e in table.items() if p not in roots and self._adopted(e)}
        children: dict[int, list[int]] = {}
        for p, e in table.items():
            children.setdefault(e.ppid, []).append(p)
        found: set[int] = set()
        todo = [p for p in roots if p in table]
        while todo:
            p = todo.pop()
            if p in found or p == self.me:
                continue
            found.add(p)
            todo.extend(children.get(p, ()))
        out = [table[p] for p in sorted(found)]
        for e in out:
            old = self.seen.get(e.pid)
            if old is None or old.start != e.start:
                self.seen[e.pid] = e
        return out

    def _outside(self, members: Iterable[ProcEntry]) -> list[ProcEntry]:
        return [e for e in members if e.session != self.session and e.state not in ("Z", "X")]

    def scan(self) -> list[ProcEntry]:
        """Walk /proc, reap adopted zombies; the escapees not reported before."""
        table = proc_table(self.proc)
        self._reap(table)
        new = [e for e in self._outside(self.members(table))
               if (e.pid, e.start) not in self._reported]
        self._reported |= {(e.pid, e.start) for e in new}
        return new

    def escapees(self, *, sweep: bool = False) -> list[ProcEntry]:
        """Live members outside the engine's session: the group kill misses them. `sweep` also
        looks for the engine's tag in every other process (one that was re-parented to init
        before a scan saw it, where we could not become the subreaper)."""
        table = proc_table(self.proc)
        found = self._outside(self.members(table))
        if sweep and self.tag is not None:
            known = {e.pid for e in found} | set(self.seen) | {self.me}
            for p, e in table.items():
                if p not in known and e.state not in ("Z", "X") and has_tag(p, self.tag, self.proc):
                    self.seen[p] = e
                    found.append(e)
        return found

    def reap(self) -> None:
        self._reap(proc_table(self.proc))

    def _reap(self, table: Mapping[int, ProcEntry]) -> None:
        """Collect our adopted zombies of this family (never the leader: Popen reaps it)."""
        for p, e in table.items():
            if e.state != "Z" or e.ppid != self.me or p == self.leader:
                continue
            old = self.seen.get(p)
            if e.session == self.session or (old is not None and old.start == e.start):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(p, os.WNOHANG)


def _stat_fields(text: str) -> tuple[str, str, int, int]:
    """(name, state, pgrp, session) from /proc/PID/stat; the name may hold spaces and parens."""
    lpar, rpar = text.index("("), text.rindex(")")
    name = text[lpar + 1:rpar]
    rest = text[rpar + 2:].split()
    return name, rest[0], int(rest[2]), int(rest[3])


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[Leftover]:
    """Live processes whose process group or session is `pgid` (zombies are already dead)."""
    found: list[Leftover] = []
    for pid in proc_pids(proc):
        try:
            name, state, pgrp, session = _stat_fields(read_stat(proc, pid))
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
        if state in ("Z", "X"):
            continue
        if pgid in (pgrp, session):
            found.append(Leftover(int(pid), name))
    return found
