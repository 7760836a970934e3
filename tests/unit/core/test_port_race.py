"""A port lost to a race is recognised in every form SGLang, uvicorn and torch print it."""

from __future__ import annotations

import pytest

from sglang_supervisor.core.events import EngineFailed, FailureClass
from sglang_supervisor.core.logwatch import parse_lines

# What the engine prints when its port was taken after the supervisor's preflight, per source.
PORT_RACE_LOGS: dict[str, list[str]] = {
    # uvicorn < 0.30 (the OS text as Python gives it)
    "uvicorn-capitalised": [
        "[2026-05-01 12:00:00] ERROR:    [Errno 98] error while attempting to bind on address "
        "('0.0.0.0', 30000): Address already in use"],
    # uvicorn >= 0.30 lower-cases the strerror; as SGLang's log config prints it, and bare
    "uvicorn-lowercase": [
        "[2026-05-01 12:00:00] ERROR:    [Errno 98] error while attempting to bind on address "
        "('127.0.0.1', 30000): address already in use"],
    "uvicorn-lowercase-bare": [
        "ERROR:    [Errno 98] error while attempting to bind on address ('::', 30000): "
        "address already in use"],
    # an OSError out of a bind in a traceback (ZMQ, a raw socket)
    "oserror-traceback": [
        "Traceback (most recent call last):",
        '  File "/opt/sglang/lib/python3.12/site-packages/sglang/srt/entrypoints/http_server.py", '
        "line 1500, in launch_server",
        "OSError: [Errno 98] Address already in use"],
    "zmq": [
        "[2026-05-01 12:00:00] Traceback (most recent call last):",
        '  File "zmq/sugar/socket.py", line 311, in bind',
        "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:30001')"],
    # torch.distributed's TCPStore on the dist-init port
    "torch-tcpstore": [
        "[W501 12:00:00.000000000 socket.cpp:755] [c10d] The server socket has failed to listen on "
        "any local network address. port: 5000, useIPv6: 0, code: -98, name: EADDRINUSE, message: "
        "address already in use"],
    # SGLang 0.5.x PortArgs precheck of its derived ports (server_args.py)
    "sglang-port-precheck": [
        "[2026-05-01 12:00:00] Port is already in use. dist_init_port=5000 port_base=5001 "
        "detokenizer_port=5002 nccl_port=5003 scheduler_input_port=5005",
        "Traceback (most recent call last):",
        '  File "/opt/sglang/sglang/srt/server_args.py", line 5200, in init_new',
        '    wait_port_available(port_base, "port_base")',
        "ValueError: port_base at 5001 is not available in 30 seconds. port_base at 5001 is not "
        "available"],
    "sglang-port-valueerror-only": [
        "Traceback (most recent call last):",
        '  File "/opt/sglang/sglang/srt/utils/network.py", line 90, in wait_port_available',
        "ValueError: nccl_port at 5003 is not available in 30 seconds. nccl_port is used by a "
        "process already. process.name()='python3'' process.cmdline()=['python3'] "
        "process.status()='sleeping' pid=4242"],
}


def failures(lines: list[str]) -> list[EngineFailed]:
    return [e for e in parse_lines(lines) if isinstance(e, EngineFailed)]


@pytest.mark.parametrize("source", sorted(PORT_RACE_LOGS))
def test_every_form_of_a_lost_port_is_port_in_use(source: str) -> None:
    found = failures(PORT_RACE_LOGS[source])
    assert found, f"{source}: no failure recognised"
    assert found[0].failure is FailureClass.PORT_IN_USE, f"{source}: {found[0]}"


@pytest.mark.parametrize("line", [
    # SGLang's progress while its precheck waits: the port may still come free
    "[2026-05-01 12:00:00] port 5001 is in use. Waiting for 11 seconds for port_base to be "
    "available. port_base is used by a process already. process.name()='python3'",
    "[2026-05-01 12:00:00] The port 5001 is in use, but we could not find the process that uses it.",
    "[2026-05-01 12:00:00] FlashInfer is not available in this build; using triton",
    "[2026-05-01 12:00:00] server_port=30000 port_base=30001",
])
def test_lines_about_ports_that_are_not_failures(line: str) -> None:
    assert failures([line]) == []
