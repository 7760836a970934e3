"""ThroughputMonitor orchestration with scripted probes and engine metrics (no clocks, no sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from structlog.testing import capture_logs

from probe_stub import ProbeSettings, no_nvml
from sglang_supervisor.core.events import DecodeStats
from sglang_supervisor.core.regression import Explained, Reason, Remediation, RestartSame, TryNextProfile
from sglang_supervisor.shell.checks import monitor as monitor_mod
from sglang_supervisor.shell.checks.monitor import ThroughputMonitor
from sglang_supervisor.shell.checks.probe import EngineMetrics, ProbeResult
from sglang_supervisor.shell.telemetry.gpu import Nvml
from sglang_supervisor.shell.telemetry.metrics import SupervisorMetrics


@dataclass
class Stored:
    value: float


class Store:
    def __init__(self, initial: dict[str, float] | None = None):
        self.values = dict(initial or {})
        self.writes: list[tuple[str, float]] = []

    def baseline(self, key: str) -> Stored | None:
        return Stored(self.values[key]) if key in self.values else None

    def set_baseline(self, key: str, value: float, now: float) -> bool:
        self.values[key] = value
        self.writes.append((key, value))
        return True


class Engine:
    """Scripted engine: each probe returns the next rate; metrics report the given load."""

    def __init__(self, rates: list[float], running: int = 0, eager_passes: Iterator[float] | None = None,
                 stuck: bool = False):
        self.rates = list(rates)
        self.running = running
        self.eager = eager_passes
        self.probes = 0
        self.stuck = stuck  # running requests that never get a token
        self.tokens = 1000.0

    async def probe_once(self, client: Any, base_url: str, shape: Any, api_key: Any,
                         timeout: float) -> ProbeResult:
        self.probes += 1
        rate = self.rates.pop(0)
        return ProbeResult(ok=True, error=None, decode_tps=rate, ttft_s=0.01, e2e_s=0.1,
                           completion_tokens=shape.max_new_tokens, prompt_tokens=shape.input_tokens,
                           shape=shape.name)

    async def engine_metrics(self, client: Any, base_url: str, api_key: Any) -> EngineMetrics:
        eager = next(self.eager) if self.eager is not None else 0.0
        if not self.stuck:
            self.tokens += 10.0 * self.running  # a busy engine generates between two scrapes
        return EngineMetrics(self.running, 0, self.tokens, 100.0, eager, None)


def make(monkeypatch: pytest.MonkeyPatch, engine: Engine, store: Store | None = None,
         remediation: Remediation | None = None, **kw: Any,
         ) -> tuple[ThroughputMonitor, list[Any], SupervisorMetrics]:
    monkeypatch.setattr(monitor_mod, "probe_once", engine.probe_once)
    monkeypatch.setattr(monitor_mod, "engine_metrics", engine.engine_metrics)
    decisions: list[Any] = []
    metrics = SupervisorMetrics(with_gpu=False)
    mon = ThroughputMonitor(
        "http://engine", ProbeSettings(), metrics, store or Store(),
        lambda d, text: decisions.append((d, text)), baseline_key="fp/in16-out8-c1", profile="fast",
        primary="fast", remediation=remediation, nvml=Nvml(loader=no_nvml), **kw,
    )
    return mon, decisions, metrics


def ticks(mon: ThroughputMonitor, n: int) -> list[Any]:
    async def go() -> list[Any]:
        out = [await mon.tick() for _ in range(n)]
        await mon.aclose()
        return out

    return asyncio.run(go())


def test_baseline_is_collected_and_persisted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store()
    mon, decisions, metrics = make(monkeypatch, Engine([100.0, 110.0, 90.0, 100.0]), store)
    ticks(mon, 4)
    assert store.writes == [("fp/in16-out8-c1", 100.0)]
    assert mon.baseline == 100.0
    assert decisions == []
    assert metrics.baseline._value.get() == 100.0


def test_first_probe_is_one_counted_request(monkeypatch: pytest.MonkeyPatch) -> None:
    # SGLang already ran its own warmup generation before the ready line: READY waits for one
    # request of ours, and it is the first sample.
    engine = Engine([100.0])
    mon, _, _ = make(monkeypatch, engine)
    r = asyncio.run(mon.first_probe())
    assert r.decode_tps == 100.0 and mon.samples == [100.0] and engine.probes == 1


def test_busy_engine_is_never_probed_nor_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine([], running=4)
    mon, decisions, _ = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}))
    assert ticks(mon, 5) == [None] * 5
    assert engine.probes == 0 and mon.probes_skipped_busy == 5
    assert decisions == []


def test_busy_without_a_token_is_stuck_and_probed_anyway(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests counted as running while no token is generated: probe (the probe's hang feeds the
    wedge verdict), but never take its rate as a throughput sample."""
    engine = Engine([30.0, 31.0], running=4, stuck=True)
    mon, decisions, _ = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}))
    with capture_logs() as logs:
        assert ticks(mon, 3) == [None] * 3
    assert mon.probes_skipped_busy == 1  # the first busy tick has nothing to compare with
    assert engine.probes == 2
    assert mon.samples == [] and decisions == []
    assert [e["event"] for e in logs].count("probe.busy_without_progress") == 2


