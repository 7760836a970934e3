"""SGLang's HTTP API over the simulated engine (starlette; served by uvicorn like SGLang).

Long because: Api is SGLang's HTTP surface (native, OpenAI, health, metrics, admin routes) over one
simulated engine; each route is short and they share the engine, the auth check and the fault hooks,
so the surface reads as one table of routes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from sglang_supervisor.simulator import outputs, reqlog, serving, throughput
from sglang_supervisor.simulator.args import SimConfig

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, float("inf"))


def text_for(n: int) -> str:
    return "".join(serving.WORDS[i % len(serving.WORDS)] for i in range(n))


class AuthMiddleware:
    """`--api-key`: Bearer token on every route except /health*, /ready*, /metrics* (SGLang's auth.py)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if self.api_key and scope["type"] == "http" and scope.get("method") != "OPTIONS":
            path: str = scope.get("path", "")
            if not path.startswith(("/health", "/ready", "/metrics")):
                headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
                if headers.get("authorization") != f"Bearer {self.api_key}":
                    resp = JSONResponse({"error": "Unauthorized"}, status_code=401)
                    await resp(scope, receive, send)
                    return
        await self.app(scope, receive, send)


class _EngineCollector:
    """sglang: scheduler/tokenizer counters and gauges, read from the engine at scrape time."""

    def __init__(self, cfg: SimConfig, engine: serving.Engine) -> None:
        self.cfg = cfg
        self.engine = engine
        self.labels = {
            "model_name": cfg.served_model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
        }

    def _gauge(self, name: str, doc: str, value: float, extra: dict[str, str] | None = None) -> Metric:
        labels = {**self.labels, **(extra or {})}
        g = GaugeMetricFamily(name, doc, labels=list(labels))
        g.add_metric(list(labels.values()), value)
        return g

    def collect(self) -> Iterable[Metric]:
        e, c = self.engine, self.engine.counters
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.", len(e.running))
        yield self._gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", len(e.waiting)
        )
        yield self._gauge(
            "sglang:gen_throughput", "The generation throughput (token/s).", e.last_gen_throughput
        )
        yield self._gauge("sglang:token_usage", "The token usage.", round(e.token_usage(), 2))
        yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", 0.0)
        yield self._gauge(
            "sglang:is_cuda_graph", "Whether the batch is using CUDA graph.", float(not e.eager)
        )
        yield self._gauge("sglang:max_total_num_tokens", "Maximum total tokens in the KV pool.", e.kv_tokens)
        yield self._gauge("sglang:context_len", "The context length.", self.cfg.context_len)
        if self.cfg.speculative:
            yield self._gauge(
                "sglang:spec_accept_length", "The average acceptance length.", e.last_accept_length
            )
        for phase, secs in e.startup_graph_times.items():
            yield self._gauge(
                "sglang:startup_cuda_graph_time_seconds", "CUDA graph capture time.", secs, {"phase": phase}
            )
        passes = CounterMetricFamily(
            "sglang:cuda_graph_passes", "Forward passes by CUDA graph mode.", labels=[*self.labels, "mode"]
        )
        for mode, n in (
            ("decode_cuda_graph", c.decode_graph_passes),
            ("decode_none", c.decode_eager_passes),
            ("prefill_cuda_graph", c.prefill_graph_passes),
            ("prefill_none", c.prefill_eager_passes),
        ):
            passes.add_metric([*self.labels.values(), mode], n)
        yield passes
        tok_labels = {"model_name": self.cfg.served_model_name, "engine_type": "unified"}
        for name, doc, value in (
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens),
            ("sglang:generation_tokens", "Number of generation tokens processed.", c.generation_tokens),
            ("sglang:num_requests", "Number of requests processed.", c.requests),
            ("sglang:num_aborted_requests", "Number of requests aborted.", c.aborted),
        ):
            fam = CounterMetricFamily(name, doc, labels=list(tok_labels))
            fam.add_metric(list(tok_labels.values()), value)
            yield fam


def make_registry(cfg: SimConfig, engine: serving.Engine) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineCollector(cfg, engine))
    labels = ["model_name", "engine_type"]
    hist = {
        "ttft": Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            registry=registry,
            buckets=_LATENCY_BUCKETS,
        ),
        "e2e": Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency.",
            labels,
            registry=registry,
            buckets=_LATENCY_BUCKETS,
        ),
        "itl": Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            registry=registry,
            buckets=_ITL_BUCKETS,
        ),
    }
    values = (cfg.served_model_name, "unified")
    engine.observers.append(lambda name, v: hist[name].labels(*values).observe(v))
    return registry


