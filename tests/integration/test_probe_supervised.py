"""Throughput probing inside `sglang-supervisor run` over the simulator (issue 4), seen the way an
operator sees it: the daemon's JSON log, its `/status` and `/metrics`, and a real Prometheus.

- a `degrade:` fault: the regression is detected, confirmed, restarted once on the same profile,
  then the next profile is tried and the faster one kept;
- a busy engine (a client keeps a request running): no probe and no restart, passive tok/s instead;
- an `eager-fallback` fault: explained as eager decode, not restarted;
- `promtool check metrics` on the live endpoint, and Prometheus reading tok/s and state back.

The daemon harness (config from the packaged demo, notify socket, JSON log) is CORE's
(tests/integration/test_supervisor.py); deadlines are generous, nothing here is a timing threshold.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from integration import test_supervisor as harness
from prometheus_server import prometheus, query
from tiers import apt_fix, require

pytestmark = pytest.mark.integration

Daemon = harness.Daemon
workdir = harness.workdir  # fixture

DEADLINE_S = harness.DEADLINE_S


def probing_config(workdir: Path, *faults: str, interval_s: float) -> dict[str, Any]:
    """The harness's quick demo config with the metrics endpoint on a free port and probing on.

    Window 2 and one baseline probe keep the scenarios short: with a halved rate the median of
    (baseline-rate, half-rate) is 0.75 of the baseline, below the 0.85 threshold."""
    data = harness.base_config(workdir)
    data["metrics"] = {"enabled": True, "address": "127.0.0.1:0"}
    data["probe"].update({"interval_s": interval_s, "baseline_runs": 1, "regression_window": 2,
                          "cooldown_s": 3600})
    if faults:
        harness.fault_first_profile(data, *faults)
    return data


class Endpoint:
    """The daemon's metrics endpoint (its URL comes from the `metrics.listening` log event)."""

    def __init__(self, d: Daemon) -> None:
        self.url = str(d.event("metrics.listening")["url"])
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = self.http.get("/status").json()
        return body

    def text(self) -> str:
        return self.http.get("/metrics").text

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        out = {}
        for family in text_string_to_metric_families(self.text()):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples().get((name, frozenset(labels.items())))

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def endpoints() -> Iterator[list[Endpoint]]:
    opened: list[Endpoint] = []
    yield opened
    for e in opened:
        e.close()


def endpoint(endpoints: list[Endpoint], d: Daemon) -> Endpoint:
    e = Endpoint(d)
    endpoints.append(e)
    return e


def wait_until(what: str, d: Daemon, pred: Callable[[], Any], timeout: float = DEADLINE_S) -> Any:
    """Poll `pred` (HTTP reads) until it is truthy; fail with the daemon's log tail."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline or d.proc.poll() is not None:
            pytest.fail(f"timed out waiting for {what}; daemon rc={d.proc.poll()}\n" + "\n".join(d.raw[-40:]))
        time.sleep(0.1)


def event(d: Daemon, name: str, **fields: Any) -> dict[str, Any]:
    """`Daemon.event`, but a timeout shows the supervisor's own events (not the engine's output),
    which is where a probing scenario that went another way can be read."""
    try:
        return d.event(name, **fields)
    except pytest.fail.Exception:
        ours = [e for e in d.events if e.get("event") != "engine.output"
                and not str(e.get("event", "")).startswith(("engine.capture", "engine.weights"))]
        pytest.fail(f"no {name} {fields}; the supervisor's events:\n"
                    + "\n".join(json.dumps(e) for e in ours[-60:]))


def decisions(d: Daemon, event: str = "throughput.decision") -> list[str]:
    return [str(e["decision"]) for e in d.named(event)]


class Traffic:
    """A client that keeps one long streaming generation running on the engine until stopped."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.tokens = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        body = {"text": "a user's long request " * 8, "stream": True,
                "sampling_params": {"max_new_tokens": 100_000, "ignore_eos": True}}
        with httpx.Client(timeout=httpx.Timeout(60, connect=10)) as c:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError), c.stream("POST", self.base_url + "/generate",
                                                                    json=body) as resp:
                    for line in resp.iter_lines():
                        if line.startswith("data:"):
                            self.tokens += 1
                        if self._stop.is_set():
                            break  # closing the stream aborts the request on the engine

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


# ------------------------------------------------------------------------------------ tests

