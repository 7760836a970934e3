"""Fleet scenario: two supervised simulators behind a real SGLang Model Gateway (sglang-router).

A client sends one request every 100 ms through the gateway while, in turn:
  1. replica A starts and falls back (its first profile's prefill graph capture fails),
  2. replica B gets SIGTERM and is started again,
  3. replica A reloads with a changed command (SIGHUP),
  4. replica B's engine crashes (SIGKILL of its process group).
Measured: failed client requests, increments of the gateway's retry counter
(smg_worker_retries_total) per event, seconds each replica was out of the gateway's healthy list,
and how long after the supervisor's READY the replica was healthy in GET /workers again.

Used by the `fleet` test tier (tests/fleet/) and by `bench/fleet_scenario.py` directly, which
prints a docs/PERFORMANCE.md section:
    .venv/bin/python bench/fleet_scenario.py [--router-python PYTHON]
(default: the router venv the fleet tier caches, ~/.cache/sglang-supervisor-tests/fleet/router)
Everything listens on 127.0.0.1 (the gateway's --host and --prometheus-host included) and the
model is a local path with HF_HUB_OFFLINE=1, so nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from supervised import Daemon, base_config, free_port  # noqa: E402
from tiers import cache_dir  # noqa: E402

ROUTER_VENV = cache_dir("fleet") / "router"  # the fleet tier builds it
MODEL = ROOT / "tests" / "fixtures" / "models" / "qwen3.6-27b-like"
HEALTH_INTERVAL_S = 1.0
CLIENT_PERIOD_S = 0.1
CLIENT_MAX_S = 300.0  # the client loop's own bound, whatever happens to the scenario
STEP_S = 120.0  # one event's bound


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read(1 << 20)
    except urllib.error.HTTPError as e:
        return e.code, e.read(1 << 20)


class Gateway:
    """`smg launch` on 127.0.0.1 with a 1 s health check."""

    def __init__(self, python: str, workdir: Path) -> None:
        self.port, self.prom_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "gateway.log", "w")  # noqa: SIM115 - closed in close()
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            [python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(self.port),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prom_port),
             "--health-check-interval-secs", str(int(HEALTH_INTERVAL_S)), "--log-level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                if _get(self.url + "/workers", 1.0)[0] == 200:
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not come up (rc={self.proc.poll()}); see gateway.log")
            time.sleep(0.2)

    def healthy_urls(self) -> set[str]:
        status, body = _get(self.url + "/workers", 2.0)
        if status != 200:
            return set()
        return {w["url"] for w in json.loads(body).get("workers", []) if w.get("is_healthy")}

    def retries(self) -> float:
        _, body = _get(f"http://127.0.0.1:{self.prom_port}/metrics")
        return sum(float(m.group(1)) for m in
                   re.finditer(rb"^smg_worker_retries_total(?:\{[^}]*\})? ([0-9.e+]+)$", body, re.M))

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


class Client(threading.Thread):
    """One small generation every 100 ms through the gateway, for at most CLIENT_MAX_S."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.ok = 0
        self.errors: list[str] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        body = json.dumps({"text": "The capital of France is",
                           "sampling_params": {"max_new_tokens": 4}}).encode()
        end = time.monotonic() + CLIENT_MAX_S
        while not self.stop_event.is_set() and time.monotonic() < end:
            began = time.monotonic()
            req = urllib.request.Request(self.url + "/generate", data=body,
                                         headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    r.read()
                    self.ok += 1
            except (urllib.error.URLError, OSError) as e:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {e}"[:200])
            self.stop_event.wait(max(0.0, CLIENT_PERIOD_S - (time.monotonic() - began)))


class Watcher(threading.Thread):
    """Polls GET /workers: when each replica URL was (not) healthy there."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(daemon=True)
        self.gateway = gateway
        self.samples: list[tuple[float, set[str]]] = []
        self.stop_event = threading.Event()
        self._cv = threading.Condition()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                urls = self.gateway.healthy_urls()
            except (OSError, ValueError):
                urls = set()
            with self._cv:
                self.samples.append((time.monotonic(), urls))
                self._cv.notify_all()
            self.stop_event.wait(0.1)

    def wait_healthy(self, url: str, after: float, timeout: float = STEP_S) -> float:
        """The first moment after `after` at which `url` was healthy in GET /workers."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                hit = next((t for t, urls in self.samples if t >= after and url in urls), None)
                if hit is not None:
                    return hit
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} never became healthy in the gateway")
                self._cv.wait(0.2)

    def out_of_rotation_s(self, url: str, since: float, until: float) -> float:
        """Seconds within [since, until] during which `url` was not healthy in GET /workers."""
        with self._cv:
            points = [(t, url in urls) for t, urls in self.samples if since <= t <= until]
        out = 0.0
        for (t0, healthy), (t1, _) in itertools.pairwise(points):
            if not healthy:
                out += t1 - t0
        return out