def test_unexplained_regression_is_confirmed_then_restarts_same(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stored baseline 100; this start: 60, 58 (median of the last 3 not yet available), 59 → suspect,
    # re-probe 57 confirms.
    engine = Engine([60.0, 58.0, 59.0, 57.0])
    mon, decisions, _ = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}))
    out = ticks(mon, 3)
    assert engine.probes == 4  # the third tick re-probed
    assert isinstance(out[2], RestartSame)
    assert decisions and isinstance(decisions[-1][0], RestartSame)
    assert "restarting the same profile" in decisions[-1][1]
    assert mon.remediation.stage == "restarted_same"
    assert mon._stopped.is_set()  # this engine run is over; the supervisor restarts it
    assert mon.baseline == 100.0  # a slow start never lowers the stored baseline


def test_eager_decode_explains_instead_of_restarting(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine([60.0, 58.0, 59.0, 57.0], eager_passes=iter([0.0, 0.0, 0.0, 0.0, 0.0, 40.0, 40.0, 40.0]))
    mon, decisions, metrics = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}))
    mon.feed(DecodeStats(line_no=1, rank=None, running_req=1, queue_req=0, gen_throughput=60.0,
                         cuda_graph=False, accept_len=None))
    ticks(mon, 3)
    assert len(decisions) == 1
    d = decisions[0][0]
    assert isinstance(d, Explained)
    assert Reason.EAGER_DECODE in {e.reason for e in d.reasons}
    assert "without CUDA graphs" in decisions[0][1]
    assert metrics.explained.labels("eager_decode")._value.get() == 1
    assert not mon._stopped.is_set()


def test_still_regressed_after_restart_moves_down_the_ladder(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine([60.0, 58.0, 59.0, 57.0])
    state = Remediation("restarted_same", "fast", 59.0)
    mon, decisions, _ = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}), remediation=state)
    ticks(mon, 3)
    assert isinstance(decisions[-1][0], TryNextProfile)
    assert mon.remediation.stage == "trying_next"


def test_run_stops_on_a_terminal_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine([60.0, 58.0, 59.0, 57.0])
    mon, decisions, _ = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}))
    asyncio.run(asyncio.wait_for(mon.run(), 30))
    assert isinstance(decisions[-1][0], RestartSame)
    assert mon.status()["remediation"] == "restarted_same"


def test_passive_throughput_from_decode_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    mon, _, metrics = make(monkeypatch, Engine([]))
    mon.feed(DecodeStats(line_no=1, rank="TP0", running_req=8, queue_req=0, gen_throughput=3900.0,
                         cuda_graph=True, accept_len=None))
    assert metrics.passive._value.get() == 3900.0
    assert mon.decode_cuda_graph is True


