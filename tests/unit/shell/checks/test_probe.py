"""Probe maths on hand-computed streams, and the HTTP shell over httpx's mock transport."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from sglang_supervisor.shell.checks.probe import (
    DEFAULT_SHAPE,
    EngineLoad,
    build_prompt,
    engine_load,
    make_shape,
    parse_engine_metrics,
    parse_get_load,
    probe_many,
    probe_once,
    stream_stats,
)


def _chunk(completion_tokens: int, text: str = "x", **meta: Any) -> dict[str, Any]:
    return {"text": text, "meta_info": {"completion_tokens": completion_tokens, **meta}}


def test_stream_stats_hand_computed_with_a_multi_token_chunk() -> None:
    # 1 token at 0.1, 0.2, 0.3; then one chunk carrying 2 tokens (speculative) at 0.5; [DONE] at 0.55.
    events = [
        (0.1, _chunk(1, prompt_tokens=40)),
        (0.2, _chunk(2)),
        (0.3, _chunk(3)),
        (0.5, _chunk(5, spec_accept_length=2.0)),
        (0.55, {}),
    ]
    s = stream_stats(events)
    assert s.ttft_s == pytest.approx(0.1)
    # (5 - 1) tokens over 0.5 - 0.1 s: counted from completion_tokens, not from the 4 chunks.
    assert s.decode_tps == pytest.approx(10.0)
    # gaps 0.1, 0.1, 0.2 → p50 0.1; p90 at rank 1.8 → 0.1 + 0.8 × 0.1
    assert s.itl_p50_s == pytest.approx(0.1)
    assert s.itl_p90_s == pytest.approx(0.18)
    assert s.e2e_s == pytest.approx(0.55)
    assert s.completion_tokens == 5
    assert s.completion_tokens_from_server
    assert s.prompt_tokens == 40
    assert s.spec_accept_length == 2.0
    assert s.content_chunks == 4
    assert s.error is None


def test_chunks_without_new_tokens_do_not_count_as_content() -> None:
    # A leading empty chunk (completion_tokens 0) and a trailing finish chunk with no new token.
    events = [
        (0.05, _chunk(0, text="")),
        (0.2, _chunk(1)),
        (0.4, _chunk(2)),
        (0.6, _chunk(3)),
        (0.65, _chunk(3, finish_reason={"type": "length"})),
    ]
    s = stream_stats(events)
    assert s.ttft_s == pytest.approx(0.2)
    assert s.decode_tps == pytest.approx(2 / 0.4)
    assert s.itl_p50_s == pytest.approx(0.2)
    assert s.e2e_s == pytest.approx(0.65)


def test_empty_text_with_token_counts_is_content() -> None:
    # The tiny random model of the fixtures streams text "" while completion_tokens grows.
    events = [(0.01, _chunk(1, text="")), (0.03, _chunk(2, text="")), (0.05, _chunk(3, text=""))]
    s = stream_stats(events)
    assert s.content_chunks == 3
    assert s.decode_tps == pytest.approx(2 / 0.04)


def test_without_meta_info_tokens_are_counted_from_chunks() -> None:
    events = [(0.1, {"text": "a"}), (0.3, {"text": "ab"}), (0.5, {"text": "abc"})]
    s = stream_stats(events)
    assert not s.completion_tokens_from_server
    assert s.completion_tokens == 3
    assert s.decode_tps == pytest.approx(2 / 0.4)


def test_error_object_in_stream_is_reported() -> None:
    s = stream_stats([(0.1, {"error": {"message": "out of memory"}})])
    assert s.error == "out of memory"
    assert s.decode_tps is None
    assert s.content_chunks == 0


def test_single_token_gives_no_decode_rate() -> None:
    s = stream_stats([(0.1, _chunk(1))])
    assert s.ttft_s == pytest.approx(0.1)
    assert s.decode_tps is None
    assert s.itl_p50_s is None


def test_real_fixture_shape_speculative(sglang_0517: Any) -> None:
    # standalone_spec.results.json: 128 tokens in 33 chunks between 0.0334 s and 0.1713 s.
    meta = json.loads((sglang_0517 / "standalone_spec.results.json").read_text())["stream_meta"][0]
    n_chunks, first, last = meta["n_chunks"], meta["first_s"], meta["last_s"]
    total = meta["meta_info"]["completion_tokens"]
    step = (last - first) / (n_chunks - 1)
    per_chunk = [1] + [4] * (n_chunks - 2)
    per_chunk.append(total - sum(per_chunk))
    events, cum = [], 0
    for i, k in enumerate(per_chunk):
        cum += k
        events.append((first + i * step, _chunk(cum, spec_accept_length=4.0)))
    s = stream_stats(events)
    assert s.completion_tokens == 128
    assert s.decode_tps == pytest.approx(127 / (last - first))
    assert s.spec_accept_length == 4.0


def test_prompt_starts_with_a_fresh_nonce_and_has_the_shape_length() -> None:
    a, b = build_prompt(DEFAULT_SHAPE), build_prompt(DEFAULT_SHAPE)
    assert a.split()[0] != b.split()[0]  # the radix cache cannot reuse the previous probe's prefix
    assert a.split()[1:] == b.split()[1:]
    assert len(a.split()) == DEFAULT_SHAPE.input_tokens


def test_shape_name_is_versioned_and_validated() -> None:
    assert DEFAULT_SHAPE.name == "v1-in256-out128"
    assert make_shape(64, 32).name == "v1-in64-out32"
    with pytest.raises(ValueError, match="max_new_tokens >= 2"):
        make_shape(64, 1)


METRICS_TEXT = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 2.0
sglang:num_running_reqs{model_name="m",tp_rank="1"} 1.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 4.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{is_streaming="false",model_name="m"} 8.0
sglang:generation_tokens_total{is_streaming="true",model_name="m"} 2848.0
# TYPE sglang:cuda_graph_passes_total counter
sglang:cuda_graph_passes_total{mode="decode_cuda_graph",model_name="m"} 1065.0
sglang:cuda_graph_passes_total{mode="decode_none",model_name="m"} 7.0
sglang:cuda_graph_passes_total{mode="prefill_none",model_name="m"} 6.0
"""


