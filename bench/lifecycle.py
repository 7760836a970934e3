"""Benchmarks 2, 3 and 6: READY latency, crash -> respawn, hang detection, stop latency.

Each run starts the real `sglang-supervisor run` (JSON log on stdout, a NOTIFY_SOCKET we own) over
the simulator, with the engine command wrapped by stamp_engine.py so the moments that happen
inside the engine (ready line written, crash, last output) are stamped where they happen.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from common import Dist, Row, Section, fmt_dist

from sglang_supervisor.shell.engineproc.process import group_members
from sglang_supervisor.shell.files.configfile import default_demo_config_path

HERE = Path(__file__).resolve().parent
TIME_SCALE = "0.02"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_config(work: Path, engine_faults: str = "", **timeouts: float) -> dict[str, Any]:
    data = copy.deepcopy(yaml.safe_load(default_demo_config_path().read_text()))
    eng = data["engine"]
    eng["port"] = free_port()
    eng["log_file"] = str(work / "engine.log")
    eng["command"] = [sys.executable, str(HERE / "stamp_engine.py"), *eng["command"]]
    eng.setdefault("env", {})["SGLANG_SIM_TIME_SCALE"] = TIME_SCALE
    eng["env"]["BENCH_STAMPS"] = str(work / "stamps")
    if engine_faults:
        eng["env"]["SGLANG_SIM_FAULTS"] = engine_faults
    data["state_dir"] = str(work / "state")
    data["runtime_dir"] = str(work / "run")
    data["metrics"] = {"enabled": False}
    data["probe"].update({"input_tokens": 16, "max_new_tokens": 8, "interval_s": 3600,
                          "timeout_s": 10, "baseline_runs": 1})
    data["timeouts"].update({"stall_s": 10, "start_s": 120, "ready_probe_s": 20, "drain_s": 10,
                             "kill_s": 5, "gpu_release_s": 0, "health_interval_s": 1,
                             "health_timeout_s": 2, "health_failures": 2, **timeouts})
    # Respawn latency is the supervisor's own reaction: the configured pause is excluded.
    # 100 is the most the configuration allows; one run restarts at most --starts (50) times.
    data["restart"].update({"backoff_s": 0.0, "same_profile_retries": 100})
    return data


class BenchDaemon:
    def __init__(self, work: Path, data: dict[str, Any]) -> None:
        self.work = work
        (work / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        self.sock_dir = Path(tempfile.mkdtemp(prefix="bn-", dir="/tmp"))
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.sock_dir / "n"))
        self.sock.settimeout(0.2)
        self.notes: list[tuple[int, str]] = []  # (monotonic_ns at receipt, message line)
        self.events: list[dict[str, Any]] = []
        self.cv = threading.Condition()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM")}
        env["NOTIFY_SOCKET"] = str(self.sock_dir / "n")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_supervisor", "run", "--config", str(work / "config.yaml"),
             "--log-format", "json"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        for target in (self._read_notify, self._read_log):
            threading.Thread(target=target, daemon=True).start()

    def _read_notify(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                if self.proc.poll() is not None:
                    return
                continue
            except OSError:
                return
            now = time.monotonic_ns()
            with self.cv:
                self.notes.extend((now, line) for line in data.decode().splitlines())
                self.cv.notify_all()

    def _read_log(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict):
                    with self.cv:
                        self.events.append(rec)
                        self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def wait(self, pred: Any, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                got = pred()
                if got:
                    return got
                if time.monotonic() > deadline:
                    raise TimeoutError(f"benchmark daemon stuck; last events: {self.events[-5:]}")
                if self.proc.poll() is not None and not pred():
                    raise RuntimeError(f"daemon exited {self.proc.returncode}; last: {self.events[-5:]}")
                self.cv.wait(0.1)

    def note_time(self, text: str) -> int:
        return int(self.wait(lambda: next((t for t, n in self.notes if n == text), None)))

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.cv:
            return [e for e in self.events if e.get("event") == name]

    def stamps(self) -> list[list[str]]:
        path = self.work / "stamps"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for e in self.named("engine.spawned"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(e["pid"]), signal.SIGKILL)
        self.sock.close()
        shutil.rmtree(self.sock_dir, ignore_errors=True)


def ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def stop_and_time(d: BenchDaemon) -> float:
    """SIGTERM -> every engine process gone (polled every millisecond)."""
    pgids = [int(e["pid"]) for e in d.named("engine.spawned")]
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    while any(group_members(p) for p in pgids):
        time.sleep(0.001)
        if time.monotonic() - t0 > 60:
            raise TimeoutError("engine processes still there 60 s after SIGTERM")
    elapsed = time.monotonic() - t0
    d.proc.wait(60)
    return elapsed


def busy_load(url: str, stop: threading.Event) -> None:
    import httpx

    body = {"text": "hello " * 32, "sampling_params": {"max_new_tokens": 512, "ignore_eos": True},
            "stream": True}
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            # A request in flight runs to its end: SIGTERM must drain it, not see it aborted.
            with contextlib.suppress(httpx.HTTPError), client.stream(
                    "POST", url + "/generate", json=body) as r:
                for _ in r.iter_bytes():
                    pass


def ready_and_stop(n: int, busy: int) -> tuple[dict[str, list[float]], list[float], list[float]]:
    ready: dict[str, list[float]] = {"total": [], "parse": [], "probe": [], "notify": []}
    idle_stop: list[float] = []
    busy_stop: list[float] = []
    for i in range(n + busy):
        with tempfile.TemporaryDirectory(prefix="bench-life-") as tmp:
            work = Path(tmp)
            data = bench_config(work)
            # A fast engine: the first probe (8 tokens), which READY waits for, costs ~2 ms of decode.
            data["engine"]["env"]["SGLANG_SIM_DECODE_TPS"] = "5000"
            d = BenchDaemon(work, data)
            try:
                t_ready = d.note_time("READY=1")
                line = d.wait(lambda d=d: next((s for s in d.stamps() if s[0] == "ready"), None))
                wall_written, mono_written = int(line[1]) / 1e9, int(line[2])
                total = (t_ready - mono_written) / 1e9
                engine_ready = ts(d.wait(lambda d=d: (d.named("engine.ready") or [None])[0]))
                sup_ready = ts(d.wait(lambda d=d: (d.named("supervisor.ready") or [None])[0]))
                ready["total"].append(total)
                ready["parse"].append(engine_ready - wall_written)
                ready["probe"].append(sup_ready - engine_ready)
                ready["notify"].append(wall_written + total - sup_ready)
                if i < n:
                    idle_stop.append(stop_and_time(d))
                else:
                    stop = threading.Event()
                    url = f"http://127.0.0.1:{data['engine']['port']}"
                    loaders = [threading.Thread(target=busy_load, args=(url, stop), daemon=True)
                               for _ in range(4)]
                    for t in loaders:
                        t.start()
                    time.sleep(1.0)  # requests in flight
                    stop.set()  # clients send nothing new; the 4 in flight must be drained
                    busy_stop.append(stop_and_time(d))
            finally:
                d.close()
    return ready, idle_stop, busy_stop


def respawns(n: int) -> list[float]:
    """Engine crash (stamped by the wrapper when the engine process ended) -> engine.spawned."""
    out: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-crash-") as tmp:
        work = Path(tmp)
        # 20 simulated s = 0.4 s after the engine's ready line: after READY=1 (which waits for the
        # first probe), so each crash is a crash after ready and the same profile is restarted.
        d = BenchDaemon(work, bench_config(work, engine_faults="crash@20"))
        try:
            d.wait(lambda: len(d.named("engine.spawned")) >= n + 1, timeout=60 + 20 * n)
            exits = [int(s[1]) / 1e9 for s in d.stamps() if s[0] == "exit"]
            spawned = [ts(e) for e in d.named("engine.spawned")]
            for t_exit in exits:
                nxt = [t for t in spawned if t >= t_exit]
                if nxt:
                    out.append(min(nxt) - t_exit)
        finally:
            d.close()
    return out[:n]


def hangs(n: int, stall_s: float) -> list[float]:
    """Last engine output -> engine.hang verdict, in units of the configured stall timeout."""
    ratios: list[float] = []
    while len(ratios) < n:
        with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
            work = Path(tmp)
            d = BenchDaemon(work, bench_config(work, engine_faults="hang:capture", stall_s=stall_s))
            try:
                # Every profile with graphs hangs; the last one (eager, no capture) comes up.
                d.wait(lambda d=d: d.named("supervisor.ready") or d.named("supervisor.exit"),
                       timeout=60 + 10 * stall_s)
                outs = [int(s[1]) / 1e9 for s in d.stamps() if s[0] == "out"]
                for ev in d.named("engine.hang"):
                    t_hang = ts(ev)
                    last = max(t for t in outs if t <= t_hang)
                    ratios.append((t_hang - last) / stall_s)
            finally:
                d.close()
    return ratios[:n]


def run(key: str, quick: bool, starts: int) -> Section:
    if key == "ready":
        sec = Section("ready", "READY latency and stop latency",
                      f"{starts} + {max(3, starts // 5)} separate `sglang-supervisor run` starts over the "
                      f"simulator (SGLANG_SIM_TIME_SCALE={TIME_SCALE}). READY latency: the wrapper stamps "
                      "the moment the chunk with SGLang's ready line was written into the supervisor's "
                      "pipe (CLOCK_MONOTONIC); the benchmark stamps READY=1 arriving on its notify socket. "
                      "It includes the supervisor's first probe request (16 in / 8 out tokens), which "
                      "READY waits for by design; the simulated engine decodes at 5000 tok/s here so that "
                      "the figure is the supervisor's own latency (a real engine adds "
                      "max_new_tokens / tok/s to it). The rows marked … split it with the JSON log's "
                      "timestamps. Stop latency: SIGTERM to the supervisor → no process of "
                      "the engine's group left (polled every ms); busy = 4 streaming requests in flight.")
        busy = max(3, starts // 5)
        ready, idle_stop, busy_stop = ready_and_stop(starts, busy)
        r = Dist.of(ready["total"])
        sec.raw = {"ready_s": ready, "idle_stop_s": idle_stop, "busy_stop_s": busy_stop}
        sec.rows.append(Row("ready line → READY=1", fmt_dist(r, "ms", 1e3), "p99 ≤ 50 ms", r.p(99) <= 0.050,
                            "READY waits for the first probe by design: one streaming generation, most of "
                            "it the simulated engine's own prefill and decode time; see the split below"))
        for key_, label in (("parse", "… ready line → `engine.ready` (pipe, parser, event loop)"),
                            ("probe", "… `engine.ready` → `supervisor.ready` (first probe, state write)"),
                            ("notify", "… `supervisor.ready` → READY=1 received")):
            sec.rows.append(Row(label, fmt_dist(Dist.of(ready[key_]), "ms", 1e3)))
        sec.rows.append(Row("stop, idle engine", fmt_dist(Dist.of(idle_stop), "ms", 1e3)))
        sec.rows.append(Row("stop, busy engine", fmt_dist(Dist.of(busy_stop), "ms", 1e3),
                            note="SGLang finishes the in-flight requests (512 new tokens each) before it "
                                 "exits; bounded by timeouts.drain_s (10 s here), then SIGKILL"))
        return sec
    if key == "respawn":
        sec = Section("respawn", "Crash → respawn",
                      "One supervisor; the engine (every profile) is SIGKILLed 20 simulated s (0.4 s) after "
                      "each ready (`crash@20`). Measured: the wrapper's stamp when the engine process "
                      "ended → the supervisor's `engine.spawned` log event (both wall clock, µs). The "
                      "configured `restart.backoff_s` is 0 and NVML is absent, so the GPU-release wait "
                      "is excluded.")
        samples = respawns(starts)
        d = Dist.of(samples)
        sec.raw = {"respawn_s": samples}
        sec.rows.append(Row("engine exit → new engine spawned", fmt_dist(d, "ms", 1e3), "p99 ≤ 1 s",
                            d.p(99) <= 1.0))
        return sec
    if key == "hang":
        stall = 2.0
        n = 3 if quick else 15
        sec = Section("hang", "Hang detection",
                      f"The engine stops writing during CUDA graph capture (`hang:capture`) on every "
                      f"profile; `timeouts.stall_s` = {stall} s. Measured: the wrapper's stamp of the last "
                      f"engine output → the supervisor's `engine.hang` event, divided by stall_s.")
        samples = hangs(n, stall)
        d = Dist.of(samples)
        sec.raw = {"ratio": samples}
        sec.rows.append(Row("detection / stall timeout", fmt_dist(d, "×", 1, 3), "≈ 1.0 (never early)",
                            d.min >= 1.0 and d.p(99) <= 1.5,
                            "the verdict can only come after stall_s; the excess is timer granularity"))
        return sec
    if key == "stop":
        return Section("stop", "Stop latency", "Measured together with READY latency (see above).",
                       rows=[Row("see READY latency and stop latency", "")])
    raise ValueError(key)
