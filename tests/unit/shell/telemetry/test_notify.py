"""sd_notify adapter against a real AF_UNIX datagram socket (path and abstract namespace)."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from sglang_supervisor.core.childenv import clean_child_env
from sglang_supervisor.shell.telemetry.notify import Notifier


class Listener:
    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address  # as NOTIFY_SOCKET spells it

    def recv(self) -> str:
        return self.sock.recv(65536).decode("utf-8")

    def fields(self) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.recv().split("\n"))


@pytest.fixture
def path_listener(tmp_path: Path) -> Iterator[Listener]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    sock.settimeout(5)
    yield Listener(sock, str(path))
    sock.close()


@pytest.fixture
def abstract_listener() -> Iterator[Listener]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"sglang-supervisor-test-{uuid.uuid4().hex}"
    sock.bind("\0" + name)
    sock.settimeout(5)
    yield Listener(sock, "@" + name)
    sock.close()


def test_every_message_reaches_a_path_socket(path_listener: Listener) -> None:
    n = Notifier({"NOTIFY_SOCKET": path_listener.address})
    assert n.enabled
    assert n.ready("serving profile=primary")
    assert path_listener.fields() == {"READY": "1", "STATUS": "serving profile=primary"}
    assert n.status("capturing_graphs profile=primary")
    assert path_listener.recv() == "STATUS=capturing_graphs profile=primary"
    assert n.watchdog()
    assert path_listener.recv() == "WATCHDOG=1"
    assert n.extend_timeout(90)
    assert path_listener.recv() == "EXTEND_TIMEOUT_USEC=90000000"
    assert n.stopping()
    assert path_listener.recv() == "STOPPING=1"
    assert n.mainpid(4242)
    assert path_listener.recv() == "MAINPID=4242"
    assert n.errno(5)
    assert path_listener.recv() == "ERRNO=5"


def test_abstract_namespace_socket(abstract_listener: Listener) -> None:
    n = Notifier({"NOTIFY_SOCKET": abstract_listener.address})
    assert n.ready()
    assert abstract_listener.recv() == "READY=1"


def test_reloading_carries_a_current_monotonic_timestamp(path_listener: Listener) -> None:
    n = Notifier({"NOTIFY_SOCKET": path_listener.address})
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert n.reloading("reloading configuration")
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    fields = path_listener.fields()
    assert fields["RELOADING"] == "1"
    assert before <= int(fields["MONOTONIC_USEC"]) <= after
    assert fields["STATUS"] == "reloading configuration"


def test_status_cannot_inject_other_assignments(path_listener: Listener) -> None:
    n = Notifier({"NOTIFY_SOCKET": path_listener.address})
    n.status("phase one\nREADY=1\rtail")
    message = path_listener.recv()
    assert "\n" not in message
    assert message.startswith("STATUS=phase one READY=1")


def test_status_is_sent_as_utf8(path_listener: Listener) -> None:
    n = Notifier({"NOTIFY_SOCKET": path_listener.address})
    n.status("serving · 1234 tok/s → ok")
    assert path_listener.recv() == "STATUS=serving · 1234 tok/s → ok"


def test_without_notify_socket_everything_is_a_no_op() -> None:
    n = Notifier({})
    assert not n.enabled
    assert not n.ready("x")
    assert not n.watchdog()
    assert n.watchdog_interval() is None


def test_a_missing_socket_is_logged_once_and_never_raises(tmp_path: Path) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    with structlog.testing.capture_logs() as logs:
        assert not n.ready()
        assert not n.status("still nobody listening")
        assert not n.watchdog()
    failures = [e for e in logs if e["event"] == "notify.failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "warning"
    assert "gone.sock" in failures[0]["socket"]


def test_reconnects_after_the_socket_is_recreated(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    first = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    first.bind(str(path))
    n = Notifier({"NOTIFY_SOCKET": str(path)})
    assert n.ready()
    first.close()
    path.unlink()  # systemd re-executed: its socket is a new one at the same path
    with structlog.testing.capture_logs() as logs:
        assert not n.watchdog()
        second = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        second.bind(str(path))
        second.settimeout(5)
        try:
            assert n.watchdog()
            assert second.recv(100) == b"WATCHDOG=1"
        finally:
            second.close()
    assert [e["event"] for e in logs] == ["notify.failed", "notify.recovered"]


def test_watchdog_interval_is_half_the_period_for_this_process() -> None:
    n = Notifier({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid())})
    assert n.watchdog_usec == 20_000_000
    assert n.watchdog_interval() == 10.0
    assert Notifier({"WATCHDOG_USEC": "3000000"}).watchdog_interval() == 1.5


@pytest.mark.parametrize(
    "env",
    [
        {"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"},  # meant for another process
        {"WATCHDOG_USEC": "0"},
        {"WATCHDOG_USEC": "soon"},
        {"WATCHDOG_PID": "1"},
    ],
)
def test_watchdog_interval_absent(env: dict[str, str]) -> None:
    assert Notifier(env).watchdog_interval() is None


def test_clean_child_env_drops_systemd_handoff_variables() -> None:
    env = {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "WATCHDOG_USEC": "1",
        "WATCHDOG_PID": "1",
        "LISTEN_FDS": "1",
        "LISTEN_PID": "1",
        "LISTEN_FDNAMES": "x",
        "JOURNAL_STREAM": "8:123",
    }
    assert clean_child_env(env) == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert "NOTIFY_SOCKET" in env  # the input is not modified


def test_injected_environment_does_not_leak_into_os_environ(
    path_listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    n = Notifier({"NOTIFY_SOCKET": path_listener.address})
    assert n.ready()
    assert "NOTIFY_SOCKET" not in os.environ
    assert path_listener.recv() == "READY=1"
