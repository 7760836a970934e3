"""The one reader of a `HOST:PORT` address (metrics listener, group link, doctor's port checks)."""

from __future__ import annotations


class AddressError(ValueError):
    """What is wrong with an address, with the fix kept apart so that a report can print both."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} ({fix})")


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` -> (host, port), port 0..65535 (0 picks a free port).
    AddressError names the expected shape."""
    host, sep, port_s = address.rpartition(":")
    if not sep or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise AddressError(f"{address!r} is not HOST:PORT",
                           "write e.g. 127.0.0.1:9400 (port 0 picks a free port)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise AddressError(f"{address!r} has no host",
                           f"write 127.0.0.1:{port_s} (or 0.0.0.0:{port_s} to listen on every address)")
    return host, int(port_s)
