"""The simulator's throughput model: calibrated shape, monotonic in every knob."""

from __future__ import annotations

import pytest

from sglang_supervisor.simulator.throughput import (
    Profile,
    accept_length,
    aggregate_tps,
    describe,
    model_gb_from_path,
    per_stream_tps,
    single_stream_tps,
)

SEED = Profile(model_gb=54.0, tp_size=2)


def test_seed_calibration_nextn_steps() -> None:
    """27B on two workstation GPUs: ~50-57 tok/s with 3-step NEXTN, ~35-40 with 1 step."""
    three = single_stream_tps(Profile(54.0, 2, spec_steps=3, spec_draft_tokens=4))
    one = single_stream_tps(Profile(54.0, 2, spec_steps=1, spec_draft_tokens=2))
    assert 48 <= three <= 58
    assert 34 <= one <= 41
    assert single_stream_tps(SEED) < one < three


def test_graphs_vs_eager_ratio_grows_with_model_size() -> None:
    """H200 fixtures: 1.58x on a 2-layer model, 2.5x on a 64-layer 32B shape."""
    tiny = Profile(0.002)
    big = Profile(65.5, base_tps=55.94)
    tiny_ratio = single_stream_tps(tiny) / single_stream_tps(tiny, eager=True)
    big_ratio = single_stream_tps(big) / single_stream_tps(big, eager=True)
    assert tiny_ratio == pytest.approx(1.58, rel=0.1)
    assert big_ratio == pytest.approx(2.5, rel=0.1)


def test_batching_raises_aggregate_and_lowers_per_stream() -> None:
    rates = [aggregate_tps(SEED, c) for c in (1, 2, 4, 8, 16)]
    assert rates == sorted(rates)
    streams = [per_stream_tps(SEED, c) for c in (1, 2, 4, 8, 16)]
    assert streams == sorted(streams, reverse=True)
    # the tiny H200 model: 8 streams gave ~7.4x one stream
    tiny = Profile(0.002)
    assert aggregate_tps(tiny, 8) / single_stream_tps(tiny) == pytest.approx(7.4, rel=0.05)


def test_concurrency_beyond_max_running_requests_queues() -> None:
    capped = Profile(54.0, 2, max_running_requests=4)
    assert aggregate_tps(capped, 16) == aggregate_tps(capped, 4)


def test_override_sets_the_single_stream_rate() -> None:
    assert single_stream_tps(Profile(54.0, 2, base_tps=70.0)) == pytest.approx(70.0)


def test_accept_length_grows_with_steps() -> None:
    assert accept_length(SEED) == 1.0
    lengths = [accept_length(Profile(54.0, 2, spec_steps=s, spec_draft_tokens=s + 1)) for s in (1, 2, 3, 5)]
    assert lengths == sorted(lengths) and lengths[0] > 1.0


@pytest.mark.parametrize(
    ("path", "gb"),
    [
        ("Qwen/Qwen3.6-27B", 54.0),
        ("/models/Qwen3-0.6B", 1.2),
        ("meta-llama/Llama-3.1-8B-Instruct-FP8", 8.0),
        ("Qwen/Qwen3-32B-AWQ", 16.0),
        ("/tmp/tiny", 1.0),
    ],
)
def test_model_size_from_path(path: str, gb: float) -> None:
    assert model_gb_from_path(path) == pytest.approx(gb)


def test_describe_exposes_the_true_rates() -> None:
    d = describe(Profile(54.0, 2, spec_steps=3, spec_draft_tokens=4))
    assert d["single_stream_tps"] == round(
        single_stream_tps(Profile(54.0, 2, spec_steps=3, spec_draft_tokens=4)), 2
    )
    assert isinstance(d["aggregate_tps"], dict) and "8" in d["aggregate_tps"]
