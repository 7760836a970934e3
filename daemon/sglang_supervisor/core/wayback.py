"""The way back from a fallback: which profile a start tries first, and how long a profile that
failed waits before it is tried again. Pure: remembered records in, a plan out.

The policy (docs/OPERATIONS.md, "The way back"):

1. The ladder is the configuration's order, best first.
2. A profile that failed is in back-off for `base * 2**(n - 1)` after its last failure, where n
   counts its failures in a row (a start that reaches READY clears the record), capped at
   `4 * restart.known_bad_ttl_s` (or `base` when that is larger):
   - base = `restart.known_bad_ttl_s` (a week) for failures the same command repeats on the same
     machine: a refused flag, graph capture, memory sizing, CUDA errors, a warmup that fails;
   - base = `restart.transient_retry_s` (an hour) for failures that may be transient: a hang, a
     wedge, NCCL or watchdog timeouts, a rank killed (often the host's OOM killer), a crashed
     child, the GPU or port held by someone else, anything unclassified.
   `known_bad_ttl_s: 0` remembers nothing.
3. A start tries first the best profile that is not in back-off. When that profile is above the
   last good one, the attempt is a *probation*: if it fails before READY the next attempt is the
   last good profile at once (not the ladder in between, not `remediation`), and its record's
   count grows, so the next probation waits twice as long. If it reaches READY it becomes the last
   good profile and its record is cleared. A profile that `tune` measured serving but slower
   than the last good one (the ranking's tail) gets no probation: the way back is for profiles
   that failed, and starting a slower one would undo tune's choice.
4. Otherwise the last good profile goes first, then the ladder in order, skipping profiles in
   back-off (when every profile is in back-off none is skipped: refusing to start helps nobody).

Bounded cost: one probation per supervisor start, one failed probation per profile and back-off
period; the back-off doubles up to its cap.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sglang_supervisor.core.events import FailureClass

# Failures the same command repeats on the same machine (another try only costs a start).
DETERMINISTIC = frozenset({
    FailureClass.UNKNOWN_FLAG, FailureClass.FLAG_REFUSED, FailureClass.CAPTURE_OOM,
    FailureClass.CAPTURE_FAILED,
    FailureClass.DRAFT_CAPTURE_FAILED, FailureClass.PREFILL_GRAPH_FAILED,
    FailureClass.KV_CACHE_OOM, FailureClass.CUDA_ERROR, FailureClass.WARMUP_FAILED,
    FailureClass.SCHEDULER_EXCEPTION, FailureClass.OUTPUT_MISMATCH,
})
TTL_CAP_FACTOR = 4.0
MAX_DOUBLINGS = 30  # 2**30: far past any cap; keeps the arithmetic finite for huge counts


class Record(Protocol):
    """What the state remembers about one profile's failures (state.BadRecord)."""

    @property
    def failure_class(self) -> str: ...
    @property
    def at(self) -> float: ...
    @property
    def count(self) -> int: ...


@dataclass(frozen=True)
class Policy:
    known_bad_ttl_s: float = 7 * 24 * 3600.0
    transient_retry_s: float = 3600.0


@dataclass(frozen=True)
class Plan:
    last_good: str | None
    probation: str | None  # tried first, above last_good; None: no way back to try now
    backoff: Mapping[str, str] = field(default_factory=dict)  # profile -> failure class, skipped
    retry_at: Mapping[str, float] = field(default_factory=dict)  # profile -> end of its back-off


def is_transient(failure_class: str) -> bool:
    """Unknown class names (a newer supervisor's) count as transient: the shorter wait."""
    try:
        return FailureClass(failure_class) not in DETERMINISTIC
    except ValueError:
        return True


def backoff_s(failure_class: str, count: int, policy: Policy) -> float:
    """How long a profile waits after its `count`-th failure in a row of `failure_class`."""
    if policy.known_bad_ttl_s <= 0:
        return 0.0
    base = policy.transient_retry_s if is_transient(failure_class) else policy.known_bad_ttl_s
    cap = max(base, TTL_CAP_FACTOR * policy.known_bad_ttl_s)
    doublings = min(max(count, 1) - 1, MAX_DOUBLINGS)
    return float(min(base * 2.0**doublings, cap))


def in_backoff(record: Record, now: float, policy: Policy) -> bool:
    # abs(): after the clock was stepped back, a record "from the future" must still expire.
    return abs(now - record.at) < backoff_s(record.failure_class, record.count, policy)


def plan(ladder: Sequence[str], last_good: str | None, bad: Mapping[str, Record], now: float,
         policy: Policy, *, measured_slower: Collection[str] = ()) -> Plan:
    """The start's plan for this ladder and these remembered failures (see the module's policy).
    `measured_slower`: profiles tune ranked below last_good (served, slower): never a probation."""
    waiting = {p: r for p, r in bad.items() if p in ladder and in_backoff(r, now, policy)}
    backoff = {p: r.failure_class for p, r in waiting.items()}
    retry_at = {p: r.at + backoff_s(r.failure_class, r.count, policy) for p, r in waiting.items()}
    if last_good not in ladder:
        last_good = None  # removed from the configuration since
    probation = None
    if last_good is not None:
        better = ladder[:ladder.index(last_good)]
        probation = next((p for p in better if p not in waiting and p not in measured_slower), None)
    return Plan(last_good, probation, backoff, retry_at)


def start_plan(ladder: Sequence[str], last_good: str | None, *, ranking: Sequence[str] | None,
               bad: Mapping[str, Record], now: float, policy: Policy) -> Plan:
    """What `run` starts with, from the remembered state: the last good profile, else `tune`'s
    winner (the ranking's head); the profiles tune ranked after it served slower, so they get no
    probation; the ones that failed in tune are in `bad` like any failed start."""
    ranked = list(ranking or ())
    if last_good is None and ranked:
        last_good = ranked[0]
    slower = ranked[ranked.index(last_good) + 1:] if last_good in ranked else []
    return plan(ladder, last_good, bad, now, policy, measured_slower=slower)
