"""/readyz and /livez on the supervisor's HTTP endpoint: 200 or 503 with a small JSON reason."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from sglang_supervisor.core.rotation import Verdict
from sglang_supervisor.shell.telemetry.metrics import MetricsServer, SupervisorMetrics


def serve(**providers: Any) -> dict[str, tuple[int, Any]]:
    async def go() -> dict[str, tuple[int, Any]]:
        srv = MetricsServer("127.0.0.1:0", SupervisorMetrics(with_gpu=False), **providers)
        await srv.start()
        try:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                out = {}
                for path in ("/readyz", "/livez"):
                    r = await c.get(path)
                    out[path] = (r.status_code, r.json())
                return out
        finally:
            await srv.stop()

    return asyncio.run(go())


def test_ready_and_alive() -> None:
    out = serve(readiness=lambda: Verdict(True, "serving"), liveness=lambda: Verdict(True, "loop alive"))
    assert out["/readyz"] == (200, {"ready": True, "reason": "serving"})
    assert out["/livez"] == (200, {"alive": True, "reason": "loop alive"})


def test_not_ready_is_503_with_the_reason() -> None:
    out = serve(readiness=lambda: Verdict(False, "capturing_graphs 3/8"),
                liveness=lambda: Verdict(False, "supervisor loop stalled for 40 s"))
    assert out["/readyz"] == (503, {"ready": False, "reason": "capturing_graphs 3/8"})
    assert out["/livez"][0] == 503


def test_a_broken_or_missing_provider_says_no_without_crashing() -> None:
    def broken() -> Verdict:
        raise RuntimeError("boom")

    out = serve(readiness=broken)
    assert out["/readyz"] == (503, {"ready": False, "reason": "unavailable: RuntimeError"})
    assert out["/livez"] == (503, {"alive": False, "reason": "not wired"})
