"""The group link's authentication (pure): HMAC-SHA256 over a canonical encoding, replay refused.

Every message on the multi-node link (a worker's report, the leader's view in answer to it, an
operator's `GET /group`) carries one header, `X-Group-Auth: v1 node=R ts=MS nonce=HEX mac=HEX`.
The MAC covers, one field a line: a version tag, the message's purpose (report, view, get), the
method and path, the sender's node rank, its wall-clock time in milliseconds, a random nonce, the
nonce of the request an answer belongs to, and the SHA-256 of the body. Every field has a fixed
alphabet (digits, hex, a closed set of words), so no two messages encode to the same bytes.

- A caller without the group's secret cannot make a MAC: forged, refused before the body is parsed.
- A message replayed within the window has a nonce already seen; one replayed later is outside the
  window (`MAX_SKEW_S` either side of the leader's clock: the nodes' clocks must agree that well,
  which NTP gives by orders of magnitude).
- A view is bound to the nonce of the report it answers: a worker takes no view that was not made
  for its own request, so an old view cannot be replayed to it and a report cannot pose as a view.
- The node rank is signed: a message of node 1 cannot be relabelled as node 2's. One shared secret
  authenticates membership of the group, not which member; per-node identity would need one key
  per node (or mTLS), which one operator-made file per group does not give.

The clock, the random nonce and the secret are the shell's; this module takes them as arguments.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

AUTH_HEADER = "x-group-auth"
VERSION = "v1"
_TAG = b"sglang-supervisor group link v1"
MAX_SKEW_S = 30.0  # a message's clock may differ from the leader's by this much either way
MAX_NONCES = 16384  # remembered nonces (63 workers x 2 reports/s x 60 s fit; more: refused)
MIN_SECRET_CHARS = 32  # `openssl rand -hex 32` gives 64; 32 hex characters are 128 bits
MAX_SECRET_CHARS = 1024
NONCE_HEX = 32  # 128 random bits
_HEADER = re.compile(r"^v1 node=(\d{1,2}) ts=(\d{1,16}) nonce=([0-9a-f]{32}) mac=([0-9a-f]{64})$")
_SECRET_TEXT = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII without spaces: survives any editor

Purpose = Literal["report", "view", "get"]


class RejectReason(str, Enum):
    """Why a message on the link was refused: the metric label and the log field."""

    UNAUTHENTICATED = "unauthenticated"  # no auth header, or not of the v1 shape
    FORGED = "forged"  # the MAC does not match: wrong secret, or a changed message
    STALE = "stale"  # a valid MAC, outside the time window (a late replay, or clocks apart)
    REPLAYED = "replayed"  # a valid MAC whose nonce was already taken
    WRONG_NODE = "wrong_node"  # the signed node rank is not the body's, or not a worker's
    OVERLOADED = "overloaded"  # the nonce memory is full of live entries (a flood of valid MACs)
    MALFORMED = "malformed"  # authenticated, but not a report (core/group.parse_report refused it)


class AuthError(ValueError):
    """A message the link refuses: its reason (a `RejectReason`) and a short text, no secret."""

    def __init__(self, reason: RejectReason, text: str) -> None:
        super().__init__(text)
        self.reason = reason


@dataclass(frozen=True)
class Stamp:
    """The authenticated fields of one message (what the header says, the MAC checked)."""

    node: int
    ts_ms: int
    nonce: str


def secret_problem(text: str) -> str | None:
    """What is wrong with the text of a group secret file (None: usable). Never quotes the text."""
    value = text.strip()
    if not value:
        return "is empty"
    if "\n" in value or "\r" in value:
        return "holds several lines (keep only the secret, on one line)"
    if not _SECRET_TEXT.match(value):
        return "holds spaces or characters other than printable ASCII"
    if len(value) < MIN_SECRET_CHARS:
        return f"holds {len(value)} characters; at least {MIN_SECRET_CHARS} are needed"
    if len(value) > MAX_SECRET_CHARS:
        return f"holds more than {MAX_SECRET_CHARS} characters"
    return None


def canonical(purpose: Purpose, *, method: str, path: str, stamp: Stamp, bound: str, body: bytes
              ) -> bytes:
    """The bytes the MAC covers. `bound`: the answered request's nonce, "-" for a request."""
    return b"\n".join([_TAG, purpose.encode(), method.encode("ascii"), path.encode("ascii"),
                       str(stamp.node).encode(), str(stamp.ts_ms).encode(), stamp.nonce.encode(),
                       bound.encode("ascii"), hashlib.sha256(body).hexdigest().encode()])


