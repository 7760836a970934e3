"""Benchmark 5: probe accuracy against the simulator's true decode rate, and probe cost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from common import Dist, Row, Section, fmt_dist
from lifecycle import free_port

from sglang_supervisor.shell.checks.probe import make_shape, probe_once
from sglang_supervisor.shell.files.configfile import load_config
from sglang_supervisor.simulator import throughput

ROOT = Path(__file__).resolve().parent.parent


def start_sim(port: int, decode_tps: float) -> subprocess.Popen[bytes]:
    """The simulator on its own: a plain profile (CUDA graphs, no speculative decoding)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM")}
    env["SGLANG_SIM_TIME_SCALE"] = "0.01"  # startup only: token pacing is never scaled
    return subprocess.Popen(
        [sys.executable, "-m", "sglang_supervisor.simulator", "--model-path", "Qwen/Qwen3-0.6B",
         "--port", str(port), "--sim-decode-tps", str(decode_tps)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)


async def wait_ready(url: str, deadline_s: float = 120.0) -> None:
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=2) as c:
        while time.monotonic() - t0 < deadline_s:
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(url + "/health")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"simulator at {url} not healthy after {deadline_s} s")


async def delivered_rate(client: httpx.AsyncClient, url: str, seconds: float, truth: float) -> float:
    """What the simulated engine really delivers: one long stream (about `seconds`), tokens counted
    from the server's own `completion_tokens`, timed from its first to its last chunk. Independent
    of the probe code; long enough that per-chunk timing noise does not matter."""
    body = {"text": "reference " * 16, "stream": True,
            "sampling_params": {"max_new_tokens": max(64, int(truth * seconds)), "ignore_eos": True,
                                "temperature": 0.0}}
    first = last = None
    first_tokens = tokens = 0
    async with client.stream("POST", url + "/generate", json=body, timeout=seconds * 4 + 30) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            tokens = int(chunk.get("meta_info", {}).get("completion_tokens", tokens))
            now = time.perf_counter()
            if first is None:
                first, first_tokens = now, tokens
            last = now
    if first is None or last is None or last <= first:
        raise RuntimeError("the reference stream produced no timed tokens")
    return (tokens - first_tokens) / (last - first)


async def measure(url: str, runs: int, input_tokens: int, max_new_tokens: int,
                  truth: float) -> tuple[list[tuple[float, int]], float]:
    shape = make_shape(input_tokens, max_new_tokens)
    out = []
    async with httpx.AsyncClient() as client:
        delivered = await delivered_rate(client, url, 8.0, truth)
        for _ in range(runs):
            r = await probe_once(client, url, shape, None, 120.0)
            if not r.ok or r.decode_tps is None:
                raise RuntimeError(f"probe failed: {r.error}")
            out.append((r.decode_tps, (r.prompt_tokens or input_tokens) + r.completion_tokens))
    return out, delivered


def run(quick: bool) -> Section:
    cfg = load_config(str(ROOT / "etc" / "sglang-supervisor" / "qwen.yaml"))
    p = cfg.probe
    sec = Section(
        "probe", "Probe accuracy and cost",
        f"The simulator alone (`--sim-decode-tps R`, plain profile) is probed with the deployment's "
        f"probe shape ({p.input_tokens} prompt tokens, {p.max_new_tokens} new tokens, one stream). "
        "True rate: the simulator's throughput model for that profile. Error = abs(probe − true) / true "
        "per probe. Cost: tokens the probes read, per hour, at qwen.yaml's `probe.interval_s`.",
    )
    rates = (25.0, 55.0, 200.0)
    runs = 1 if quick else 10
    errors: list[float] = []
    vs_delivered: list[float] = []
    tokens: list[int] = []
    detail = []
    for rate in rates:
        truth = throughput.single_stream_tps(throughput.Profile(model_gb=1.2, base_tps=rate))
        port = free_port()
        proc = start_sim(port, rate)
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(wait_ready(url))
            got, delivered = asyncio.run(measure(url, runs, p.input_tokens, p.max_new_tokens, truth))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        errs = [abs(tps - truth) / truth for tps, _ in got]
        errors += errs
        vs_delivered += [abs(tps - delivered) / delivered for tps, _ in got]
        tokens += [n for _, n in got]
        detail.append((rate, truth, delivered, Dist.of([t for t, _ in got]), Dist.of(errs)))
    e = Dist.of(errors)
    sec.raw = {"errors": errors, "errors_vs_delivered": vs_delivered, "tokens_per_probe": tokens}
    sec.rows.append(Row("probe error, every rate (abs(probe − true) / true)", fmt_dist(e, "%", 100, 2),
                        "≤ 2 %", e.p(99) <= 0.02,
                        "" if e.p(99) <= 0.02 else
                        "compare the next row: the simulator delivers less than its own model (each "
                        "decode step's asyncio sleep overshoots), and the probe reads what is delivered"))
    ed = Dist.of(vs_delivered)
    sec.rows.append(Row("probe error against the rate the simulator really delivered",
                        fmt_dist(ed, "%", 100, 2),
                        note="the reference is one ~8 s stream timed independently"))
    for rate, truth, delivered, got, errs in detail:
        sec.rows.append(Row(f"--sim-decode-tps {rate:g}: model {truth:.1f} tok/s, delivered {delivered:.1f}",
                            f"probe {fmt_dist(got, 'tok/s', 1, 2)}",
                            note=f"error vs model p50 {100 * errs.p(50):.2f} %"))
    per_probe = Dist.of([float(t) for t in tokens]).p(50)
    per_hour = per_probe * 3600.0 / p.interval_s
    sec.rows.append(Row("probe tokens per hour", f"{per_hour:,.0f} tokens/h ({per_probe:.0f} per probe, "
                        f"one probe every {p.interval_s:.0f} s)",
                        note="plus the baseline probes after each start "
                             f"({p.baseline_runs} × {per_probe:.0f} tokens)"))
    return sec