def test_parse_engine_metrics_sums_ranks_and_labels() -> None:
    m = parse_engine_metrics(METRICS_TEXT)
    assert (m.running, m.queued) == (3, 4)
    assert m.generation_tokens_total == 2856.0
    assert m.decode_graph_passes == 1065.0
    assert m.decode_eager_passes == 7.0
    assert m.spec_accept_length is None


def test_parse_engine_metrics_real_fixture(sglang_0517: Any) -> None:
    m = parse_engine_metrics((sglang_0517 / "graphs.metrics.txt").read_text())
    assert (m.running, m.queued) == (0, 0)
    assert m.generation_tokens_total == 2856.0
    assert m.decode_graph_passes == 1065.0
    assert m.decode_eager_passes is None  # this run never decoded without a graph


def test_parse_engine_metrics_reads_only_its_samples(sglang_0517: Any) -> None:
    """Only the samples read are parsed (the rest of SGLang's answer, histograms mostly, is ~95 % of
    it): a family nothing reads may be anything; garbage where nothing is read is still garbage."""
    real = (sglang_0517 / "graphs.metrics.txt").read_text()
    noisy = real + "sglang:some_future_histogram_bucket{le=\"+Inf\"} not-a-number\n"
    assert parse_engine_metrics(noisy) == parse_engine_metrics(real)
    with pytest.raises(ValueError):
        parse_engine_metrics(real.replace("sglang:num_running_reqs{", "sglang:num_running_reqs{{{", 1))
    with pytest.raises(ValueError):
        parse_engine_metrics("<html>not prometheus at all</html>\n")
    assert parse_engine_metrics("# HELP other_metric x\nother_metric 1.0\n").running is None


def test_parse_get_load_variants() -> None:
    two_ranks = [{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2}, {"dp_rank": 1, "num_reqs": 0}]
    assert parse_get_load(two_ranks) == EngineLoad(3, 2, "get_load")
    assert parse_get_load({"num_reqs": 0, "num_waiting_reqs": 0}) == EngineLoad(0, 0, "get_load")
    assert parse_get_load({"something": "else"}) is None
    assert parse_get_load("garbage") is None


# --- HTTP shell over httpx.MockTransport -------------------------------------------------------