def test_degrade_restarts_same_profile_once_then_keeps_the_faster_next(daemons, workdir, endpoints) -> None:
    # Halved 3 s (150 simulated s at scale 0.02) after each start of `tuned`: the READY probe is
    # the baseline; later probes are slow on the first start and again soon after the
    # same-profile restart (one restart per cool-down). The next profile (no fault) then probes
    # faster and is kept.
    d = harness.start(daemons, workdir, probing_config(workdir, "degrade:0.5@150", interval_s=1))
    ep = endpoint(endpoints, d)

    first = event(d, "throughput.decision", decision="restart_same")
    assert first["ratio"] < 0.85
    restart = event(d, "regression.decision", decision="restart_same")
    assert restart["profile"] == "tuned" and "regression" in restart["reason"]
    # The same profile again, and /status says where the remediation stands.
    d.wait_for("the second READY", lambda: len(d.named("supervisor.ready")) >= 2)
    assert [e["profile"] for e in d.named("engine.launch")] == ["tuned", "tuned"]
    second = wait_until("/status of the restarted engine", d, lambda: (
        s if (s := ep.status())["throughput"] and s["profile"] == "tuned" else None))
    assert second["throughput"]["remediation"] == "restarted_same"
    assert ep.value("sglang_supervisor_regression_decisions_total", decision="restart_same") == 1

    event(d, "throughput.decision", decision="try_next_profile")
    nxt = event(d, "regression.decision", decision="next_profile")
    assert nxt["profile"] == "tuned"
    keep = event(d, "throughput.decision", decision="keep_faster")
    assert "no-prefill-graph" in keep["detail"]
    assert [e["profile"] for e in d.named("engine.launch")] == ["tuned", "tuned", "no-prefill-graph"]

    status = ep.status()
    assert status["profile"] == "no-prefill-graph" and status["ready"] is True
    assert status["throughput"]["remediation"] == "settled"
    assert [a["profile"] for a in status["attempts"]] == ["tuned", "tuned", "no-prefill-graph"]
    m = ep.samples()
    for name, count in (("restart_same", 1), ("try_next_profile", 1), ("keep_faster", 1)):
        assert m[("sglang_supervisor_regression_decisions_total", frozenset({("decision", name)}))] == count
    info = [labels for (n, labels), v in m.items() if n == "sglang_supervisor_active_profile_info" and v == 1]
    assert [dict(lv)["profile"] for lv in info] == ["no-prefill-graph"]
    assert m[("sglang_supervisor_fallback_level", frozenset())] == 1
    # both throughput restarts are restarts; none of them is a crash
    assert m[("sglang_supervisor_restarts_total", frozenset({("reason", "regression")}))] == 2
    assert sum(v for (n, _), v in m.items() if n == "sglang_supervisor_restarts_total") == 2
    # a probe cut short by our own stop of the engine is no failure
    assert not d.named("probe.failed") and not d.named("probe.retry")
    assert d.named("supervisor.ready")[-1]["profile"] == "no-prefill-graph"
    harness.stop_cleanly(d)


def test_busy_engine_gets_no_probe_and_no_restart(daemons, workdir, endpoints) -> None:
    # Halved 3 s after ready, by when a client keeps the engine busy: a probe would see the
    # slowdown, but busy is not slow and a probe would only compete with the user's request.
    data = probing_config(workdir, "degrade:0.5@150", interval_s=0.3)
    d = harness.start(daemons, workdir, data)
    ep = endpoint(endpoints, d)
    d.notified("READY=1")
    engine_url = f"http://127.0.0.1:{data['engine']['port']}"
    traffic = Traffic(engine_url)
    try:
        wait_until("the client's request to stream", d, lambda: traffic.tokens > 2)
        skipped0 = wait_until("a tick that sees the engine busy", d, lambda: (
            ep.status()["throughput"]["probes_skipped_busy"]))
        probes0 = ep.value("sglang_supervisor_probe_runs_total", result="ok")
        wait_until("ten busy ticks", d,
                   lambda: ep.status()["throughput"]["probes_skipped_busy"] >= skipped0 + 10)
        assert ep.value("sglang_supervisor_probe_runs_total", result="ok") == probes0
        assert ep.value("sglang_supervisor_probe_runs_total", result="failed") == 0
        passive = ep.value("sglang_supervisor_passive_output_tokens_per_second")
        assert passive is not None and passive > 0
        assert decisions(d) == [] and decisions(d, "regression.decision") == []
        assert len(d.named("engine.spawned")) == 1 and ep.status()["ready"] is True
    finally:
        traffic.stop()
    # Idle again: probing resumes (the skips were the load, not a dead monitor).
    wait_until("a probe after the traffic ended", d, lambda: (
        (ep.value("sglang_supervisor_probe_runs_total", result="ok") or 0) > (probes0 or 0)))
    harness.stop_cleanly(d)


