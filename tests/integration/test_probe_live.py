"""Probe and monitor over real loopback HTTP against the paced stub engine (tests/probe_stub.py):
measurement accuracy, and the monitor's decisions for a degraded, a busy and an eager engine."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from probe_stub import MemoryStore, ProbeSettings, StubEngine, no_nvml
from sglang_supervisor.core.regression import Explained, Reason, RestartSame
from sglang_supervisor.shell.checks.monitor import ThroughputMonitor
from sglang_supervisor.shell.checks.probe import make_shape, probe_many
from sglang_supervisor.shell.telemetry.gpu import Nvml
from sglang_supervisor.shell.telemetry.metrics import SupervisorMetrics

pytestmark = pytest.mark.integration


SETTINGS = ProbeSettings(interval_s=0.05, max_new_tokens=48, timeout_s=20.0)


def monitor(engine: StubEngine, decisions: list[Any]) -> ThroughputMonitor:
    return ThroughputMonitor(engine.url, SETTINGS, SupervisorMetrics(with_gpu=False), MemoryStore(),
                             lambda d, text: decisions.append((d, text)), baseline_key="k",
                             profile="fast", primary="fast", nvml=Nvml(loader=no_nvml))


@contextlib.asynccontextmanager
async def baselined(decisions: list[Any]) -> AsyncIterator[tuple[StubEngine, ThroughputMonitor]]:
    """A 400 tok/s stub engine and its monitor, three ticks in (the baseline taken); both closed
    when the block ends."""
    engine = StubEngine(tokens_per_second=400.0)
    await engine.start()
    mon = monitor(engine, decisions)
    try:
        for _ in range(3):
            await mon.tick()
        yield engine, mon
    finally:
        await mon.aclose()
        await engine.stop()


def test_probe_agrees_with_the_configured_rate() -> None:
    async def go() -> tuple[float | None, float | None]:
        engine = StubEngine(tokens_per_second=300.0)
        await engine.start()
        try:
            report = await probe_many(engine.url, make_shape(32, 128), runs=3, concurrency=1, timeout=30)
            assert report.failed == 0, report.to_dict()["errors"]
            agg = await probe_many(engine.url, make_shape(32, 64), runs=1, concurrency=4, timeout=30)
            return report.median_decode_tps, agg.median_aggregate_tps
        finally:
            await engine.stop()

    tps, aggregate = asyncio.run(go())
    assert tps == pytest.approx(300.0, rel=0.02)
    # Four streams at 300 tok/s each, less the TTFT and tail: well above one stream.
    assert aggregate is not None and aggregate > 2 * 300.0


def test_degraded_engine_is_detected_confirmed_and_restarted() -> None:
    decisions: list[Any] = []

    async def go() -> ThroughputMonitor:
        async with baselined(decisions) as (engine, mon):
            assert mon.baseline == pytest.approx(400.0, rel=0.05)
            engine.tokens_per_second = 200.0  # the `degrade:2` fault
            for _ in range(6):
                if decisions:
                    break
                await mon.tick()
            return mon

    mon = asyncio.run(go())
    assert decisions and isinstance(decisions[-1][0], RestartSame), decisions
    assert mon.remediation.stage == "restarted_same"
    assert mon.last_evaluation is not None and mon.last_evaluation.ratio == pytest.approx(0.5, rel=0.1)


def test_busy_engine_gets_no_probe_and_no_restart() -> None:
    decisions: list[Any] = []

    async def go() -> tuple[int, int]:
        async with baselined(decisions) as (engine, mon):
            engine.extra_running = 5  # real traffic
            engine.tokens_per_second = 100.0  # and, under that load, slower streams
            before = engine.generated
            for _ in range(5):
                await mon.tick()
            return engine.generated - before, mon.probes_skipped_busy

    probe_tokens, skipped = asyncio.run(go())
    assert probe_tokens == 0 and skipped == 5
    assert decisions == []


def test_eager_fallback_is_explained_not_restarted() -> None:
    decisions: list[Any] = []

    async def go() -> None:
        async with baselined(decisions) as (engine, mon):
            engine.eager = True  # the `eager-fallback` fault: decode_none passes grow, 1.58x slower
            engine.tokens_per_second = 400.0 / 1.58
            for _ in range(6):
                if decisions:
                    break
                await mon.tick()

    asyncio.run(go())
    assert len(decisions) == 1, decisions
    d = decisions[0][0]
    assert isinstance(d, Explained)
    assert [e.reason for e in d.reasons] == [Reason.EAGER_DECODE]
    assert "decode_none" in decisions[0][1]
