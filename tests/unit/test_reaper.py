"""reaper: as a container's PID 1 the supervisor reaps orphaned zombies of other sessions, never
a child some Popen waits for."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sglang_supervisor.shell.reaper import ProcEntry, Reaper, parse_stat, read_proc, zombies_to_reap


def test_parse_stat_handles_names_with_parens_and_spaces() -> None:
    e = parse_stat(42, "42 (sglang::sched (1)) Z 1 42 42 0 -1 4194560 0")
    assert e == ProcEntry(42, "Z", 1, 42, "sglang::sched (1)")
    assert parse_stat(1, "garbage") is None


def test_only_orphans_of_other_sessions_and_never_kept_pids() -> None:
    entries = [
        ProcEntry(10, "Z", 1, 10, "sglang::scheduler"),     # orphan of the engine's session
        ProcEntry(11, "Z", 1, 1, "python3"),                # our own child (subprocess.run waits)
        ProcEntry(12, "Z", 1, 12, "sglang-launcher"),       # the engine leader: Popen reaps it
        ProcEntry(13, "S", 1, 10, "sglang::detokenizer"),   # alive
        ProcEntry(14, "Z", 99, 10, "other"),                # someone else's child
    ]
    got = zombies_to_reap(entries, me=1, my_session=1, keep={12})
    assert [e.pid for e in got] == [10]


def test_a_real_orphan_zombie_of_another_session_is_reaped() -> None:
    # A child in its own session (like the engine's schedulers) exits and nobody waits for it.
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    pid = child.pid
    child.returncode = 0  # this Popen must not reap it (its __del__ would)
    deadline = time.monotonic() + 30
    while not any(e.pid == pid and e.state == "Z" for e in read_proc()):
        assert time.monotonic() < deadline, "the child never became a zombie"
        time.sleep(0.05)
    keep: set[int] = set()
    assert Reaper(False, lambda: keep).reap() == 0  # not PID 1: nothing happens
    assert any(e.pid == pid and e.state == "Z" for e in read_proc())
    assert Reaper(True, lambda: keep).reap() >= 1
    assert not any(e.pid == pid for e in read_proc())
    try:
        os.waitpid(pid, os.WNOHANG)
        raise AssertionError("the zombie was still ours to wait for")
    except ChildProcessError:
        pass


def test_a_kept_child_is_left_to_its_popen() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    deadline = time.monotonic() + 30
    while not any(e.pid == child.pid and e.state == "Z" for e in read_proc()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert Reaper(True, lambda: {child.pid}).reap() == 0
    assert child.wait(5) == 0  # Popen still gets the real exit status