def test_periodic_probes_and_passive_rates_reach_the_callbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine([100.0, 101.0])
    probes: list[ProbeResult] = []
    mon, _, _ = make(monkeypatch, engine, on_probe=probes.append)
    asyncio.run(mon.first_probe())  # the READY gate reports its result itself
    assert probes == []
    ticks(mon, 1)
    assert [p.decode_tps for p in probes] == [101.0]

    class Busy(Engine):
        tokens = 0.0

        async def engine_metrics(self, client: Any, base_url: str, api_key: Any) -> EngineMetrics:
            self.tokens += 500.0
            return EngineMetrics(self.running, 0, self.tokens, 100.0, 0.0, None)

    busy = Busy([], running=2)
    rates: list[float] = []
    mon, _, metrics = make(monkeypatch, busy, on_passive_tps=rates.append)
    ticks(mon, 3)
    assert rates and all(r > 0 for r in rates)
    assert metrics.passive._value.get() == rates[-1]
    assert busy.probes == 0


def test_a_timed_out_probe_is_reported_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    async def hung(client: Any, base_url: str, shape: Any, api_key: Any, timeout: float) -> ProbeResult:
        return ProbeResult(ok=False, error="no complete answer within 5 s", timed_out=True)

    probes: list[ProbeResult] = []
    mon, decisions, _ = make(monkeypatch, Engine([]), on_probe=probes.append)
    monkeypatch.setattr(monitor_mod, "probe_once", hung)
    assert ticks(mon, 1) == [None]
    assert [p.timed_out for p in probes] == [True]
    assert mon.consecutive_failures == 1 and decisions == []


class LogOnly(Engine):
    """No /metrics (no --enable-metrics): decode mode shows only in `Decode batch` log lines, which
    the supervisor feeds in. `line` is what the engine logs during a probe long enough to reach
    its decode log interval (None: nothing)."""

    def __init__(self, rates: list[float], line: bool | None):
        super().__init__(rates)
        self.line = line
        self.evidence_shapes: list[int] = []
        self.monitor: ThroughputMonitor | None = None

    async def probe_once(self, client: Any, base_url: str, shape: Any, api_key: Any,
                         timeout: float) -> ProbeResult:
        if shape.max_new_tokens <= 8:
            return await super().probe_once(client, base_url, shape, api_key, timeout)
        self.evidence_shapes.append(shape.max_new_tokens)
        if self.line is not None and self.monitor is not None:
            self.monitor.feed(DecodeStats(line_no=9, rank="TP0", running_req=1, queue_req=0,
                                          gen_throughput=30.0, cuda_graph=self.line, accept_len=None))
        return ProbeResult(ok=True, error=None, decode_tps=30.0, e2e_s=2.0,
                           completion_tokens=shape.max_new_tokens, prompt_tokens=16)

    async def engine_metrics(self, client: Any, base_url: str, api_key: Any) -> None:
        return None


def test_eager_decode_seen_only_in_the_log_is_explained_before_any_restart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Before the fault the engine logged graph decode; short probes then never reach the next
    # Decode line, so the monitor spends one longer probe to get one instead of restarting.
    engine = LogOnly([60.0, 58.0, 59.0, 57.0], line=False)
    mon, decisions, metrics = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}),
                                   decode_log_interval=40)
    engine.monitor = mon
    mon.feed(DecodeStats(line_no=1, rank="TP0", running_req=1, queue_req=0, gen_throughput=100.0,
                         cuda_graph=True, accept_len=None))
    ticks(mon, 3)
    assert engine.evidence_shapes == [82]  # 40 steps x 1 token x 2 + 2
    assert [type(d) for d, _ in decisions] == [Explained]
    assert [e.reason for e in decisions[0][0].reasons] == [Reason.EAGER_DECODE]
    assert mon.samples == [60.0, 58.0, 59.0, 57.0]  # the evidence probe is not a sample
    assert metrics.probe_tokens._value.get() == 4 * (8 + 16) + 82 + 16
    assert not mon._stopped.is_set()


def test_no_decode_line_even_after_the_evidence_probe_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor_mod, "DECODE_EVIDENCE_WAIT_S", 0.0)
    engine = LogOnly([60.0, 58.0, 59.0, 57.0], line=None)
    mon, decisions, _ = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}))
    ticks(mon, 3)
    assert len(engine.evidence_shapes) == 1
    assert [type(d) for d, _ in decisions] == [RestartSame]


