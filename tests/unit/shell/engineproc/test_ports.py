"""The engine port from the outside: bind check, local URL, who listens, whose child it is."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from sglang_supervisor.shell.engineproc import ports


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


def _fake_listener(proc: Path, pid: int, port: int, inode: str = "4242") -> None:
    """pid holds a socket listening on 127.0.0.1:port."""
    net = proc / "net"
    net.mkdir(exist_ok=True)
    header = "  sl  local_address rem_address st tx_queue rx_queue tr tm->when retrnsmt uid timeout inode\n"
    row = (f"   0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000"
           f"  1000  0 {inode}\n")
    (net / "tcp").write_text(header + row)
    (net / "tcp6").write_text(header)
    fd = proc / str(pid) / "fd"
    fd.mkdir()
    (fd / "7").symlink_to(f"socket:[{inode}]")


def _grouped(proc: Path, pid: int, ppid: int, pgrp: int, argv: list[str]) -> None:
    _fake_process(proc, pid, ppid, argv)
    (proc / str(pid) / "stat").write_text(f"{pid} (python3) S {ppid} {pgrp} {pgrp} 0 -1\n")


def test_server_processes_are_the_listeners_group_and_descendants(tmp_path: Path) -> None:
    _grouped(tmp_path, 20, 1, 20, ["python3", "-m", "sglang_supervisor", "run"])
    _grouped(tmp_path, 30, 20, 30, ["/opt/sglang/.venv/bin/python3", "-m", "sglang.launch_server",
                                    "--model-path", "m"])
    _grouped(tmp_path, 31, 30, 30, ["sglang::scheduler_TP0   "])  # setproctitle pads
    _grouped(tmp_path, 32, 30, 32, ["sglang::scheduler_TP1"])  # a group of its own: a descendant
    _grouped(tmp_path, 33, 32, 32, ["sglang::detokenizer"])
    _grouped(tmp_path, 40, 1, 40, ["python3", "train.py"])  # someone else's
    _fake_listener(tmp_path, 30, 30000)
    assert ports.server_processes(30000, tmp_path) == {
        30: "python3 -m sglang.launch_server",
        31: "sglang::scheduler_TP0",
        32: "sglang::scheduler_TP1",
        33: "sglang::detokenizer",
    }
    assert ports.server_processes(30001, tmp_path) == {}
