"""Real SGLang 0.5.17 logs of the seed's architecture on an H200 (scripts/gpu-e2e --only seed,
2026-12-01): a tiny random Qwen3_5ForConditionalGeneration (3 Gated-DeltaNet + 1 full-attention
layer, one MTP layer) run with qwen.yaml's ladder, NEXTN 3 steps / 4 draft tokens. Read through
the supervisor's parser, expected-capture model and READY gate."""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    DecodeStats,
    EngineEvent,
    EngineFailed,
    FailureClass,
    PrefillGraphDisabled,
    ServerArgsSeen,
    ServerReady,
)
from sglang_supervisor.core.logwatch import parse_bytes, summarize
from sglang_supervisor.engine.graphs import ExpectedCapture, expected_captures, settled_by_prefill_off

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sglang-0.5.17-h200-seed"
# What `render` wrote for `tuned` on 0.5.17 (TP 1 on the device), minus model/host/port.
TUNED = ["--tp-size", "1", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--language-only",
         "--cuda-graph-backend-prefill", "breakable"]


def attempts(name: str) -> list[list[EngineEvent]]:
    """The log of one supervisor run split per engine start (each begins with server_args=)."""
    out: list[list[EngineEvent]] = []
    for e in parse_bytes((FIX / name).read_bytes(), "0.5.17"):
        if isinstance(e, ServerArgsSeen) or not out:
            out.append([])
        out[-1].append(e)
    return out


def captures(events: list[EngineEvent]) -> list[str]:
    return [f"{e.owner} {e.phase}" for e in events if isinstance(e, CaptureEnded)]


def test_single_batch_overlap_fails_the_tuned_start_on_sm90_before_any_weight_loads() -> None:
    tuned, fallback = attempts("tuned-sbo-then-no-prefill-graph.engine.log")
    s = summarize(tuned)
    assert s.failure is not None and s.failure["class"] == FailureClass.FLAG_REFUSED.value
    assert "SBO (single batch overlap) is not supported on SM90" in s.failure["message"]
    assert "--enable-single-batch-overlap" in s.failure["message"]
    assert not any(isinstance(e, CaptureBegan) for e in tuned)
    assert not s.ready
    # the next rung (no-prefill-graph) serves: verify + the draft's two graphs, no prefill graphs
    assert captures(fallback) == ["target verify", "draft decode", "draft extend"]
    assert sum(isinstance(e, PrefillGraphDisabled) for e in fallback) == 2  # target, then draft
    assert summarize(fallback).ready and summarize(fallback).failure is None


def test_tuned_without_sbo_captures_the_breakable_prefill_graph_on_the_hybrid_model() -> None:
    [run] = attempts("tuned-without-sbo.engine.log")
    assert captures(run) == ["target prefill", "target verify", "draft decode", "draft extend"]
    prefill = next(e for e in run if isinstance(e, CaptureEnded) and e.phase == "prefill")
    assert prefill.elapsed_s == 39.52  # the JIT cache of the first call was carried in
    # The MTP draft does not capture a prefill graph on this architecture: SGLang says why instead.
    [off] = [e for e in run if isinstance(e, PrefillGraphDisabled)]
    assert off.reason == "some layers do not apply Standard GQA"
    assert any(isinstance(e, ServerReady) for e in run)


def outstanding(expected: list[ExpectedCapture], events: list[EngineEvent]) -> list[str]:
    """The expected captures of `events` still open, as the lifecycle's READY gate counts them."""
    ended = {(e.owner, e.phase, e.rank) for e in events if isinstance(e, CaptureEnded)}
    off = [e.rank for e in events if isinstance(e, PrefillGraphDisabled)]
    return [f"{c.owner} {c.phase}" for c in expected for r in c.ranks
            if (c.owner, c.phase, r) not in ended
            and not any(settled_by_prefill_off(c.phase, r, by) for by in off)]


def test_the_ready_gate_expects_exactly_what_the_hybrid_model_logged() -> None:
    [run] = attempts("tuned-without-sbo.engine.log")
    expected = expected_captures(TUNED, "0.5.17", 1)
    assert [f"{c.owner} {c.phase}" for c in expected] == [
        "target prefill", "target verify", "draft prefill", "draft decode", "draft extend"]
    # the draft's prefill graph is settled by its `Disable prefill CUDA graph because ...` line
    assert outstanding(expected, run) == []
    before_draft = run[: next(i for i, e in enumerate(run) if isinstance(e, PrefillGraphDisabled))]
    assert outstanding(expected, before_draft) == [
        "draft prefill", "draft decode", "draft extend"]


def test_nextn_accept_length_with_random_weights_is_one() -> None:
    [run] = attempts("tuned-without-sbo.engine.log")
    stats = [e for e in run if isinstance(e, DecodeStats)]
    assert stats and {e.accept_len for e in stats} == {1.0}
    assert all(e.cuda_graph for e in stats)


def test_no_failure_signature_in_a_clean_hybrid_start() -> None:
    [run] = attempts("tuned-without-sbo.engine.log")
    assert not [e for e in run if isinstance(e, EngineFailed)]
