"""Zombie reaping for `sglang-supervisor run` as PID 1 of a container.

A container's PID 1 inherits every orphan. When SGLang's launcher dies (SIGKILL, a crash), its
schedulers and detokenizer are reparented to PID 1; if PID 1 never waits for them they stay as
zombies (`sglang::scheduler <defunct>`), holding PIDs and confusing every "is it gone" check.
Under systemd, systemd is PID 1 and reaps them; here the supervisor must.

The reaper waits only for zombies it may take: reparented orphans, i.e. processes of another
session than ours, and never a child some `Popen` is about to wait for (the engine's leader: its
exit status classifies the failure). So it is a targeted `waitpid(pid, WNOHANG)`, never
`waitpid(-1)`. Except at the end: once the supervisor has stopped the engine (no `Popen` waits
any more), `reap_all` takes every child, and waits a bounded time for those still dying (a
setsid'd grandchild killed as an escapee, one that exits after the launcher): the heartbeat is
gone by then, so without it they would stay `<defunct>` until the container ends.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from sglang_supervisor.shell.engineproc.process import proc_pids, read_stat

log = structlog.get_logger("sglang_supervisor")

REAP_POLL_S = 0.05  # how often reap_all looks again for children still dying


@dataclass(frozen=True)
class ProcEntry:
    pid: int
    state: str
    ppid: int
    session: int
    name: str


def parse_stat(pid: int, text: str) -> ProcEntry | None:
    """/proc/PID/stat -> ProcEntry; None when it does not parse (the name may hold ')')."""
    try:
        lpar, rpar = text.index("("), text.rindex(")")
        rest = text[rpar + 2:].split()
        return ProcEntry(pid, rest[0], int(rest[1]), int(rest[3]), text[lpar + 1:rpar])
    except (ValueError, IndexError):
        return None


def zombies_to_reap(entries: Iterable[ProcEntry], *, me: int, my_session: int,
                    keep: set[int]) -> list[ProcEntry]:
    """Our zombie children that are orphans of another session and not waited for elsewhere."""
    return [e for e in entries
            if e.state == "Z" and e.ppid == me and e.session != my_session and e.pid not in keep]


def read_proc(proc: Path = Path("/proc")) -> list[ProcEntry]:
    found: list[ProcEntry] = []
    for name in proc_pids(proc):  # every heartbeat as PID 1: the cheap reads of process.py
        try:
            text = read_stat(proc, name)
        except OSError:
            continue  # exited while we looked
        entry = parse_stat(int(name), text)
        if entry is not None:
            found.append(entry)
    return found


class Reaper:
    """Calls `reap()` from the supervisor's heartbeat; a no-op unless we are PID 1."""

    def __init__(self, active: bool, keep: Callable[[], set[int]],
                 read: Callable[[], list[ProcEntry]] = read_proc,
                 waitpid: Callable[[int, int], tuple[int, int]] = os.waitpid, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.active = active
        self._clock = clock
        self._sleep = sleep
        self._keep = keep
        self._read = read
        self._waitpid = waitpid
        self.reaped = 0

    @classmethod
    def for_this_process(cls, keep: Callable[[], set[int]]) -> Reaper:
        return cls(os.getpid() == 1, keep)

    def reap(self) -> int:
        if not self.active:
            return 0
        me = os.getpid()
        victims = zombies_to_reap(self._read(), me=me, my_session=os.getsid(0), keep=self._keep())
        count = 0
        for z in victims:
            with contextlib.suppress(ChildProcessError, OSError):
                pid, _ = self._waitpid(z.pid, os.WNOHANG)
                if pid == z.pid:
                    count += 1
        if count:
            self.reaped += count
            log.info("supervisor.reaped", zombies=count,
                     names=",".join(sorted({z.name for z in victims}))[:200])
        return count

    def reap_all(self, wait_s: float) -> int:
        """At the end of the supervisor's shutdown, as PID 1: reap every child, waiting up to
        `wait_s` for the ones still alive (dying after the launcher); those left after it are
        logged and left to the container's end. Call only when no `Popen` waits any more."""
        if not self.active:
            return 0
        me = os.getpid()
        deadline = self._clock() + wait_s
        count, names = 0, set()
        while True:
            kids = [e for e in self._read() if e.ppid == me]
            for z in (e for e in kids if e.state == "Z"):
                with contextlib.suppress(ChildProcessError, OSError):
                    pid, _ = self._waitpid(z.pid, os.WNOHANG)
                    if pid == z.pid:
                        count += 1
                        names.add(z.name)
            live = [e for e in kids if e.state not in ("Z", "X")]
            if not live or self._clock() >= deadline:
                break
            self._sleep(REAP_POLL_S)
        if count:
            self.reaped += count
            log.info("supervisor.reaped", zombies=count, names=",".join(sorted(names))[:200],
                     at="shutdown")
        if live:
            log.warning("supervisor.children_left",
                        processes=", ".join(f"{e.pid}:{e.name}" for e in live)[:500],
                        hint="still alive at exit; the container's end takes them")
        return count
