"""enginehttp: engine answers are untrusted (deadline, size cap, JSON depth and non-finite numbers)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_supervisor.shell.checks.enginehttp import (
    EngineAnswerError,
    Problem,
    bounded_lines,
    engine_client,
    fetch,
    fetch_json,
    json_depth,
    parse_json,
    parse_json_object,
)
from sglang_supervisor.shell.checks.probe import check_health, parse_engine_metrics, probe_once, stream_stats

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b'{"a": NaN}', Problem.NON_FINITE),
        (b'{"a": Infinity}', Problem.NON_FINITE),
        (b'[-Infinity]', Problem.NON_FINITE),
        (b'{"a": 1e999}', Problem.NON_FINITE),
        (b'{"a": -1e999}', Problem.NON_FINITE),
        (b'{"a": ' + b"9" * 400 + b"}", Problem.NON_FINITE),  # no float holds it
        (b'{"a": ' + b"9" * 5000 + b"}", Problem.NON_FINITE),
        (DEEP, Problem.TOO_DEEP),  # the decoder's own recursion limit
        (b"[" * 40 + b"]" * 40, Problem.TOO_DEEP),  # decodes, deeper than MAX_JSON_DEPTH
        (b"\xff\xfe{}", Problem.BAD_JSON),
        (b"<html>", Problem.BAD_JSON),
        (b"", Problem.BAD_JSON),
        (b'{"a": 1', Problem.BAD_JSON),
    ],
)
def test_parse_json_refuses(data: bytes, problem: Problem) -> None:
    with pytest.raises(EngineAnswerError) as info:
        parse_json(data)
    assert info.value.problem is problem
    assert len(str(info.value)) < 300  # a bounded, loggable reason, never the body


def test_parse_json_accepts_what_sglang_sends() -> None:
    body = {"internal_states": [{"last_gen_throughput": 123.4, "memory_usage": {"graph": 1.5}}],
            "max_total_num_tokens": 2**40, "version": "0.5.23", "x": [[[1]]], "neg": -1e300}
    assert parse_json(json.dumps(body).encode()) == body
    assert parse_json("[" * 32 + "]" * 32) is not None


def test_parse_json_object_wants_an_object() -> None:
    assert parse_json_object(b'{"a": 1}') == {"a": 1}
    with pytest.raises(EngineAnswerError) as info:
        parse_json_object(b"[1]")
    assert info.value.problem is Problem.BAD_SHAPE


def test_json_depth() -> None:
    assert json_depth(1) == 0
    assert json_depth([]) == 1
    assert json_depth({"a": [1, {"b": []}]}) == 4


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_value_or_a_typed_refusal(data: bytes) -> None:
    try:
        parse_json(data)
    except EngineAnswerError as exc:
        assert isinstance(exc.problem, Problem)


def test_metrics_non_finite_samples_count_as_absent() -> None:
    m = parse_engine_metrics("sglang:num_running_reqs NaN\nsglang:num_queue_reqs +Inf\n"
                             "sglang:generation_tokens_total 1e999\n"
                             'sglang:cuda_graph_passes_total{mode="decode_none"} 1.7e308\n'
                             'sglang:cuda_graph_passes_total{mode="decode_none"} 1.7e308\n')
    assert m.running is None and m.queued is None and m.generation_tokens_total is None
    assert m.decode_eager_passes is None  # the sum overflowed: not a count
    assert parse_engine_metrics("sglang:num_running_reqs 1e30\n").running is None


def test_stream_stats_ignores_absurd_counts() -> None:
    s = stream_stats([(0.1, {"meta_info": {"completion_tokens": 10**300}}),
                      (0.2, {"meta_info": {"completion_tokens": 2**80, "spec_accept_length": 10**400}})])
    assert not s.completion_tokens_from_server  # not counts: the chunks are counted instead
    assert s.completion_tokens == 0 and s.decode_tps is None
    assert s.spec_accept_length is None


# ---------------------------------------------------------------- bounded reads over a transport


def _client(stream: AsyncIterator[bytes] | bytes, status: int = 200) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(stream, bytes):
            return httpx.Response(status, content=stream)
        return httpx.Response(status, content=stream)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def _endless(chunk: bytes) -> AsyncIterator[bytes]:
    while True:
        yield chunk
        await asyncio.sleep(0)


async def _stalls(first: bytes) -> AsyncIterator[bytes]:
    yield first
    await asyncio.Event().wait()  # a body that never completes
    yield b""


def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_fetch_caps_an_endless_body() -> None:
    async def go() -> EngineAnswerError:
        async with _client(_endless(b"a" * 65536)) as c:
            with pytest.raises(EngineAnswerError) as info:
                await fetch(c, "http://engine/metrics", deadline_s=30, max_bytes=1 << 20)
            return info.value
    assert _run(go()).problem is Problem.TOO_LARGE


def test_fetch_has_a_total_deadline_for_a_body_that_never_ends() -> None:
    async def go() -> EngineAnswerError:
        async with _client(_stalls(b"{")) as c:
            with pytest.raises(EngineAnswerError) as info:
                await fetch(c, "http://engine/server_info", deadline_s=0.2)
            return info.value
    err = _run(go())
    assert err.problem is Problem.TIMEOUT and err.timed_out


def test_fetch_json_status_and_body() -> None:
    async def go(body: bytes, status: int) -> object:
        async with _client(body, status) as c:
            return await fetch_json(c, "http://engine/model_info", deadline_s=5)
    assert _run(go(b'{"model_path": "m"}', 200)) == {"model_path": "m"}
    with pytest.raises(EngineAnswerError) as info:
        _run(go(b"{}", 503))
    assert info.value.problem is Problem.HTTP_STATUS and info.value.status == 503
    with pytest.raises(EngineAnswerError) as info:
        _run(go(DEEP, 200))
    assert info.value.problem is Problem.TOO_DEEP


def test_bounded_lines_refuses_a_line_without_end() -> None:
    async def go() -> list[str]:
        got: list[str] = []
        async with _client(_endless(b"a" * 65536)) as c, c.stream("GET", "http://engine/generate") as r:
            async for line in bounded_lines(r, max_line=1 << 20):
                got.append(line)
        return got
    with pytest.raises(EngineAnswerError) as info:
        _run(go())
    assert info.value.problem is Problem.TOO_LARGE


def test_bounded_lines_splits_across_chunks() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for part in (b"data: 1\r", b"\ndata", b": 2\n\n", b"tail"):
            yield part

    async def go() -> list[str]:
        async with _client(chunks()) as c, c.stream("GET", "http://engine/generate") as r:
            return [line async for line in bounded_lines(r)]
    assert _run(go()) == ["data: 1", "data: 2", "", "tail"]


@pytest.mark.parametrize(
    ("body", "problem", "timed_out"),
    [
        (b"data: " + b"a" * (3 << 20), "too_large", False),  # one line bigger than the cap
        (b"data: " + DEEP + b"\n\n", "too_deep", False),
        (b'data: {"text": "x", "meta_info": {"completion_tokens": NaN}}\n\n', "non_finite", False),
        (b"data: {garbage\n\n", "bad_json", False),
        (b"data: [1, 2]\n\n", "bad_shape", False),
    ],
)
def test_probe_turns_hostile_streams_into_failed_results(body: bytes, problem: str, timed_out: bool) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with _client(body) as c:
            return await probe_once(c, "http://engine", timeout=30)
    r = _run(go())
    assert not r.ok and r.problem == problem and r.timed_out is timed_out and r.error


def test_probe_of_a_trickling_stream_ends_at_its_deadline_as_a_hang() -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with _client(_stalls(b"data: ")) as c:
            return await probe_once(c, "http://engine", timeout=0.2)
    r = _run(go())
    assert not r.ok and r.timed_out and r.problem == "timeout"


@pytest.mark.parametrize(
    ("stream", "ok", "problem"),
    [
        (b"", True, None),
        (b"\xff garbage", True, None),  # SGLang's /health body is not read: the status counts
        (DEEP, False, "too_large"),
    ],
)
def test_health_check_results(stream: bytes, ok: bool, problem: str | None) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with _client(stream) as c:
            return await check_health(c, "http://engine/health", 5)
    r = _run(go())
    assert (r.ok, r.problem) == (ok, problem)


def test_health_check_that_never_completes_is_a_timeout() -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with _client(_stalls(b"")) as c:
            return await check_health(c, "http://engine/health", 0.2)
    r = _run(go())
    assert not r.ok and r.problem == "timeout" and "no answer" in r.why


def test_a_client_closed_under_a_request_is_a_typed_refusal_not_an_exception() -> None:
    # Our own stop closes the supervisor's client while a probe or health check is in flight:
    # httpx raises RuntimeError, which ended the loop as an "internal error" (exit 1) under load.
    async def go():  # type: ignore[no-untyped-def]
        c = _client(b'{"ok": true}')
        await c.aclose()
        with pytest.raises(EngineAnswerError) as info:
            await fetch(c, "http://engine/metrics", deadline_s=5)
        return info.value, await probe_once(c, "http://engine", timeout=5)
    err, probe = _run(go())
    assert err.problem is Problem.CONNECT and "closed" in err.detail
    assert not probe.ok and probe.problem == "connect" and "closed its HTTP client" in probe.error


def test_engine_clients_share_one_tls_context_that_trusts_no_ca() -> None:
    # The engine is plain HTTP: no client of it may load the CA bundle (issue 26, RSS), and an
    # https URL must fail rather than go unverified.
    async def contexts() -> list[object]:
        out = []
        for _ in range(2):
            async with engine_client() as client:
                pool = client._transport._pool  # type: ignore[attr-defined]
                out.append(pool._ssl_context)
        return out

    a, b = asyncio.run(contexts())
    assert a is b
    assert a.cert_store_stats()["x509_ca"] == 0  # type: ignore[attr-defined]
    assert a.verify_mode.name == "CERT_REQUIRED"  # type: ignore[attr-defined]