def _sse(chunks: list[dict[str, Any]]) -> bytes:
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_probe_once_parses_a_stream_and_sends_the_shape() -> None:
    seen: dict[str, Any] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers.get("authorization")
        seen["body"] = json.loads(request.content)
        return httpx.Response(200, content=_sse([_chunk(i) for i in range(1, 11)]))

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await probe_once(c, "http://engine/", make_shape(16, 10), api_key="sekret")

    r = _run(go())
    assert r.ok, r.error
    assert r.completion_tokens == 10
    assert r.shape == "v1-in16-out10"
    assert seen["auth"] == "Bearer sekret"
    sp = seen["body"]["sampling_params"]
    assert sp == {"max_new_tokens": 10, "temperature": 0.0, "ignore_eos": True}
    assert seen["body"]["stream"] is True


@pytest.mark.parametrize(
    ("response", "needle"),
    [
        (httpx.Response(500, content=b"boom"), "HTTP 500"),
        (httpx.Response(200, content=b"data: {not json\n\n"), "garbage"),
        (httpx.Response(200, content=b"data: [1, 2]\n\n"), "unexpected event"),
        (httpx.Response(200, content=b"data: [DONE]\n\n"), "without any generated token"),
        (httpx.Response(200, content=_sse([{"error": "Unauthorized"}])), "Unauthorized"),
        (httpx.Response(200, content=_sse([_chunk(1)])), "too few tokens"),
    ],
)
def test_probe_once_turns_bad_answers_into_failed_results(response: httpx.Response, needle: str) -> None:
    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(lambda _r: response)) as c:
            return await probe_once(c, "http://engine", DEFAULT_SHAPE, api_key="sekret")

    r = _run(go())
    assert not r.ok
    assert needle in (r.error or "")
    assert "sekret" not in (r.error or "")


def test_probe_once_connection_refused_and_hang_are_results() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def go() -> tuple[Any, Any]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(refused)) as c:
            a = await probe_once(c, "http://engine", DEFAULT_SHAPE)
        async with httpx.AsyncClient(transport=httpx.MockTransport(hang)) as c:
            b = await probe_once(c, "http://engine", DEFAULT_SHAPE, timeout=0.05)
        return a, b

    a, b = _run(go())
    assert not a.ok and "ConnectError" in (a.error or "") and not a.timed_out
    assert not b.ok and "no complete answer" in (b.error or "") and b.timed_out


def test_probe_once_client_timeout_is_timed_out_and_errors_are_not() -> None:
    def read_timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async def go() -> tuple[Any, Any]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(read_timeout)) as c:
            slow = await probe_once(c, "http://engine", DEFAULT_SHAPE)
        async with httpx.AsyncClient(transport=httpx.MockTransport(lambda _r: httpx.Response(503))) as c:
            refused = await probe_once(c, "http://engine", DEFAULT_SHAPE)
        return slow, refused

    slow, refused = _run(go())
    assert not slow.ok and slow.timed_out and "ReadTimeout" in (slow.error or "")
    assert not refused.ok and not refused.timed_out


def test_probe_many_aggregates_rounds() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_sse([_chunk(i) for i in range(1, 9)]))

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await probe_many("http://engine", make_shape(8, 8), runs=2, concurrency=3, client=c)

    rep = _run(go())
    assert len(rep.results) == 6
    assert rep.failed == 0
    assert len(rep.aggregate_tps) == 2
    d = rep.to_dict()
    assert d["ok"] == 6 and d["concurrency"] == 3 and d["median_decode_tps"] is not None


def test_engine_load_prefers_metrics_then_get_load_then_none() -> None:
    def with_metrics(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=METRICS_TEXT)
        return httpx.Response(404)

    def only_get_load(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_load":
            return httpx.Response(200, json=[{"num_reqs": 1, "num_waiting_reqs": 0}])
        return httpx.Response(404)

    def garbage(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>proxy error</html>")

    async def go(handler: Any) -> EngineLoad | None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await engine_load(c, "http://engine")

    assert _run(go(with_metrics)) == EngineLoad(3, 4, "metrics")
    one = _run(go(only_get_load))
    assert one == EngineLoad(1, 0, "get_load") and not one.idle
    assert _run(go(garbage)) is None