@dataclass
class Event:
    name: str
    replica: str
    planned: bool
    retries: float = 0.0
    out_of_rotation_s: float = 0.0
    ready_to_rotation_s: float = 0.0  # supervisor READY seen -> healthy in GET /workers


@dataclass
class Report:
    requests_ok: int
    client_errors: list[str]
    events: list[Event]
    health_interval_s: float = HEALTH_INTERVAL_S


def replica_config(workdir: Path, gateway_url: str | None, *faults: str) -> dict[str, Any]:
    data = base_config(workdir, *faults)
    data["engine"]["model_path"] = str(MODEL)
    data["metrics"] = {"enabled": True, "address": "127.0.0.1:0"}
    if gateway_url is not None:
        data["gateway"] = {"url": gateway_url, "timeout_s": 2.0, "drain_s": 15.0, "retry_max_s": 2.0}
    return data


def _ready_after(d: Daemon, count: int) -> float:
    """Wait for the daemon's `count`-th supervisor.ready record; when it was seen."""
    d.wait_for(f"{count}x supervisor.ready", lambda: len(d.named("supervisor.ready")) >= count, STEP_S)
    return time.monotonic()


@dataclass
class Scene:
    """What the scenario's steps share: the gateway, its watcher, the replicas' daemons (every one
    started, to close at the end) and the events measured so far."""

    gw: Gateway
    watcher: Watcher
    workdir: Path
    control: bool
    env: dict[str, str]
    daemons: list[Daemon] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    @property
    def gw_url(self) -> str | None:
        """The replicas' `gateway:` URL; none in the control run."""
        return None if self.control else self.gw.url

    def start(self, name: str, cfg: dict[str, Any]) -> Daemon:
        d = Daemon(self.workdir / name, cfg, env=self.env)
        self.daemons.append(d)
        return d

    def joined(self, d: Daemon, count: int, url: str) -> float:
        """When `d`'s `count`-th READY was seen; in the control run, it is then registered by hand."""
        ready = _ready_after(d, count)
        if self.control:
            req = urllib.request.Request(self.gw.url + "/workers", data=json.dumps({"url": url}).encode(),
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
        return ready

    def measure(self, ev: Event, url: str, began: float, ready_at: float, retries_before: float) -> None:
        healthy_at = self.watcher.wait_healthy(url, ready_at)
        ev.ready_to_rotation_s = round(max(0.0, healthy_at - ready_at), 2)
        ev.out_of_rotation_s = round(self.watcher.out_of_rotation_s(url, began, healthy_at), 2)
        ev.retries = self.gw.retries() - retries_before
        self.events.append(ev)


def run_scenario(router_python: str, workdir: Path, *, control: bool = False) -> Report:
    """`control`: the replicas know nothing of the gateway (no `gateway:` section); the scenario
    registers each one itself after READY, as a static worker list would, and nobody drains."""
    gw = Gateway(router_python, workdir)
    scene = Scene(gw, Watcher(gw), workdir, control, {"HF_HUB_OFFLINE": "1"})
    client: Client | None = None
    try:
        (workdir / "b").mkdir()
        b_cfg = replica_config(workdir / "b", scene.gw_url)
        b = scene.start("b", b_cfg)
        b_url = f"http://127.0.0.1:{b_cfg['engine']['port']}"
        scene.joined(b, 1, b_url)
        scene.watcher.start()
        scene.watcher.wait_healthy(b_url, 0.0)
        client = Client(gw.url)
        client.start()
        a, a_cfg, a_url = a_starts_and_falls_back(scene)
        time.sleep(2)
        b = b_stops_and_starts_again(scene, b_cfg, b_url, b)
        time.sleep(2)
        a_reloads_a_changed_command(scene, a, a_cfg, a_url)
        time.sleep(2)
        b_engine_crashes(scene, b, b_url)
        time.sleep(1)
        client.stop_event.set()
        client.join(35)
        return Report(client.ok, list(client.errors), scene.events)
    finally:
        if client is not None:
            client.stop_event.set()
        scene.watcher.stop_event.set()
        for d in scene.daemons:
            d.close()
        gw.close()


def a_starts_and_falls_back(scene: Scene) -> tuple[Daemon, dict[str, Any], str]:
    """1. A starts; its first profile's prefill capture fails; it falls back, then serves."""
    workdir = scene.workdir
    (workdir / "a").mkdir()
    a_cfg = replica_config(workdir / "a", scene.gw_url, "capture-fail:prefill")
    a_url = f"http://127.0.0.1:{a_cfg['engine']['port']}"
    before, began = scene.gw.retries(), time.monotonic()
    a = scene.start("a", a_cfg)
    ready = scene.joined(a, 1, a_url)
    a.wait_for("a fallback launch", lambda: any(str(e.get("reason", "")).startswith("fallback")
                                                for e in a.named("engine.launch")), 5)
    scene.measure(Event("A falls back (capture fault) and joins", "A", True), a_url, began, ready, before)
    return a, a_cfg, a_url


def b_stops_and_starts_again(scene: Scene, b_cfg: dict[str, Any], b_url: str, b: Daemon) -> Daemon:
    """2. B: SIGTERM (drain first), then started again on the same state dir; the new daemon."""
    before, began = scene.gw.retries(), time.monotonic()
    if b.stop() != 0:
        raise RuntimeError("replica B did not exit 0 on SIGTERM")
    b = scene.start("b", b_cfg)
    ready = scene.joined(b, 1, b_url)
    scene.measure(Event("B SIGTERM, started again", "B", True), b_url, began, ready, before)
    return b


def a_reloads_a_changed_command(scene: Scene, a: Daemon, a_cfg: dict[str, Any], a_url: str) -> None:
    """3. A: a reload (SIGHUP) that changes the engine's command."""
    before, began = scene.gw.retries(), time.monotonic()
    a_cfg["engine"]["args"]["max-running-requests"] = 12
    a.write_config(a_cfg)
    a.proc.send_signal(signal.SIGHUP)
    ready = scene.joined(a, 2, a_url)
    scene.measure(Event("A reload, command changed", "A", True), a_url, began, ready, before)


def b_engine_crashes(scene: Scene, b: Daemon, b_url: str) -> None:
    """4. B's engine crashes (unplanned: the gateway may retry what was in flight there)."""
    before, began = scene.gw.retries(), time.monotonic()
    os.killpg(b.engine_pids()[-1], signal.SIGKILL)
    ready = scene.joined(b, 2, b_url)
    scene.measure(Event("B engine crash (SIGKILL)", "B", False), b_url, began, ready, before)


def table(title: str, r: Report) -> list[str]:
    lines = [
        f"{title}: client requests {r.requests_ok} succeeded, **{len(r.client_errors)} failed**.",
        "",
        "| event | planned | gateway retries | out of rotation (s) | READY → healthy in gateway (s) |",
        "|---|---|---|---|---|",
    ]
    for e in r.events:
        lines.append(f"| {e.name} | {'yes' if e.planned else 'no'} | {e.retries:g} | "
                     f"{e.out_of_rotation_s:.1f} | {e.ready_to_rotation_s:.1f} |")
    return [*lines, ""]


def markdown(r: Report, control: Report | None = None) -> str:
    lines = [
        "## Fleet: drain and re-registration behind the SGLang Model Gateway",
        "",
        "`bench/fleet_scenario.py` (the same scenario is the `fleet` test tier): two supervised "
        "simulators behind a real sglang-router gateway on 127.0.0.1 (health check every "
        f"{r.health_interval_s:g} s), one request every {CLIENT_PERIOD_S * 1000:.0f} ms through the "
        "gateway while A starts and falls back, B gets SIGTERM and starts again, A reloads with a "
        "changed command and B's engine is SIGKILLed. \"Out of rotation\" is the time the replica "
        "was missing from the healthy workers of `GET /workers`; \"READY → healthy\" is from the "
        "supervisor's READY to the first healthy listing.",
        "",
        *table("With `gateway:` (register after READY, deregister and drain before planned stops)", r),
    ]
    if control is not None:
        lines += table("Control, without `gateway:` (the replicas registered once after READY, as a "
                       "static worker list would; nobody deregisters or drains)", control)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--router-python", default=str(ROUTER_VENV / "bin" / "python"))
    ap.add_argument("--control", action="store_true",
                    help="also run the control scenario (replicas without `gateway:`)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-") as tmp:
        report = run_scenario(args.router_python, Path(tmp))
    control = None
    if args.control:
        with tempfile.TemporaryDirectory(prefix="fleet-control-") as tmp:
            control = run_scenario(args.router_python, Path(tmp), control=True)
    print(markdown(report, control))
    for err in report.client_errors:
        print("client error:", err, file=sys.stderr)
    return 0 if not report.client_errors else 1


if __name__ == "__main__":
    sys.exit(main())
