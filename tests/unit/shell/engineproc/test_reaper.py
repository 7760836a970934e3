"""reaper: as a container's PID 1 the supervisor reaps orphaned zombies of other sessions, never
a child some Popen waits for."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sglang_supervisor.shell.engineproc.reaper import (
    ProcEntry,
    Reaper,
    parse_stat,
    read_proc,
    zombies_to_reap,
)


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


def test_reap_all_takes_every_child_and_waits_for_the_ones_still_dying() -> None:
    # At the end of the shutdown (PID 1): any session, and it waits for a child that dies later.
    me = os.getpid()
    reads = iter([
        [ProcEntry(10, "Z", me, 1, "sglang::scheduler"), ProcEntry(11, "S", me, 11, "sglang::linger"),
         ProcEntry(12, "Z", 99, 10, "not ours")],
        [ProcEntry(11, "Z", me, 11, "sglang::linger")],
    ])
    waited: list[int] = []
    sleeps: list[float] = []
    r = Reaper(True, set, read=lambda: next(reads), waitpid=lambda p, _f: (waited.append(p), (p, 0))[1],
               clock=lambda: 0.0, sleep=sleeps.append)
    assert r.reap_all(5.0) == 2
    assert waited == [10, 11]
    assert len(sleeps) == 1


def test_reap_all_gives_up_at_its_bound_and_is_a_no_op_unless_pid1() -> None:
    me = os.getpid()
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    stuck = [ProcEntry(11, "D", me, 11, "sglang::scheduler")]  # never dies (the driver holds it)
    r = Reaper(True, set, read=lambda: stuck, waitpid=lambda p, _f: (p, 0),
               clock=lambda: now[0], sleep=sleep)
    assert r.reap_all(1.0) == 0
    assert 1.0 <= now[0] < 1.2
    assert Reaper(False, set, read=lambda: stuck).reap_all(1.0) == 0
