"""EngineFamily finds an engine's processes by PPid chain, memory and tag, on a fake /proc."""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.shell.engineproc.process import ENGINE_TAG_VAR, EngineFamily, parse_stat

ME = 10  # the supervisor
LEADER = 100  # the engine: its own session and group
TAG = "0123abcd"


def put(proc: Path, pid: int, ppid: int, session: int, name: str = "python3", state: str = "S",
        start: int = 1000, tag: str | None = None) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    rest = [state, str(ppid), str(session), str(session)] + ["0"] * 15 + [str(start)] + ["0"] * 30
    (d / "stat").write_text(f"{pid} ({name}) " + " ".join(rest) + "\n")
    env = [b"PATH=/usr/bin"] + ([f"{ENGINE_TAG_VAR}={tag}".encode()] if tag else [])
    (d / "environ").write_bytes(b"\0".join(env) + b"\0")


def drop(proc: Path, pid: int) -> None:
    for f in (proc / str(pid)).iterdir():
        f.unlink()
    (proc / str(pid)).rmdir()


def family(proc: Path) -> EngineFamily:
    return EngineFamily(LEADER, TAG, me=ME, proc=proc)


def test_stat_with_spaces_and_parens_in_the_name() -> None:
    e = parse_stat(7, "7 (sglang::sched (TP0)) S 1 7 7 0 -1 " + " ".join(["0"] * 13) + " 4242 0 0")
    assert (e.name, e.ppid, e.session, e.start) == ("sglang::sched (TP0)", 1, 7, 4242)


def test_a_descendant_that_calls_setsid_is_an_escapee_reported_once(tmp_path: Path) -> None:
    put(tmp_path, ME, 1, ME)
    put(tmp_path, LEADER, ME, LEADER, tag=TAG)
    put(tmp_path, 101, LEADER, LEADER, name="sglang::scheduler", tag=TAG)
    put(tmp_path, 102, 101, 102, name="runaway", tag=TAG)  # setsid: session of its own
    put(tmp_path, 50, ME, ME, name="helper")  # the supervisor's own child: not the engine's
    put(tmp_path, 60, 1, 60, name="stranger", tag="other-engine")
    fam = family(tmp_path)
    assert [(e.pid, e.name) for e in fam.scan()] == [(102, "runaway")]
    assert fam.scan() == []  # reported once
    assert [e.pid for e in fam.escapees()] == [102]


def test_an_orphaned_escapee_is_found_through_memory_adoption_or_tag(tmp_path: Path) -> None:
    put(tmp_path, ME, 1, ME)
    put(tmp_path, LEADER, ME, LEADER, tag=TAG)
    put(tmp_path, 101, LEADER, LEADER, tag=TAG)
    put(tmp_path, 102, 101, 102, name="seen-before", tag=TAG)
    fam = family(tmp_path)
    fam.scan()
    drop(tmp_path, 101)  # its parent died: re-parented to init (no subreaper) ...
    put(tmp_path, 102, 1, 102, name="seen-before", tag=TAG)
    put(tmp_path, 103, ME, 103, name="adopted", tag=TAG)  # ... or to us, never seen before
    put(tmp_path, 104, ME, 104, name="our-router")  # adopted-looking, but not the engine's
    put(tmp_path, 105, 1, 105, name="unseen", tag=TAG)  # only the tag tells
    fam_pids = {e.pid for e in fam.escapees()}
    assert fam_pids == {102, 103}
    assert {e.pid for e in fam.escapees(sweep=True)} == {102, 103, 105}


def test_a_reused_pid_is_not_the_process_we_saw(tmp_path: Path) -> None:
    put(tmp_path, ME, 1, ME)
    put(tmp_path, LEADER, ME, LEADER, tag=TAG)
    put(tmp_path, 102, LEADER, 102, tag=TAG)
    fam = family(tmp_path)
    fam.scan()
    drop(tmp_path, LEADER)
    put(tmp_path, 102, 1, 102, name="someone-else", start=9999)  # same pid, another process
    assert fam.escapees() == []


def test_zombies_are_not_escapees(tmp_path: Path) -> None:
    put(tmp_path, ME, 1, ME)
    put(tmp_path, LEADER, ME, LEADER, tag=TAG)
    put(tmp_path, 102, LEADER, 102, state="Z")
    assert family(tmp_path).escapees() == []
