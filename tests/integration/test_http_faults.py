"""Hostile engine HTTP answers, end to end: the simulator misbehaves, the supervisor's readers and
the supervisor itself stay bounded and keep their loop.

Two tiers: every `http:ENDPOINT:MODE` against the readers the supervisor uses (fast, one simulator
per mode), then the supervisor itself (tests/supervised.py) for the verdicts: alive but not
serving, busy is not wedged, a frozen scheduler, garbage that must not crash or blame anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sglang_supervisor.commands import doctor
from sglang_supervisor.shell.checks.enginehttp import EngineAnswerError, Problem, fetch_json
from sglang_supervisor.shell.checks.probe import check_health, probe_once, read_engine_metrics, read_get_load
from sglang_supervisor.shell.engineproc.process import group_members
from supervised import TIME_SCALE, Daemon, base_config, fault_first_profile, free_port

pytestmark = pytest.mark.integration

READY_LINE = b"The server is fired up and ready to roll!"
DEADLINE_S = 60.0
ENDPOINTS = ("generate", "health", "metrics", "server_info", "model_info", "load")


@contextlib.contextmanager
def sim(tmp: Path, faults: str) -> Iterator[str]:
    port = free_port()
    err = tmp / f"sim-{port}.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.update({"SGLANG_SIM_TIME_SCALE": TIME_SCALE, "SGLANG_SIM_FAULTS": faults})
    with open(err, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_supervisor.simulator", "--model-path", "/tmp/tiny",
             "--enable-metrics", "--port", str(port)],
            stdout=out, stderr=out, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while READY_LINE not in err.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, err.read_bytes()[-2000:]
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


async def read_all(base: str) -> dict[str, Any]:
    """What each supervisor reader makes of each endpoint: a result or a typed refusal."""
    out: dict[str, Any] = {}
    async with httpx.AsyncClient() as c:
        probe = await probe_once(c, base, timeout=3.0)
        out["generate"] = probe.problem if not probe.ok else "ok"
        health = await check_health(c, base + "/health", 3.0)
        out["health"] = health.problem if not health.ok else "ok"
        for name, read in (
            ("metrics", lambda: read_engine_metrics(c, base, timeout=3.0)),
            ("server_info", lambda: fetch_json(c, base + "/server_info", deadline_s=3.0)),
            ("model_info", lambda: fetch_json(c, base + "/model_info", deadline_s=3.0)),
        ):
            try:
                await read()
                out[name] = "ok"
            except EngineAnswerError as exc:
                out[name] = exc.problem.value
        out["load"] = "ok" if await read_get_load(c, base, timeout=3.0) is not None else "none"
    return out


# What the readers conclude, per misbehaviour and endpoint. `slow` answers after 120 simulated
# seconds (2.4 s at this time scale): within the 3 s deadlines here, a timeout for /health.
EXPECTED = {
    "hang": dict.fromkeys(ENDPOINTS, "timeout") | {"load": "none"},
    "trickle": dict.fromkeys(ENDPOINTS, "timeout") | {"load": "none"},
    "huge": {"generate": "too_large", "health": "too_large", "metrics": "too_large",
             "server_info": "too_large", "model_info": "too_large", "load": "none"},
    "deep": {"generate": "too_deep", "health": "too_large", "metrics": "bad_metrics",
             "server_info": "too_deep", "model_info": "too_deep", "load": "none"},
    "garbage": {"generate": "bad_json", "health": "ok", "metrics": "bad_metrics",
                "server_info": "bad_json", "model_info": "bad_json", "load": "none"},
    "nonfinite": {"generate": "non_finite", "health": "ok", "metrics": "ok",
                  "server_info": "non_finite", "model_info": "non_finite", "load": "none"},
}


def doctor_live(base: str) -> str:
    """`doctor --url`: the problem it reports for /server_info (its first read)."""
    report = doctor.Report()
    doctor.live_report(base, report, None)
    assert report.live is not None and "error" in report.live, report.live
    return str(report.live["error"]).removeprefix("/server_info: ").split(":")[0]


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_every_endpoint_misbehaving_gives_a_typed_refusal(tmp_path: Path, mode: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "HTTP_TIMEOUT_S", 3.0)
    faults = ",".join(f"http:{e}:{mode}" for e in ENDPOINTS)
    with sim(tmp_path, faults) as base:
        got = asyncio.run(asyncio.wait_for(read_all(base), 60))
        got["doctor"] = doctor_live(base)
    assert got == EXPECTED[mode] | {"doctor": EXPECTED[mode]["server_info"]}


def test_slow_answers_end_at_the_deadline(tmp_path: Path) -> None:
    with sim(tmp_path, "http:health:slow,http:server_info:slow") as base:
        async def go() -> tuple[str | None, str]:
            async with httpx.AsyncClient() as c:
                health = await check_health(c, base + "/health", 0.5)
                try:
                    await fetch_json(c, base + "/server_info", deadline_s=0.5)
                    info = "ok"
                except EngineAnswerError as exc:
                    info = exc.problem.value
                # the same answers arrive when the deadline allows for the delay
                late = await fetch_json(c, base + "/server_info", deadline_s=30)
                assert isinstance(late, dict) and "version" in late
                return health.problem, info
        assert asyncio.run(go()) == (Problem.TIMEOUT.value, "timeout")


# ------------------------------------------------------------------ the supervisor itself


def start(daemons: list[Daemon], tmp: Path, data: dict[str, Any]) -> Daemon:
    d = Daemon(tmp, data)
    daemons.append(d)
    return d


def serving_config(tmp: Path, *faults: str, **timeouts: float) -> dict[str, Any]:
    """Periodic probes every second, so that hostile /generate answers are met while serving."""
    data = base_config(tmp, **timeouts)
    data["probe"].update({"interval_s": 1, "timeout_s": 2})
    return fault_first_profile(data, *faults) if faults else data


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def no_internal_error(d: Daemon) -> None:
    bad = [e for e in d.events if e.get("level") in ("critical",) or "Traceback" in str(e)]
    assert bad == [], bad


def test_alive_but_not_serving_is_restarted_as_a_wedge(daemons: list[Daemon], tmp_path: Path) -> None:
    """/health stays 200 while every /generate hangs: hung probes count apart from /health."""
    d = start(daemons, tmp_path, serving_config(tmp_path, "health-fine-generate-hangs@250"))
    d.notified("READY=1")
    wedged = d.event("engine.wedged")
    assert wedged["profile"] == "tuned" and "not serving" in wedged["why"]
    assert d.named("health.failed")[-1]["hung_probes"] >= 2
    retry = d.event("profile.retry_same")  # the wedge path: the same profile again, no blame yet
    assert retry["failure_class"] == "wedged"
    d.notified("READY=1", count=2)
    assert len(set(d.engine_pids())) == 2


def test_huge_generate_body_keeps_the_supervisor_bounded(daemons: list[Daemon], tmp_path: Path) -> None:
    """An endless /generate line without a newline: the probe refuses it at its cap, RSS stays flat."""
    d = start(daemons, tmp_path, serving_config(tmp_path, "http:generate:huge@250,http:metrics:huge@250"))
    d.notified("READY=1")
    d.event("probe.failed")

    def peak_until(failures: int) -> int:
        peak = 0
        deadline = time.monotonic() + 90
        while len(d.named("probe.failed")) < failures and time.monotonic() < deadline:
            peak = max(peak, rss_kib(d.proc.pid))
            time.sleep(0.02)
        assert len(d.named("probe.failed")) >= failures
        return peak

    early = peak_until(5)  # the first probes: allocator arenas grow to their working size
    late = peak_until(20)  # fifteen more refused endless bodies
    print(f"supervisor RSS under http:generate:huge + http:metrics:huge: peak {early} KiB over "
          f"probes 1-5, {late} KiB over probes 6-20")
    errors = {f["error"] for f in d.named("probe.failed")}
    assert errors == {"a line of the stream is longer than 1048576 bytes"}, errors
    assert {f["problem"] for f in d.named("probe.failed")} == {"too_large"}
    # Flat: nothing is kept per refused body (the allocator's working set settles within the
    # first probes); unbounded, one endless line would grow to gigabytes within a probe.
    assert late <= early + 48 * 1024, (early, late)
    assert late < 256 * 1024, late
    assert not d.named("engine.wedged") and len(d.engine_pids()) == 1  # refused, not hung
    no_internal_error(d)


@pytest.mark.parametrize("mode", ["garbage", "deep", "nonfinite"])
def test_garbage_answers_fail_probes_without_crash_or_restart(daemons: list[Daemon], tmp_path: Path,
                                                              mode: str) -> None:
    faults = [f"http:{e}:{mode}@250" for e in ("generate", "metrics", "load", "server_info")]
    d = start(daemons, tmp_path, serving_config(tmp_path, *faults))
    d.notified("READY=1")
    for _ in range(3):
        d.event("probe.failed", after=len(d.events))
    expected = {"garbage": "bad_json", "deep": "too_deep", "nonfinite": "non_finite"}[mode]
    assert {f["problem"] for f in d.named("probe.failed")} == {expected}
    assert not d.named("engine.wedged") and len(d.engine_pids()) == 1
    assert d.proc.poll() is None
    no_internal_error(d)


@pytest.mark.parametrize("mode", ["hang", "trickle", "huge"])
def test_health_without_a_complete_answer_is_a_wedge(daemons: list[Daemon], tmp_path: Path,
                                                     mode: str) -> None:
    """An idle engine whose /health never completes (no decode progress at all): a wedge."""
    data = serving_config(tmp_path, f"http:health:{mode}@250")
    data["probe"]["interval_s"] = 3600
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    assert d.event("engine.wedged")["profile"] == "tuned"
    d.notified("READY=1", count=2)


def test_health_hanging_while_probes_complete_is_not_a_wedge(daemons: list[Daemon], tmp_path: Path) -> None:
    """Generations complete (each probe is decode progress) while /health hangs: serving, no restart."""
    d = start(daemons, tmp_path, serving_config(tmp_path, "http:health:hang@250"))
    d.notified("READY=1")
    for _ in range(4):  # twice the health_failures limit
        d.event("health.busy", after=len(d.events))
    assert not d.named("engine.wedged") and len(d.engine_pids()) == 1


def _load(base: str, stop: threading.Event) -> None:
    """Keep the engine decoding: a few long generations at a time, until told to stop."""
    async def one(c: httpx.AsyncClient) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await c.post(base + "/generate", json={
                "text": "load", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}})

    async def go() -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            while not stop.is_set():
                await asyncio.gather(*(one(c) for _ in range(4)))
    asyncio.run(go())


def test_busy_health_is_not_wedged(daemons: list[Daemon], tmp_path: Path) -> None:
    """Under load /health answers late (SGLang #22511) while decoding goes on: no restart."""
    data = serving_config(tmp_path, "health-slow-under-load:300")
    data["probe"]["interval_s"] = 3600  # the load is the traffic here
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    base = f"http://127.0.0.1:{data['engine']['port']}"
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(base, stop), daemon=True)
    loader.start()
    try:
        for _ in range(6):  # three times the health_failures limit, all while busy
            d.event("health.busy", after=len(d.events))
    finally:
        stop.set()
        loader.join(60)
    assert not d.named("engine.wedged") and not d.named("engine.stop")
    assert len(d.engine_pids()) == 1
    assert not d.named("health.failed")


def test_frozen_scheduler_is_wedged_and_restarted(daemons: list[Daemon], tmp_path: Path) -> None:
    """SIGSTOP of the TP0 scheduler: no decode progress, /health times out: a wedge, as before."""
    data = serving_config(tmp_path)
    data["probe"]["interval_s"] = 3600
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    leader = d.engine_pids()[0]
    sched = [m.pid for m in group_members(leader) if "scheduler_TP0" in m.name]
    if not sched:  # the comm name is cut at 15 bytes: "sglang::schedul"
        sched = [m.pid for m in group_members(leader)
                 if b"scheduler_TP0" in Path(f"/proc/{m.pid}/cmdline").read_bytes()]
    assert sched, [m.name for m in group_members(leader)]
    os.kill(sched[0], signal.SIGSTOP)
    try:
        assert d.event("engine.wedged")["profile"] == "tuned"
        d.notified("READY=1", count=2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(sched[0], signal.SIGCONT)
