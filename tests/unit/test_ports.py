"""The engine port from the outside: bind check, local URL, who listens, whose child it is."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from sglang_supervisor import ports


def test_bind_error_names_a_taken_port_and_not_a_free_one() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert ports.bind_error("127.0.0.1", port)
    assert ports.bind_error("127.0.0.1", port) is None


def test_local_base_url_turns_wildcards_into_loopback() -> None:
    assert ports.local_base_url("0.0.0.0", 30000) == "http://127.0.0.1:30000"
    assert ports.local_base_url("::", 30000) == "http://[::1]:30000"
    assert ports.local_base_url("10.0.0.5", 8) == "http://10.0.0.5:8"
    assert ports.local_base_url("fe80::1", 8) == "http://[fe80::1]:8"


def test_listener_pids_finds_this_process_listening() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        assert os.getpid() not in ports.listener_pids(port)  # bound, not listening yet
        held.listen()
        assert os.getpid() in ports.listener_pids(port)


def test_is_supervisor_run() -> None:
    assert ports.is_supervisor_run(["/usr/bin/python3", "-m", "sglang_supervisor", "run", "--config", "c"])
    assert ports.is_supervisor_run(["/opt/venv/bin/sglang-supervisor", "run"])
    assert not ports.is_supervisor_run(["/opt/venv/bin/sglang-supervisor", "doctor"])
    assert not ports.is_supervisor_run(["python", "-m", "sglang_supervisor.simulator", "run"])
    assert not ports.is_supervisor_run([])


def _fake_process(proc: Path, pid: int, ppid: int, argv: list[str]) -> None:
    d = proc / str(pid)
    d.mkdir()
    (d / "stat").write_text(f"{pid} (python3 (x)) S {ppid} {pid} {pid} 0 -1\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_supervisor_above_walks_the_ancestors(tmp_path: Path) -> None:
    _fake_process(tmp_path, 10, 1, ["/usr/lib/systemd/systemd"])
    _fake_process(tmp_path, 20, 10, ["python3", "-m", "sglang_supervisor", "run", "--config", "c"])
    _fake_process(tmp_path, 30, 20, ["python3", "-m", "sglang.launch_server"])
    _fake_process(tmp_path, 40, 30, ["python3", "-m", "sglang.launch_server"])  # a scheduler
    _fake_process(tmp_path, 50, 10, ["python3", "-m", "sglang.launch_server"])  # started by hand
    assert ports.supervisor_above(40, tmp_path) == 20
    assert ports.supervisor_above(30, tmp_path) == 20
    assert ports.supervisor_above(50, tmp_path) is None
    assert ports.supervisor_above(20, tmp_path) is None  # itself does not count
    assert ports.supervisor_above(99, tmp_path) is None  # gone
