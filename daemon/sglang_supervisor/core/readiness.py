"""What counts as ready: the one gate between "the engine started" and READY=1.

Readiness is three facts together: every expected CUDA graph capture ended on every rank, SGLang
printed its ready line, and the supervisor's own first probe succeeded. "HTTP is up" is not ready:
a warmup request can still fail after the port is bound. The lifecycle keeps the facts (per
attempt); these functions decide, and tests/unit/core/test_decide_ready.py holds their table.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass
from enum import Enum

from sglang_supervisor.engine.argv import tp_size
from sglang_supervisor.engine.graphs import expected_captures, settled_by_prefill_off

# (owner, phase, rank): one capture that must end before READY. rank None = unprefixed lines (tp=1).
CaptureKey = tuple[str, str, str | None]


def capture_keys(argv: Sequence[str], version: str) -> frozenset[CaptureKey]:
    """Every capture a start of `argv` on `version` must log before READY, one key per rank
    (engine/graphs.expected_captures, flattened)."""
    return frozenset((cap.owner, cap.phase, rank)
                     for cap in expected_captures(argv, version, tp_size(argv)) for rank in cap.ranks)


class Gate(Enum):
    WAIT = "wait"  # not yet: no ready line, or the first probe already runs, or not starting
    PROBE = "probe"  # every capture ended and the ready line came: run the first probe
    MISSING = "missing"  # the ready line came without some expected captures: a failed start


@dataclass(frozen=True)
class GateVerdict:
    gate: Gate
    missing: tuple[CaptureKey, ...] = ()

    def missing_text(self) -> str:
        """`target prefill@TP1, draft decode@main` (main: the unprefixed process)."""
        return ", ".join(f"{o} {p}@{r or 'main'}" for o, p, r in self.missing)


def ready_gate(*, starting: bool, ready_line: bool, probing: bool,
               expected: Set[CaptureKey], ended: Set[CaptureKey]) -> GateVerdict:
    """Whether the first probe may run. Checked when the ready line arrives: a capture that
    has not ended by then never will (SGLang captures before it serves)."""
    if probing or not ready_line or not starting:
        return GateVerdict(Gate.WAIT)
    missing = tuple(sorted(expected - ended, key=str))
    if missing:
        return GateVerdict(Gate.MISSING, missing)
    return GateVerdict(Gate.PROBE)


class FirstProbe(Enum):
    NOT_IT = "not_it"  # not an answer to the ready probe (none runs, or the start is over)
    READY = "ready"  # the third fact: READY
    IGNORED = "ignored"  # it failed, but a stop is already under way and decides
    FAILED = "failed"  # it got an error: the start failed (warmup_failed)
    HUNG = "hung"  # it timed out: the engine is wedged


def first_probe(*, ok: bool, hung: bool, probing: bool, starting: bool,
                stopping: bool) -> FirstProbe:
    """What a probe result means for the ready gate. A success counts even while a stop is
    under way (the attempt did reach READY); a failure then is the stop's business."""
    if not (probing and starting):
        return FirstProbe.NOT_IT
    if ok:
        return FirstProbe.READY
    if stopping:
        return FirstProbe.IGNORED
    return FirstProbe.HUNG if hung else FirstProbe.FAILED


def without_prefill(expected: Set[CaptureKey], rank: str | None) -> set[CaptureKey]:
    """The captures still expected after the engine decided against prefill graphs (target and
    draft) on `rank`, or on every rank when the unprefixed main process said so."""
    return {k for k in expected if not settled_by_prefill_off(k[1], k[2], rank)}
