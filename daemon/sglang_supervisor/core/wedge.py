"""The wedge verdict: is a serving engine stuck, busy, or fine? Pure, table-tested.

Two kinds of evidence say an engine may be stuck: `/health` checks that fail (no answer in
time, 503, a garbage answer) and probes whose `/generate` never completes. Neither is proof on
its own:

- Busy is not wedged. SGLang's `/health` runs a one-token generation that queues behind the
  running batch; under load it can time out while the engine serves (SGLang issue #22511). So a
  failure counts toward a wedge only when the engine showed no decode progress (no `Decode batch`
  log line, no growth of its `/metrics` token or decode-pass counters) since the previous check.
- Alive is not serving. A `/health` that answers 200 while every `/generate` hangs (a stuck
  detokenizer, a scheduler that answers health but never decodes) would be hidden if each good
  health check cleared the count. Hung probes therefore have their own count that only a
  completed generation or decode progress clears.

Either count reaching the limit is a wedge: the supervisor restarts the engine through the same
path as before (`wedged`: the same profile first, then the ladder), never a heavier verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class Check(str, Enum):
    HEALTH_OK = "health_ok"
    HEALTH_FAILED = "health_failed"
    PROBE_OK = "probe_ok"  # a generation completed
    PROBE_HUNG = "probe_hung"  # a generation did not complete within its deadline


class Verdict(str, Enum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"  # failures without progress, below the limit
    BUSY = "busy"  # a failure while the engine made decode progress: not counted
    WEDGED = "wedged"  # health failures without progress reached the limit
    NOT_SERVING = "not_serving"  # probes hung without progress reached the limit


@dataclass(frozen=True, slots=True)
class Tally:
    misses: int = 0  # failed checks in a row (health failures and hung probes) without progress
    hung_probes: int = 0  # hung probes in a row without progress; a good /health does not clear it


def judge(tally: Tally, check: Check, *, progress: bool, limit: int) -> tuple[Verdict, Tally]:
    """One check result → the verdict and the new tally.

    `progress`: the engine showed decode steps since the previous check (log or /metrics).
    `limit`: `timeouts.health_failures`, for both counts."""
    limit = max(1, limit)
    if check is Check.PROBE_OK:
        return Verdict.HEALTHY, Tally()
    if check is Check.HEALTH_OK:
        # Health answering proves the HTTP server and (on most versions) one token; it does not
        # prove that generations complete, so hung probes stay counted.
        return Verdict.HEALTHY, replace(tally, misses=0)
    if progress:
        # Decoding moved since the last check: whatever timed out waited behind real work.
        return Verdict.BUSY, Tally()
    misses = tally.misses + 1
    hung = tally.hung_probes + (1 if check is Check.PROBE_HUNG else 0)
    new = Tally(misses, hung)
    if hung >= limit:
        return Verdict.NOT_SERVING, new
    if misses >= limit:
        return Verdict.WEDGED, new
    return Verdict.DEGRADED, new


def counters_grew(before: tuple[float | None, ...] | None, after: tuple[float | None, ...] | None) -> bool:
    """Did any decode counter of the engine's /metrics (generated tokens, decode passes) grow
    between two scrapes? Unknown (a missing scrape or counter) is no evidence of progress; a
    counter that went down (an engine restart) is not progress either."""
    if before is None or after is None:
        return False
    return any(a is not None and b is not None and a > b for b, a in zip(before, after, strict=False))