def _mac(secret: bytes, data: bytes) -> str:
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def sign(secret: bytes, purpose: Purpose, *, method: str, path: str, stamp: Stamp, body: bytes,
         bound: str = "-") -> str:
    """The header value for a message."""
    mac = _mac(secret, canonical(purpose, method=method, path=path, stamp=stamp, bound=bound, body=body))
    return f"{VERSION} node={stamp.node} ts={stamp.ts_ms} nonce={stamp.nonce} mac={mac}"


def verify(secret: bytes, header: str | None, purpose: Purpose, *, method: str, path: str, body: bytes,
           bound: str = "-") -> Stamp:
    """The message's stamp if its MAC is right; AuthError (unauthenticated, forged) otherwise.
    Freshness is the caller's (a `ReplayGuard`, or the nonce binding of an answer)."""
    if header is None:
        raise AuthError(RejectReason.UNAUTHENTICATED, "no X-Group-Auth header")
    m = _HEADER.match(header[:256])
    if m is None:
        raise AuthError(RejectReason.UNAUTHENTICATED, "X-Group-Auth is not of the v1 shape")
    stamp = Stamp(int(m.group(1)), int(m.group(2)), m.group(3))
    want = _mac(secret, canonical(purpose, method=method, path=path, stamp=stamp, bound=bound, body=body))
    if not hmac.compare_digest(want, m.group(4)):
        raise AuthError(RejectReason.FORGED, "the message's MAC does not match the group secret")
    return stamp


@dataclass
class ReplayGuard:
    """The leader's memory of the nonces it took within the window (mutable, no clock of its own)."""

    skew_s: float = MAX_SKEW_S
    capacity: int = MAX_NONCES
    _seen: OrderedDict[str, float] = field(default_factory=OrderedDict)  # nonce -> forget after

    def admit(self, stamp: Stamp, now_s: float) -> None:
        """Take a fresh message's nonce, or AuthError (stale, replayed, overloaded)."""
        ts = stamp.ts_ms / 1000.0
        if abs(ts - now_s) > self.skew_s:
            raise AuthError(RejectReason.STALE,
                            f"the message's clock is {ts - now_s:+.0f} s from the leader's "
                            f"(at most {self.skew_s:.0f} s either way: are the nodes' clocks synchronised?)")
        self._expire(now_s)
        if stamp.nonce in self._seen:
            raise AuthError(RejectReason.REPLAYED, "the message's nonce was already used")
        if len(self._seen) >= self.capacity:
            raise AuthError(RejectReason.OVERLOADED, "too many messages within the replay window")
        # Past ts + skew the window check refuses the message anyway: the nonce can be forgotten.
        # (Entries leave in insertion order: one whose sender's clock runs behind may stay a little
        # longer than needed, never less.)
        self._seen[stamp.nonce] = ts + self.skew_s

    def _expire(self, now_s: float) -> None:
        while self._seen:
            nonce, until = next(iter(self._seen.items()))
            if until >= now_s:
                break
            del self._seen[nonce]

    def __len__(self) -> int:
        return len(self._seen)


@dataclass
class LogGate:
    """One log line per `interval_s` for a kind of event, however many happen (a flood of forged
    packets must not flood the journal). `admit` says whether to log now and how many of the
    event were held back since the last line."""

    interval_s: float = 60.0
    _last: float | None = None
    _held: int = 0

    def admit(self, now_s: float) -> tuple[bool, int]:
        if self._last is None or now_s - self._last >= self.interval_s:
            held, self._held, self._last = self._held, 0, now_s
            return True, held
        self._held += 1
        return False, 0
