"""Engine process control with tiny shell scripts as fake engines."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.shell.engineproc.process import EngineProcess, group_members

pytestmark = pytest.mark.integration


def read_all(proc: EngineProcess, fd: int | None = None) -> bytes:
    chunks = []
    while data := os.read(proc.stdout_fd if fd is None else fd, 65536):
        chunks.append(data)
    return b"".join(chunks)


def test_spawn_own_session_two_pipes_no_notify_env() -> None:
    env = engine_env({"PATH": os.environ["PATH"], "NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1"},
                     {"FOO": "bar"})
    script = 'echo out; echo err >&2; echo "sid=$(ps -o sid= -p $$ | tr -d " ") ' \
             'pgid=$(ps -o pgid= -p $$ | tr -d " ")"; ' \
             'echo "notify=${NOTIFY_SOCKET:-unset} foo=$FOO"; read x || echo stdin-eof'
    proc = EngineProcess.spawn(["sh", "-c", script], env)
    out = read_all(proc).decode()
    err = read_all(proc, proc.stderr_fd).decode()
    assert asyncio.run(proc.wait()) == 0
    # Apart: SGLang's own log is on stderr, request records (user text) on stdout.
    assert out.startswith("out\n") and "err" not in out
    assert err == "err\n"
    assert f"sid={proc.pid} pgid={proc.pid}" in out
    assert "notify=unset foo=bar" in out
    assert "stdin-eof" in out


def test_stop_drains_on_sigterm() -> None:
    script = "trap 'echo draining; exit 0' TERM; echo up; while :; do sleep 0.05; done"
    proc = EngineProcess.spawn(["sh", "-c", script], dict(os.environ))
    assert os.read(proc.stdout_fd, 100).startswith(b"up")
    result = asyncio.run(proc.stop(drain_s=10, kill_s=5))
    assert result.terminated and result.drained
    assert result.leftover == ()
    assert group_members(proc.pgid) == []
    assert proc.we_stopped


def test_stop_kills_group_that_ignores_sigterm_including_grandchildren() -> None:
    script = "trap '' TERM; (trap '' TERM; sleep 300) & (sleep 300) & echo up; wait"
    proc = EngineProcess.spawn(["sh", "-c", script], dict(os.environ))
    assert os.read(proc.stdout_fd, 100).startswith(b"up")
    assert len(group_members(proc.pgid)) >= 3
    began = time.monotonic()
    result = asyncio.run(proc.stop(drain_s=0.3, kill_s=5))
    assert not result.drained and result.killed
    assert result.returncode == -signal.SIGKILL
    assert result.leftover == ()
    assert group_members(proc.pgid) == []
    assert time.monotonic() - began < 10


def test_engine_ignores_sighup() -> None:
    proc = EngineProcess.spawn(["sh", "-c", "echo up; sleep 300"], dict(os.environ))
    assert os.read(proc.stdout_fd, 100).startswith(b"up")
    os.killpg(proc.pgid, signal.SIGHUP)
    time.sleep(0.2)
    assert proc.returncode is None
    asyncio.run(proc.stop(drain_s=0.1, kill_s=5))


def test_sigkilled_supervisor_leaves_no_orphan(tmp_path: Path) -> None:
    """PDEATHSIG: SIGKILL the parent that spawned the engine; the engine must die with it."""
    pidfile = tmp_path / "engine.pid"
    parent = textwrap.dedent(f"""
        import os, sys, time
        from sglang_supervisor.shell.engineproc.process import EngineProcess
        p = EngineProcess.spawn(["sleep", "300"], dict(os.environ))
        open({str(pidfile)!r}, "w").write(str(p.pid))
        time.sleep(300)
    """)
    sup = subprocess.Popen([sys.executable, "-c", parent])
    try:
        deadline = time.monotonic() + 20
        while not (pidfile.exists() and pidfile.read_text()):
            assert time.monotonic() < deadline, "the parent never spawned the engine"
            time.sleep(0.05)
        engine = int(pidfile.read_text())
        assert group_members(engine)
        sup.kill()
        sup.wait()
        deadline = time.monotonic() + 10
        while group_members(engine):
            assert time.monotonic() < deadline, "engine survived its supervisor's SIGKILL"
            time.sleep(0.05)
    finally:
        sup.kill()
        sup.wait()


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
def test_wait_returns_the_exit_code_with_and_without_a_pidfd(monkeypatch: pytest.MonkeyPatch,
                                                              pidfd: bool) -> None:
    """wait() sleeps on the leader's pidfd (no wake-up until it exits) and falls back to polling
    where the kernel has none; the exit code is the same either way."""
    from sglang_supervisor.shell.engineproc import process

    opened: list[int] = []
    real = process._pidfd

    def spy(pid: int) -> int | None:
        fd = real(pid) if pidfd else None
        opened.append(-1 if fd is None else fd)
        return fd

    monkeypatch.setattr(process, "_pidfd", spy)
    proc = EngineProcess.spawn(["sleep", "30"], {"PATH": os.environ["PATH"]})

    async def main() -> int:
        waiting = asyncio.create_task(proc.wait())
        await asyncio.sleep(0.2)
        assert not waiting.done()  # still running
        os.kill(proc.pid, signal.SIGTERM)
        return await asyncio.wait_for(waiting, 10)

    assert asyncio.run(main()) == -signal.SIGTERM
    assert len(opened) == 1 and (opened[0] >= 0) == pidfd
    if pidfd:
        with pytest.raises(OSError):
            os.fstat(opened[0])  # closed after use
    os.close(proc.stdout_fd)
    os.close(proc.stderr_fd)