def test_eager_fallback_is_explained_not_restarted(daemons, workdir, endpoints) -> None:
    d = harness.start(daemons, workdir, probing_config(workdir, "eager-fallback@50", interval_s=0.5))
    ep = endpoint(endpoints, d)
    explained = event(d, "throughput.decision", decision="explained")
    assert "CUDA graph" in explained["detail"] and explained["ratio"] < 0.85
    assert ep.value("sglang_supervisor_slowdown_explanation", reason="eager_decode") == 1
    assert (ep.value("sglang_supervisor_regression_decisions_total", decision="explained") or 0) >= 1
    # Later probes stay slow and stay explained: still the first engine, no restart decided.
    probes = ep.value("sglang_supervisor_probe_runs_total", result="ok") or 0
    wait_until("three more probes", d, lambda: (
        (ep.value("sglang_supervisor_probe_runs_total", result="ok") or 0) >= probes + 3))
    assert set(decisions(d)) == {"explained"}
    assert set(decisions(d, "regression.decision")) <= {"keep"}
    assert len(d.named("engine.spawned")) == 1 and not d.named("engine.stopped")
    assert ep.value("sglang_supervisor_slowdown_explanation", reason="eager_decode") == 1
    harness.stop_cleanly(d)


def test_throughput_ratio_in_metrics_is_the_one_in_status(daemons, workdir, endpoints) -> None:
    # One baseline probe, then an hour until the next: /status and /metrics must both say the
    # first evaluation's ratio (the gauge stayed NaN while /status said 1.0).
    d = harness.start(daemons, workdir, probing_config(workdir, interval_s=3600))
    ep = endpoint(endpoints, d)
    d.notified("READY=1")
    ratio = wait_until("a ratio in /status", d, lambda: ep.status()["throughput"]["ratio"])
    assert ep.value("sglang_supervisor_throughput_ratio") == pytest.approx(ratio)
    # What `sglang-supervisor status` reads besides: this start's way back and the engine's GPUs
    # (none held here: the simulator takes no GPU memory).
    doc = ep.status()
    assert doc["way_back"] == {"last_good": None, "probation": None, "backoff": {}, "retry_at": {}}
    assert doc["gpus"] in (None, [])
    harness.stop_cleanly(d)


def test_promtool_check_metrics_is_clean_on_the_live_endpoint(daemons, workdir, endpoints) -> None:
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool not installed", apt_fix("prometheus"))
    assert promtool is not None
    d = harness.start(daemons, workdir, probing_config(workdir, interval_s=0.5))
    ep = endpoint(endpoints, d)
    d.notified("READY=1")
    wait_until("a baseline", d, lambda: ep.status()["throughput"]["baseline_tps"])
    text = ep.text()
    for family in ("sglang_supervisor_probe_output_tokens_per_second", "sglang_supervisor_state",
                   "sglang_supervisor_start_attempts_total", "sglang_supervisor_capture_seconds"):
        assert f"\n{family}" in text
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        proc.stdout + proc.stderr)
    harness.stop_cleanly(d)


def test_prometheus_scrapes_the_supervisor_over_the_simulator(daemons, workdir, endpoints) -> None:
    d = harness.start(daemons, workdir, probing_config(workdir, interval_s=0.5))
    ep = endpoint(endpoints, d)
    d.notified("READY=1")
    target = ep.url.removeprefix("http://")
    with prometheus(workdir, [target]) as prom, httpx.Client(base_url=prom.url, timeout=5) as c:
        def scraped() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
            prom.check_alive()
            try:
                tps = query(c, "sglang_supervisor_probe_output_tokens_per_second > 0")
                # The ready probe's tok/s is exported a loop turn before the state turns ready:
                # a scrape in between holds both, so wait for the state itself.
                state = query(c, 'sglang_supervisor_state{sglang_supervisor_state="ready"} == 1')
            except (httpx.HTTPError, ValueError):  # not up yet: refused, or 503 while the TSDB opens
                return None
            return (tps, state) if tps and state else None

        tps, state = wait_until("Prometheus to hold the probe tok/s and the state", d, scraped)
        profile = query(c, "sglang_supervisor_active_profile_info")
    local = ep.value("sglang_supervisor_probe_output_tokens_per_second")
    ready_tps = d.event("supervisor.ready")["tok_s"]
    assert local is not None and float(tps[0]["value"][1]) == pytest.approx(local, rel=0.5)
    assert float(tps[0]["value"][1]) == pytest.approx(ready_tps, rel=0.5)
    assert [s["metric"]["sglang_supervisor_state"] for s in state] == ["ready"]
    assert [s["metric"]["profile"] for s in profile] == ["tuned"]
    harness.stop_cleanly(d)
