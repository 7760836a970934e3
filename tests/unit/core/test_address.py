"""core/address: the one HOST:PORT reader (metrics listener, group link, doctor)."""

from __future__ import annotations

import pytest

from sglang_supervisor.core.address import AddressError, parse_address


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        ("[::1]:0", ("::1", 0)),  # port 0 picks a free port
        ("10.0.0.5:65535", ("10.0.0.5", 65535)),
        ("node-1.example:5000", ("node-1.example", 5000)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("9400", "is not HOST:PORT"),
        ("localhost", "is not HOST:PORT"),
        ("host:port", "is not HOST:PORT"),
        ("127.0.0.1:65536", "is not HOST:PORT"),  # the port range is checked
        ("127.0.0.1:-1", "is not HOST:PORT"),
        (":9400", "has no host"),
        ("[]:9400", "has no host"),
    ],
)
def test_parse_address_rejects_with_a_fix(address: str, problem: str) -> None:
    with pytest.raises(AddressError, match=problem) as info:
        parse_address(address)
    assert info.value.fix.startswith("write ")
