"""linkauth.py: the group link's MACs, replay window and rate-limited logging (pure)."""

from __future__ import annotations

import pytest

from sglang_supervisor.core.linkauth import (
    MAX_SKEW_S,
    AuthError,
    LogGate,
    RejectReason,
    ReplayGuard,
    Stamp,
    canonical,
    secret_problem,
    sign,
    verify,
)

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER = b"fedcba9876543210fedcba9876543210"
NOW = 1_800_000_000.0
BODY = b'{"node_rank": 1, "state": "idle"}'


def stamp(node: int = 1, at: float = NOW, nonce: str = "a" * 32) -> Stamp:
    return Stamp(node, int(at * 1000), nonce)


def signed(st: Stamp, body: bytes = BODY, secret: bytes = SECRET, bound: str = "-") -> str:
    return sign(secret, "report", method="POST", path="/group/report", stamp=st, body=body, bound=bound)


def check(header: str | None, body: bytes = BODY, purpose: str = "report", bound: str = "-") -> Stamp:
    return verify(SECRET, header, purpose, method="POST", path="/group/report",  # type: ignore[arg-type]
                  body=body, bound=bound)


def test_a_signed_message_verifies_to_its_stamp() -> None:
    st = stamp()
    assert check(signed(st)) == st


@pytest.mark.parametrize(("case", "header", "body", "purpose", "bound", "reason"), [
    ("no header", None, BODY, "report", "-", RejectReason.UNAUTHENTICATED),
    ("garbage header", "Bearer x", BODY, "report", "-", RejectReason.UNAUTHENTICATED),
    ("another secret", signed(stamp(), secret=OTHER), BODY, "report", "-", RejectReason.FORGED),
    ("body changed", signed(stamp()), BODY.replace(b"idle", b"failed"), "report", "-", RejectReason.FORGED),
    ("node relabelled", signed(stamp()).replace("node=1", "node=2"), BODY, "report", "-",
     RejectReason.FORGED),
    ("time moved", signed(stamp()).replace(f"ts={int(NOW * 1000)}", f"ts={int(NOW * 1000) + 1}"), BODY,
     "report", "-", RejectReason.FORGED),
    ("a report posing as a view", signed(stamp()), BODY, "view", "-", RejectReason.FORGED),
    ("a view for another request", signed(stamp(), bound="b" * 32), BODY, "report", "c" * 32,
     RejectReason.FORGED),
    ("mac truncated", signed(stamp())[:-1], BODY, "report", "-", RejectReason.UNAUTHENTICATED),
])
def test_what_is_refused_and_why(case: str, header: str | None, body: bytes, purpose: str, bound: str,
                                 reason: RejectReason) -> None:
    with pytest.raises(AuthError) as err:
        check(header, body, purpose, bound)
    assert err.value.reason is reason, case
    assert SECRET.decode() not in str(err.value)


def test_the_canonical_encoding_separates_every_field() -> None:
    a = canonical("report", method="POST", path="/group/report", stamp=stamp(), bound="-", body=BODY)
    b = canonical("report", method="POST", path="/group/report", stamp=stamp(node=11), bound="-",
                  body=BODY)
    c = canonical("get", method="GET", path="/group", stamp=stamp(), bound="-", body=b"")
    assert len({a, b, c}) == 3
    assert a.count(b"\n") == 8  # nine fields, one a line; none of them may hold a newline


def test_replays_inside_the_window_and_stale_messages_are_refused() -> None:
    guard = ReplayGuard()
    guard.admit(stamp(), NOW)
    with pytest.raises(AuthError) as err:
        guard.admit(stamp(), NOW + 1)
    assert err.value.reason is RejectReason.REPLAYED
    with pytest.raises(AuthError) as err:  # the same message after the window: too old to take
        guard.admit(stamp(), NOW + MAX_SKEW_S + 1)
    assert err.value.reason is RejectReason.STALE
    with pytest.raises(AuthError) as err:  # from the future (a sender's clock far ahead)
        guard.admit(stamp(at=NOW + MAX_SKEW_S + 1, nonce="b" * 32), NOW)
    assert err.value.reason is RejectReason.STALE
    guard.admit(stamp(at=NOW + MAX_SKEW_S - 1, nonce="c" * 32), NOW)  # skew inside the bound: fine


def test_nonces_are_forgotten_only_once_the_window_refuses_them() -> None:
    guard = ReplayGuard()
    guard.admit(stamp(), NOW)
    guard.admit(stamp(nonce="b" * 32), NOW + MAX_SKEW_S)  # expiry runs; the first is still live
    with pytest.raises(AuthError) as err:
        guard.admit(stamp(), NOW + MAX_SKEW_S)
    assert err.value.reason is RejectReason.REPLAYED
    guard.admit(stamp(at=NOW + 3 * MAX_SKEW_S, nonce="d" * 32), NOW + 3 * MAX_SKEW_S)
    assert len(guard) == 1  # both older nonces expired: the memory stays bounded by the window


def test_a_full_nonce_memory_refuses_rather_than_forgets() -> None:
    guard = ReplayGuard(capacity=2)
    guard.admit(stamp(nonce="a" * 32), NOW)
    guard.admit(stamp(nonce="b" * 32), NOW)
    with pytest.raises(AuthError) as err:
        guard.admit(stamp(nonce="c" * 32), NOW)
    assert err.value.reason is RejectReason.OVERLOADED
    with pytest.raises(AuthError) as err:  # the first nonce was not evicted to make room
        guard.admit(stamp(nonce="a" * 32), NOW)
    assert err.value.reason is RejectReason.REPLAYED


def test_log_gate_lets_one_line_per_interval_and_counts_the_rest() -> None:
    gate = LogGate(60.0)
    assert gate.admit(0.0) == (True, 0)
    assert [gate.admit(t) for t in (1.0, 2.0, 59.0)] == [(False, 0)] * 3
    assert gate.admit(60.0) == (True, 3)
    assert gate.admit(61.0) == (False, 0)


@pytest.mark.parametrize(("text", "needle"), [
    ("", "empty"), ("short", "at least 32"), ("a" * 40 + "\nb" * 40, "several lines"),
    ("a" * 20 + " " + "b" * 20, "printable ASCII"), ("é" * 40, "printable ASCII"),
    ("a" * 2000, "more than"),
])
def test_secret_text_problems_never_quote_the_secret(text: str, needle: str) -> None:
    problem = secret_problem(text)
    assert problem is not None and needle in problem
    assert text.strip() == "" or text.strip()[:20] not in problem


def test_a_good_secret_has_no_problem() -> None:
    assert secret_problem("0f" * 32 + "\n") is None
