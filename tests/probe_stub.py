"""A minimal in-process SGLang HTTP stand-in for probe tests that need real sockets and real time:
streaming `/generate` paced at a fixed decode rate, `/metrics` with load and counters, `/get_load`.

The full simulator (`sglang-sim`) is what the supervisor's integration tests use; this stub keeps
the probe's measurement tests independent of the simulator's log and process model.
`MemoryStore`, `ProbeSettings` and `no_nvml` are what those tests hand the monitor besides the engine
(`ProbeSettings` and `no_nvml` the monitor's unit tests too).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from sglang_supervisor.shell.telemetry.metrics import MetricsServer, SupervisorMetrics


@dataclass(frozen=True)
class ProbeSettings:
    """The `probe:` settings the monitor reads (here and in tests/unit/shell/checks); a test sets
    the pace and the probe's size it needs."""

    interval_s: float = 0.0
    max_new_tokens: int = 8
    timeout_s: float = 5.0
    enabled: bool = True
    input_tokens: int = 16
    baseline_runs: int = 3
    regression_delta: float = 0.15
    regression_window: int = 3
    cooldown_s: float = 60.0
    act_on_regression: bool = True


def no_nvml(name: str) -> Any:
    raise ImportError("NVML is not used in this test")


class MemoryStore:
    """The monitor's baseline store in memory: no baseline to start from; a set one is kept."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def baseline(self, key: str) -> Any:
        return None

    def set_baseline(self, key: str, value: float, now: float) -> bool:
        self.values[key] = value
        return True


class StubEngine:
    def __init__(self, tokens_per_second: float, ttft_s: float = 0.005):
        self.tokens_per_second = tokens_per_second
        self.ttft_s = ttft_s
        self.running = 0
        self.extra_running = 0  # simulated foreign traffic
        self.generated = 0  # by our requests (probes)
        self.foreign_generated = 0  # by the foreign traffic: busy engines generate tokens
        self.decode_none = 0
        self.eager = False
        self._server: MetricsServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return self._server.url

    async def _generate(self, request: Request) -> Response:
        body = await request.json()
        n = int(body["sampling_params"]["max_new_tokens"])
        prompt = len(str(body.get("text", "")).split())

        async def stream() -> AsyncIterator[bytes]:
            self.running += 1
            try:
                await asyncio.sleep(self.ttft_s)
                start = time.perf_counter()
                for i in range(1, n + 1):
                    # Pace against the start time, not per sleep, so jitter does not accumulate.
                    due = start + (i - 1) / self.tokens_per_second
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    self.generated += 1
                    if self.eager:
                        self.decode_none += 1
                    meta = {"completion_tokens": i, "prompt_tokens": prompt}
                    yield f"data: {json.dumps({'text': 'x' * i, 'meta_info': meta})}\n\n".encode()
                yield b"data: [DONE]\n\n"
            finally:
                self.running -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def _metrics(self, request: Request) -> Response:
        running = self.running + self.extra_running
        self.foreign_generated += 10 * self.extra_running  # progress between two scrapes
        text = (
            "# TYPE sglang:num_running_reqs gauge\n"
            f'sglang:num_running_reqs{{model_name="stub",tp_rank="0"}} {running}\n'
            "# TYPE sglang:num_queue_reqs gauge\n"
            f'sglang:num_queue_reqs{{model_name="stub",tp_rank="0"}} 0\n'
            "# TYPE sglang:generation_tokens_total counter\n"
            f'sglang:generation_tokens_total{{model_name="stub"}} {self.generated + self.foreign_generated}\n'
            "# TYPE sglang:cuda_graph_passes_total counter\n"
            f'sglang:cuda_graph_passes_total{{mode="decode_none",model_name="stub"}} {self.decode_none}\n'
        )
        return PlainTextResponse(text)

    async def start(self) -> None:
        app = Starlette(routes=[
            Route("/generate", self._generate, methods=["POST"]),
            Route("/metrics", self._metrics),
        ])
        server = MetricsServer("127.0.0.1:0", SupervisorMetrics(with_gpu=False))
        server.app = lambda: app  # type: ignore[method-assign]
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
