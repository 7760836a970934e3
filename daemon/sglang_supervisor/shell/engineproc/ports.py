"""The engine's TCP port from the outside: can it be bound, who listens on it, how to reach it.

Shared by the supervisor's preflight (refuse to start an engine that could not bind) and
`doctor` (tell our own running engine from a foreign listener). Linux /proc only; anything
unreadable (another user's process without root) is simply not reported.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

PROC = Path("/proc")
_TCP_LISTEN = "0A"  # the `st` column of /proc/net/tcp for a listening socket


def bind_error(host: str, port: int) -> str | None:
    """Why a server could not bind host:port now (EADDRINUSE only), or None when it could."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # Like uvicorn: SO_REUSEADDR, so a previous engine's TIME_WAIT does not count as busy.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return exc.strerror or os.strerror(errno.EADDRINUSE)
    return None


def local_base_url(host: str, port: int) -> str:
    """The URL a client on this host uses for a server bound to host:port (wildcards -> loopback)."""
    host = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _TCP_LISTEN:
                continue
            _, _, hex_port = cols[1].rpartition(":")
            if int(hex_port, 16) == port:
                inodes.add(cols[9])
    return inodes


def listener_pids(port: int, proc: Path = PROC) -> set[int]:
    """Processes holding a socket that listens on `port` (those whose fds we may read)."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port, proc)}
    if not wanted:
        return set()
    pids: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    pids.add(int(entry.name))
                    break
            except OSError:
                continue
    return pids


def cmdline(pid: int, proc: Path = PROC) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _stat_ids(pid: int, proc: Path) -> tuple[int, int] | None:
    """(ppid, process group) of pid, or None when it is gone or unreadable."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the
    # last ')'.
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 3 or not (fields[1].isdigit() and fields[2].isdigit()):
        return None
    return int(fields[1]), int(fields[2])


def _ppid(pid: int, proc: Path) -> int | None:
    ids = _stat_ids(pid, proc)
    return ids[0] if ids is not None else None


def process_title(pid: int, proc: Path = PROC) -> str:
    """What a process calls itself: SGLang's workers retitle themselves (`sglang::scheduler_TP0`),
    a plain python shows its first arguments (`python3 -m sglang.launch_server`)."""
    argv = [a.strip() for a in cmdline(pid, proc) if a.strip()]
    if not argv:
        try:
            return (proc / str(pid) / "comm").read_text().strip() or "?"
        except OSError:
            return "?"
    return " ".join(" ".join([os.path.basename(argv[0]), *argv[1:3]]).split())[:80]


def server_processes(port: int, proc: Path = PROC) -> dict[int, str]:
    """pid -> title of every process of the server listening on `port`: the listeners, the other
    members of their process groups (an engine the supervisor started has its own session and
    group; one started from a shell, its job's group) and their descendants (a worker that moved
    to a group of its own). {} when nobody listens there or /proc does not tell."""
    listeners = listener_pids(port, proc)
    if not listeners:
        return {}
    table: dict[int, tuple[int, int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (ids := _stat_ids(int(entry.name), proc)) is not None:
            table[int(entry.name)] = ids
    groups = {table[p][1] for p in listeners if p in table}
    members = set(listeners) | {pid for pid, (_, pgrp) in table.items() if pgrp in groups}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in table.items() if ppid in members} - members
        members |= children
        grew = bool(children)
    return {pid: process_title(pid, proc) for pid in sorted(members)}


def is_supervisor_run(argv: list[str]) -> bool:
    """`sglang-supervisor run ...` or `python -m sglang_supervisor run ...`."""
    for i, arg in enumerate(argv[:-1]):
        if (arg == "sglang_supervisor" or os.path.basename(arg) == "sglang-supervisor") and (
                argv[i + 1] == "run"):
            return True
    return False


def supervisor_above(pid: int, proc: Path = PROC) -> int | None:
    """The pid of a `sglang-supervisor run` among pid's ancestors (not pid itself), or None."""
    seen: set[int] = set()
    current = _ppid(pid, proc)
    while current is not None and current > 1 and current not in seen:
        seen.add(current)
        if is_supervisor_run(cmdline(current, proc)):
            return current
        current = _ppid(current, proc)
    return None