def test_graph_decode_in_the_log_confirms_an_unexplained_regression(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = LogOnly([60.0, 58.0, 59.0, 57.0], line=True)
    mon, decisions, _ = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}))
    engine.monitor = mon
    ticks(mon, 3)
    assert len(engine.evidence_shapes) == 1
    assert [type(d) for d, _ in decisions] == [RestartSame]


def test_a_probe_broken_by_our_own_stop_is_no_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor stops the monitor, then the engine: the probe in flight loses its connection
    (httpx ReadError). That is our doing: no warning, no failure count, no metric, no callback."""
    probes: list[ProbeResult] = []
    mon, decisions, metrics = make(monkeypatch, Engine([]), on_probe=probes.append)

    async def broken_by_stop(client: Any, base_url: str, shape: Any, api_key: Any,
                             timeout: float) -> ProbeResult:
        mon.stop()  # what the supervisor does before it signals the engine
        return ProbeResult(ok=False, error="ReadError: ")

    monkeypatch.setattr(monitor_mod, "probe_once", broken_by_stop)
    with capture_logs() as logs:
        assert ticks(mon, 1) == [None]
        asyncio.run(mon.first_probe())  # the READY gate's probe alike
    assert not [e for e in logs if e["log_level"] in ("warning", "error")]
    assert probes == [] and decisions == [] and mon.consecutive_failures == 0
    assert metrics.probe_runs.labels("failed")._value.get() == 0


def test_an_explained_slowdown_is_logged_once_then_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    # Measured on the H200 (2026-12-01): a foreign matmul loop held decode at 46 % for a minute and
    # `probe.regression_suspected` was logged every window. Here eager decode explains the slowdown
    # for three windows; then the rate is back.
    import itertools

    engine = Engine([60.0, 58.0, 59.0, 57.0, 56.0, 55.0, 57.0, 56.0, 100.0, 100.0],
                    eager_passes=(float(n) for n in itertools.count(0, 40)))
    mon, decisions, metrics = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}))
    with capture_logs() as logs:
        out = ticks(mon, 6)
    assert [type(d).__name__ for d in out] == ["NoAction", "NoAction", "Explained", "Explained", "Explained",
                                               "NoAction"]
    assert len(decisions) == 1 and isinstance(decisions[0][0], Explained)  # acted on (reported) once
    suspected = [e["log_level"] for e in logs if e["event"] == "probe.regression_suspected"]
    assert suspected == ["info", "debug", "debug", "debug"]
    assert [e["event"] for e in logs if e["event"] in ("throughput.decision", "throughput.recovered")] == [
        "throughput.decision", "throughput.recovered"]
    end = next(e for e in logs if e["event"] == "throughput.recovered")
    assert end["explained_by"] == ["eager_decode"] and end["median_tps"] == 100.0
    assert metrics.explained.labels("eager_decode")._value.get() == 0


def test_an_unexplained_episode_has_no_recovery_line(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine([100.0, 101.0, 99.0])
    mon, _, _ = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}))
    with capture_logs() as logs:
        ticks(mon, 3)
    assert not [e for e in logs if e["event"] in ("throughput.recovered", "probe.regression_suspected")]


def test_run_waits_an_interval_after_readys_probe_before_probing_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """READY's probe was the first sample; run() starts with the first user traffic and must not
    send another at once. Stopped before its interval is up, it sent none."""
    engine = Engine([100.0, 100.0])
    mon, _, metrics = make(monkeypatch, engine, Store({"fp/in16-out8-c1": 100.0}))
    mon.settings = ProbeSettings(interval_s=3600.0, baseline_runs=1)  # no 1 s baseline cadence

    async def go() -> None:
        await mon.first_probe()
        task = asyncio.ensure_future(mon.run())
        for _ in range(200):  # let run() go as far as it goes without the clock moving
            await asyncio.sleep(0)
        mon.stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(go())
    assert engine.probes == 1
    # READY's probe is still judged: /status and /metrics have its ratio without a second request
    assert mon.last_evaluation is not None and mon.last_evaluation.ratio == pytest.approx(1.0)
    assert metrics.ratio._value.get() == pytest.approx(1.0)
