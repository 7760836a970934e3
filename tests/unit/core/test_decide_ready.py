"""What counts as ready: `readiness.ready_gate`, `readiness.first_probe`, `readiness.without_prefill`.

READY=1 needs three facts: every expected CUDA graph capture ended on every rank, SGLang's ready
line, and the supervisor's own first probe. The captures are real ones: a tp=2 target with
prefill and decode graphs, an EAGLE/MTP draft on tp=1, and the unprefixed (tp=1) main process.
"""

from __future__ import annotations

import pytest

from sglang_supervisor.core.readiness import (
    CaptureKey,
    FirstProbe,
    Gate,
    GateVerdict,
    first_probe,
    ready_gate,
    without_prefill,
)

TP2: frozenset[CaptureKey] = frozenset({
    ("target", "prefill", "TP0"), ("target", "prefill", "TP1"),
    ("target", "decode", "TP0"), ("target", "decode", "TP1")})
SPEC_TP1: frozenset[CaptureKey] = frozenset({
    ("target", "decode", None), ("target", "prefill", None),
    ("draft", "decode", None), ("draft", "extend", None)})
NONE: frozenset[CaptureKey] = frozenset()  # --disable-cuda-graph: nothing to wait for

GATE_ROWS = [
    # (case, starting, ready_line, probing, expected, ended, verdict)
    ("every capture ended and the ready line came: probe",
     True, True, False, TP2, TP2, GateVerdict(Gate.PROBE)),
    ("no CUDA graphs at all: the ready line is enough to probe",
     True, True, False, NONE, NONE, GateVerdict(Gate.PROBE)),
    ("captures ended but no ready line yet: wait",
     True, False, False, TP2, TP2, GateVerdict(Gate.WAIT)),
    ("the probe already runs: a second ready line changes nothing",
     True, True, True, TP2, TP2, GateVerdict(Gate.WAIT)),
    ("not starting (serving, stopping): a ready line in the log is not a start",
     False, True, False, TP2, TP2, GateVerdict(Gate.WAIT)),
    ("the ready line without rank 1's prefill graph: the start failed",
     True, True, False, TP2, TP2 - {("target", "prefill", "TP1")},
     GateVerdict(Gate.MISSING, (("target", "prefill", "TP1"),))),
    ("the draft's graphs missing on tp=1: named as @main, sorted",
     True, True, False, SPEC_TP1, {("target", "decode", None), ("target", "prefill", None)},
     GateVerdict(Gate.MISSING, (("draft", "decode", None), ("draft", "extend", None)))),
    ("captures the engine did not announce do not count against it",
     True, True, False, NONE, TP2, GateVerdict(Gate.PROBE)),
]


@pytest.mark.parametrize(("case", "starting", "ready_line", "probing", "expected", "ended", "verdict"),
                         GATE_ROWS, ids=[r[0] for r in GATE_ROWS])
def test_ready_gate(case: str, starting: bool, ready_line: bool, probing: bool,
                    expected: frozenset[CaptureKey], ended: frozenset[CaptureKey],
                    verdict: GateVerdict) -> None:
    assert ready_gate(starting=starting, ready_line=ready_line, probing=probing,
                      expected=expected, ended=ended) == verdict


def test_missing_captures_are_named_for_the_log() -> None:
    v = ready_gate(starting=True, ready_line=True, probing=False, expected=SPEC_TP1,
                   ended={("target", "decode", None)})
    assert v.missing_text() == "draft decode@main, draft extend@main, target prefill@main"


PROBE_ROWS = [
    # (case, ok, hung, probing, starting, stopping, verdict)
    ("the first probe succeeded while starting: READY", True, False, True, True, False, FirstProbe.READY),
    ("it succeeded while a stop is under way: the attempt did reach READY",
     True, False, True, True, True, FirstProbe.READY),
    ("it got an error: warmup failed", False, False, True, True, False, FirstProbe.FAILED),
    ("it timed out: wedged", False, True, True, True, False, FirstProbe.HUNG),
    ("it failed while a stop is under way: the stop decides", False, True, True, True, True,
     FirstProbe.IGNORED),
    ("no ready probe runs: a serving probe's answer", True, False, False, False, False,
     FirstProbe.NOT_IT),
    ("a failed serving probe is not the gate's", False, True, False, False, False, FirstProbe.NOT_IT),
    ("a late answer after the start ended (engine exited, restarting)", False, False, True, False,
     False, FirstProbe.NOT_IT),
]


@pytest.mark.parametrize(("case", "ok", "hung", "probing", "starting", "stopping", "verdict"),
                         PROBE_ROWS, ids=[r[0] for r in PROBE_ROWS])
def test_first_probe(case: str, ok: bool, hung: bool, probing: bool, starting: bool,
                     stopping: bool, verdict: FirstProbe) -> None:
    assert first_probe(ok=ok, hung=hung, probing=probing, starting=starting,
                       stopping=stopping) == verdict


PREFILL_ROWS = [
    # (case, expected, rank that said "prefill graphs disabled", still expected)
    ("rank 1 decided against prefill graphs: only its prefill capture is dropped",
     TP2, "TP1", TP2 - {("target", "prefill", "TP1")}),
    ("the unprefixed main process said so: every rank's prefill is dropped",
     TP2, None, {("target", "decode", "TP0"), ("target", "decode", "TP1")}),
    ("target and draft prefill/piecewise graphs go, decode and extend stay",
     SPEC_TP1 | {("target", "piecewise", None)}, None,
     {("target", "decode", None), ("draft", "decode", None), ("draft", "extend", None)}),
    ("a rank without prefill captures: nothing changes", frozenset({("target", "decode", "TP0")}),
     "TP0", {("target", "decode", "TP0")}),
]


@pytest.mark.parametrize(("case", "expected", "rank", "left"), PREFILL_ROWS,
                         ids=[r[0] for r in PREFILL_ROWS])
def test_without_prefill(case: str, expected: frozenset[CaptureKey], rank: str | None,
                         left: set[CaptureKey]) -> None:
    assert without_prefill(expected, rank) == left