def _meta(cfg: SimConfig, req: serving.Request, final: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": {"type": "length", "length": req.max_new_tokens} if final else None,
        "prompt_tokens": req.prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": req.generated,
        "cached_tokens": req.cached_tokens,
    }
    if final:
        meta["e2e_latency"] = (req.finished_at or time.monotonic()) - req.created
        if cfg.speculative:
            verify = max(req.verify_ct, 1)
            decoded = max(req.generated - 1, 0)
            accept_len = decoded / verify if req.verify_ct else 1.0
            proposed = verify * max(cfg.spec_steps, 1)
            correct = max(decoded - req.verify_ct, 0)
            meta.update(
                {
                    "spec_accept_rate": round(correct / proposed, 4) if proposed else 0.0,
                    "spec_accept_length": round(accept_len, 4),
                    "spec_num_correct_drafts": correct,
                    "spec_num_proposed_drafts": proposed,
                    "spec_verify_ct": req.verify_ct,
                }
            )
    return meta


class Api:
    """Route handlers; `engine` is shared with the launcher (status, draining, faults)."""

    def __init__(
        self,
        cfg: SimConfig,
        engine: serving.Engine,
        log: serving.Log,
        health_timeout_s: float,
        registry: CollectorRegistry | None,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.log = log
        self.health_timeout_s = health_timeout_s
        self.registry = registry
        self.started_at = time.time()
        self._echoed: dict[str, reqlog.Obj] = {}  # rid -> request, for its Finish record

    # -- generation ----------------------------------------------------------------------------

    async def _run(self, req: serving.Request) -> AsyncIterator[tuple[int, bool]]:
        """Yield (tokens so far, final) as the engine produces them; abort on cancellation."""
        try:
            while True:
                n = await req.updates.get()
                if n < 0:
                    self._echo_finish(req)
                    yield req.generated, True
                    return
                if req.done:
                    while (await req.updates.get()) >= 0:
                        pass
                    self._echo_finish(req)
                    yield req.generated, True
                    return
                yield req.generated, False
        finally:
            self._echoed.pop(req.rid, None)
            if req.finished_at is None:
                self.engine.abort(req)

    def _submit(self, text: str | None, ids: list[int] | None, max_new: int,
                params: dict[str, Any] | None = None, stream: bool = False) -> serving.Request:
        prompt = self.engine.prompt_tokens_for(text, ids)
        key = text if text is not None else json.dumps(ids)
        req = self.engine.submit(prompt, max_new, key)
        if self.cfg.log_requests:
            obj = reqlog.generate_req(req.rid, text, params or {"max_new_tokens": max_new}, stream=stream,
                                      input_ids=ids)
            self._echoed[req.rid] = obj
            self._echo(reqlog.receive(obj, self.cfg.log_requests_level, self.cfg.log_requests_format,
                                      time.time()))
        return req

    def _echo(self, record: str) -> None:
        """--log-requests: SGLang's request logger writes its own `[time] record` lines."""
        self.log.request_record(reqlog.line(record, time.time()))

    def _echo_finish(self, req: serving.Request) -> None:
        obj = self._echoed.pop(req.rid, None)
        if obj is not None:
            out = {"text": text_for(req.generated), "output_ids": [0] * req.generated,
                   "meta_info": _meta(self.cfg, req, True)}
            self._echo(reqlog.finish(obj, out, self.cfg.log_requests_level, self.cfg.log_requests_format,
                                     time.time()))

    def _echo_openai(self, body: dict[str, Any]) -> None:
        if self.cfg.log_requests:
            self._echo(reqlog.receive_openai(body, self.cfg.log_requests_level,
                                             self.cfg.log_requests_format, time.time()))

    async def generate(self, request: Request) -> Response:
        body = await _json(request)
        if body is None:
            return JSONResponse({"error": {"message": "Invalid JSON body"}}, status_code=400)
        params = body.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 128))
        texts = body.get("text")
        ids = body.get("input_ids")
        stream = bool(body.get("stream"))
        if isinstance(texts, list):
            reqs = [self._submit(t, None, max_new, params, stream) for t in texts]
            outs = [await self._collect(r) for r in reqs]
            return JSONResponse(outs)
        req = self._submit(texts, ids, max_new, params, stream)
        if not body.get("stream"):
            out = await self._collect(req)
            if isinstance(texts, str):  # SGLang's greedy ids depend on the prompt (outputs.py)
                e = self.engine
                fault = e.output_fault if e.scored >= e.output_fault_after else None
                out["output_ids"] = outputs.output_ids(texts, req.generated, fault)
                out["text"] = outputs.text_of(out["output_ids"], serving.WORDS)
                if body.get("return_logprob") and body.get("logprob_start_len", -1) == 0:
                    out["meta_info"]["input_token_logprobs"] = outputs.input_logprobs(texts, fault)
                    out["meta_info"]["output_token_logprobs"] = []
                    e.scored += 1
            return JSONResponse(out)

        async def events() -> AsyncIterator[bytes]:
            async for n, final in self._run(req):
                chunk = {"text": text_for(n), "output_ids": [0] * n, "meta_info": _meta(self.cfg, req, final)}
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def _collect(self, req: serving.Request) -> dict[str, Any]:
        async for _n, final in self._run(req):
            if final:
                break
        return {
            "text": text_for(req.generated),
            "output_ids": [0] * req.generated,
            "meta_info": _meta(self.cfg, req, True),
        }

    async def completions(self, request: Request) -> Response:
        body = await _json(request) or {}
        self._echo_openai(body)
        prompt = body.get("prompt", "")
        req = self._submit(
            prompt if isinstance(prompt, str) else None,
            prompt if isinstance(prompt, list) else None,
            int(body.get("max_tokens") or 16),
        )
        return await self._openai(req, body, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        body = await _json(request) or {}
        self._echo_openai(body)
        messages = body.get("messages") or []
        text = "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or 128)
        req = self._submit(text, None, max_new)
        return await self._openai(req, body, chat=True)

    async def _openai(self, req: serving.Request, body: dict[str, Any], *, chat: bool) -> Response:
        """Long because: one OpenAI endpoint in both of its shapes (chat and text completion, streamed
        as SSE and not), which differ only in field names and framing; the four answers are built
        side by side so they stay the same as SGLang's.
        """
        rid = ("chatcmpl-" if chat else "cmpl-") + req.rid
        model = body.get("model") or self.cfg.served_model_name
        created = int(time.time())
        if not body.get("stream"):
            await self._collect(req)
            usage = {
                "prompt_tokens": req.prompt_tokens,
                "completion_tokens": req.generated,
                "total_tokens": req.prompt_tokens + req.generated,
            }
            if chat:
                choice: dict[str, Any] = {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": text_for(req.generated),
                        "reasoning_content": None,
                        "tool_calls": None,
                    },
                    "logprobs": None,
                    "finish_reason": "length",
                    "matched_stop": None,
                }
            else:
                choice = {
                    "index": 0,
                    "text": text_for(req.generated),
                    "logprobs": None,
                    "finish_reason": "length",
                    "matched_stop": None,
                }
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> AsyncIterator[bytes]:
            sent = 0
            async for n, final in self._run(req):
                piece = text_for(n)[len(text_for(sent)) :]
                sent = n
                reason = "length" if final else None
                if chat:
                    choice = {
                        "index": 0,
                        "delta": {"role": "assistant", "content": piece},
                        "logprobs": None,
                        "finish_reason": reason,
                    }
                    obj = "chat.completion.chunk"
                else:
                    choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}
                    obj = "text_completion"
                chunk = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            if include_usage:
                usage = {
                    "prompt_tokens": req.prompt_tokens,
                    "completion_tokens": req.generated,
                    "total_tokens": req.prompt_tokens + req.generated,
                }
                tail: dict[str, Any] = {
                    "id": rid,
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
                yield b"data: " + json.dumps(tail).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # -- health and info -----------------------------------------------------------------------

    async def ready(self, request: Request) -> Response:
        e = self.engine
        ok = e.status == "up" and not e.draining
        return Response(status_code=200 if ok else 503)

    async def health(self, request: Request) -> Response:
        e = self.engine
        if e.draining:
            self.log.main("Health check request received during shutdown. Returning 503.")
            return Response(status_code=503)
        if e.status != "up" or e.unhealthy:
            return Response(status_code=503)
        req = e.submit(1, 1)
        try:
            await asyncio.wait_for(req.updates.get(), self.health_timeout_s)
        except asyncio.TimeoutError:
            e.abort(req)
            e.unhealthy = True
            now = time.time()
            self.log.main(
                f"Health check failed. Server couldn't get a response from detokenizer for last "
                f"{self.health_timeout_s:g} seconds. tic start time: {now - self.health_timeout_s:.2f}. "
                f"last_heartbeat time: {now - self.health_timeout_s:.2f}"
            )
            return Response(status_code=503)
        return Response(status_code=200)

    def model_info_data(self) -> dict[str, Any]:
        return {
            "model_path": self.cfg.model_path,
            "served_model_name": self.cfg.served_model_name,
            "tokenizer_path": self.cfg.server_args.get("tokenizer_path"),
            "is_generation": True,
            "weight_version": "default",
            "load_format": self.cfg.server_args.get("load_format") or "auto",
            "reasoning_parser": self.cfg.server_args.get("reasoning_parser"),
            "tool_call_parser": self.cfg.server_args.get("tool_call_parser"),
            "disaggregation_mode": "null",
            "has_image_understanding": self.cfg.hybrid,
            "has_audio_understanding": False,
            "model_type": "qwen3_5" if self.cfg.hybrid else "qwen3",
            "architectures": [self.cfg.model_class],
        }

    async def model_info(self, request: Request) -> Response:
        if request.url.path.startswith("/get_"):
            self._deprecated("/get_model_info", "/model_info")
        return JSONResponse(self.model_info_data())

    async def server_info(self, request: Request) -> Response:
        if request.url.path.startswith("/get_"):
            self._deprecated("/get_server_info", "/server_info")
        e = self.engine
        info: dict[str, Any] = dict(_jsonable(self.cfg.server_args))
        info.update(
            {
                "launch_command": " ".join(self.cfg.argv),
                "max_total_num_tokens": e.kv_tokens,
                "max_req_input_len": self.cfg.context_len - 1,
                "internal_states": [
                    {
                        "last_gen_throughput": e.last_gen_throughput,
                        "avg_spec_accept_length": e.last_accept_length if self.cfg.speculative else None,
                        "memory_usage": e.memory_usage,
                        "effective_max_running_requests_per_dp": self.cfg.max_running_requests,
                        "cuda_graph": not e.eager,
                    }
                ],
                "version": self.cfg.spec.version,
                "startup_time": self.started_at,
                "sim": {
                    **throughput.describe(self.cfg.profile),
                    "current_single_stream_tps": round(e.true_single_stream_tps(), 2),
                    "eager": e.eager,
                    "rate_multiplier": e.rate_multiplier,
                    "wedged": e.wedged,
                },
            }
        )
        return JSONResponse(info)

    def _deprecated(self, old: str, new: str) -> None:
        self.log.main(
            f"Endpoint '{old}' is deprecated and will be removed in a future version. "
            f"Please use '{new}' instead."
        )

    async def models(self, request: Request) -> Response:
        name = self.cfg.served_model_name
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(self.started_at),
                        "owned_by": "sglang",
                        "root": name,
                        "parent": None,
                        "max_model_len": self.cfg.context_len,
                    }
                ],
            }
        )

    async def metrics(self, request: Request) -> Response:
        assert self.registry is not None
        return Response(generate_latest(self.registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def flush_cache(self, request: Request) -> Response:
        if self.engine.num_requests:
            return PlainTextResponse(
                "Cache not flushed. Please check backend logs for more details. (When there are running or "
                "waiting requests, the operation will not be performed.)\n",
                status_code=400,
            )
        self.engine.flush_cache()
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            "requests, the operation will not be performed.)\n"
        )

    async def load(self, request: Request) -> Response:
        if request.url.path == "/get_load":
            self._deprecated("/get_load", "/v1/loads")
        e = self.engine
        return JSONResponse(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": e.num_requests,
                    "num_waiting_reqs": len(e.waiting),
                    "num_tokens": sum(r.prompt_tokens + r.generated for r in e.running),
                }
            ]
        )


async def _json(request: Request) -> dict[str, Any] | None:
    try:
        data = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _jsonable(args: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v if isinstance(v, str | int | float | bool | list | type(None)) else str(v)
        for k, v in args.items()
    }


def build_app(api: Api) -> ASGIApp:
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/health_generate", api.health, methods=["GET"]),
        Route("/model_info", api.model_info, methods=["GET"]),
        Route("/get_model_info", api.model_info, methods=["GET"]),
        Route("/server_info", api.server_info, methods=["GET"]),
        Route("/get_server_info", api.server_info, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/generate", api.generate, methods=["POST", "PUT"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/flush_cache", api.flush_cache, methods=["GET", "POST"]),
        Route("/get_load", api.load, methods=["GET"]),
        Route("/v1/loads", api.load, methods=["GET"]),
    ]
    if api.cfg.spec.has_ready_route:
        routes.append(Route("/ready", api.ready, methods=["GET"]))
    if api.registry is not None:
        routes.append(Route("/metrics", api.metrics, methods=["GET"]))
    return AuthMiddleware(Starlette(routes=routes), api.cfg.api_key)
