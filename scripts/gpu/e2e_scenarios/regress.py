"""Scenarios regress and unexplained (issue 16), the regression policy on the ~8B model:
s10_regression (a foreign matmul loop on the same GPU: explained once, its end once, no restart)
and s12_unexplained (a foreign agent stutters the scheduler: restart, next profile, keep faster)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from .adapters import SupervisorRun, descendants
from .bigmodel import big_config
from .common import HOG, check
from .context import Context

# Scenario 12: the foreign agent's duty cycle (about half of wall time stopped).
STUTTER_STOP_S = 0.1
STUTTER_RUN_S = 0.1


class Stutter:
    """A foreign agent that slows the engine without touching the GPU: SIGSTOP/SIGCONT of the
    processes `targets()` names, in a loop, until stop(). Always leaves them running."""

    def __init__(self, targets: Callable[[], list[int]]) -> None:
        self.targets = targets
        self.seen: set[int] = set()
        self.cycles = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _signal(self, pids: list[int], sig: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = self.targets()
            self.seen.update(pids)
            self._signal(pids, signal.SIGSTOP)
            try:
                self._stop.wait(STUTTER_STOP_S)
            finally:
                self._signal(pids, signal.SIGCONT)
            self.cycles += 1
            self._stop.wait(STUTTER_RUN_S)

    def stop(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(5)
        self._signal(sorted(self.seen), signal.SIGCONT)


# Both scenarios' ladder: the engine served with decode graphs, one rung left to try.
POLICY_PROFILES: list[dict[str, Any]] = [
    {"name": "decode-graphs", "description": "Decode CUDA graphs, prefill eager."},
    {"name": "eager", "description": "No CUDA graphs.", "args": {"cuda-graph-backend-decode": "disabled"}}]


def policy_run(ctx: Context, name: str, cooldown_s: float) -> SupervisorRun:
    """The ~8B model supervised with probes every 5 s that the regression policy acts on."""
    cfg = big_config(ctx, name, POLICY_PROFILES)
    cfg["probe"].update({"interval_s": 5, "baseline_runs": 3, "regression_window": 3,
                         "regression_delta": 0.15, "cooldown_s": cooldown_s, "act_on_regression": True,
                         "max_new_tokens": 64})
    return SupervisorRun(ctx.o.python, cfg, ctx.work / name, name)


def policy_events(sup: SupervisorRun, prefixes: tuple[str, ...]) -> list[tuple[float, dict[str, Any]]]:
    return [(t, d) for t, d in sup.events if str(d.get("event", "")).startswith(prefixes)]


def relative(ev: list[tuple[float, dict[str, Any]]], t0: float, key: str) -> list[dict[str, Any]]:
    """The events for the report: seconds from t0 under `key`, less the log's level and timestamp."""
    return [{key: round(t - t0, 1), **{k: v for k, v in d.items() if k not in ("level", "timestamp")}}
            for t, d in ev]


def s10_regression(ctx: Context) -> None:
    """Probes every 5 s; a foreign matmul loop on the same GPU for hog_s; then quiet."""
    need = 200 if ctx.real else 40
    if ctx.left() < need or not ctx.real:
        ctx.skip("s10_regression", "needs the GPU machine" if not ctx.real
                 else f"budget: {ctx.left():.0f} s left, {need} s needed")
        return
    sup = policy_run(ctx, "regress", cooldown_s=30)
    hog_s = max(20.0, min(60.0, ctx.left() - 150))
    res: dict[str, Any] = {"hog_s": hog_s}
    checks: list[dict[str, Any]] = []
    try:
        ok = sup.wait(lambda: bool(sup.notify.times("READY=1")), min(ctx.deadline - 120, time.time() + 300))
        checks.append(check("READY=1", ok, None))
        if ok:
            time.sleep(20)  # baseline probes
            t_hog = time.time()
            hog = subprocess.Popen([ctx.o.engine_python, "-c", HOG, str(hog_s)])
            hog.wait(hog_s + 60)
            t_end = time.time()
            time.sleep(min(45.0, max(10.0, ctx.left() - 40)))
            rel = lambda t: round(t - t_hog, 1)  # noqa: E731 - local shorthand
            ev = policy_events(sup, ("probe", "throughput", "regression", "engine.launch", "engine.stop",
                                     "profile."))
            res["events"] = relative(ev, t_hog, "t_from_hog_s")
            res["hog_end_from_start_s"] = rel(t_end)
            decisions = [(t, d) for t, d in ev if d.get("event") == "throughput.decision"]
            recovered = [(t, d) for t, d in ev if d.get("event") == "throughput.recovered"]
            suspected = [(t, d) for t, d in ev if d.get("event") == "probe.regression_suspected"]
            launches = [d for t, d in sup.named("engine.launch") if t > t_hog]
            checks.append(check("one decision during the foreign job: explained",
                                len(decisions) == 1 and decisions[0][1].get("decision") == "explained",
                                [(rel(t), d.get("decision"), d.get("detail")) for t, d in decisions]))
            checks.append(check("probe.regression_suspected logged once (info), not every window",
                                len(suspected) == 1, [rel(t) for t, _ in suspected]))
            checks.append(check("its end logged once (throughput.recovered), after the job ended",
                                len(recovered) == 1 and recovered[0][0] > t_end,
                                [(rel(t), d.get("median_tps")) for t, d in recovered]))
            checks.append(check("no restart for an explained slowdown", not launches, launches[:2]))
    finally:
        res["stop"] = sup.stop(60)
        sup.close()
    ctx.record("s10_regression", checks, res)


def s12_unexplained(ctx: Context) -> None:
    """Item 5b of issue 16: a slowdown the supervisor cannot explain, caused for real, acted on.

    A foreign agent keeps SIGSTOPping the engine's scheduler processes (STUTTER_STOP_S stopped,
    STUTTER_RUN_S running; it finds each new scheduler by its process title, so it follows the
    engine across restarts): decode really slows, the GPU is neither throttled nor shared, no
    other process is on it, decode still runs CUDA graphs, nothing else is queued. The policy
    (regression.py) must then restart the same profile once, find it still slow, try the next
    profile, and keep whichever probes faster."""
    if not ctx.real:
        # The simulator paces tokens against its own schedule: a stopped process catches up
        # afterwards, so a stutter does not slow its decode (tried: no decision in 120 s).
        ctx.skip("s12_unexplained", "needs the GPU machine")
        return
    if ctx.left() < 280:
        ctx.skip("s12_unexplained", f"budget: {ctx.left():.0f} s left, 280 s needed")
        return
    sup = policy_run(ctx, "unexplained", cooldown_s=3600)
    stutter = Stutter(lambda: [p["pid"] for p in descendants(sup.proc.pid)
                               if p["comm"].startswith("sglang::sched") or "sglang::scheduler" in p["cmd"]])
    res: dict[str, Any] = {"stutter": {"stop_s": STUTTER_STOP_S, "run_s": STUTTER_RUN_S}}
    checks: list[dict[str, Any]] = []
    try:
        ok = sup.wait(lambda: bool(sup.notify.times("READY=1")), min(ctx.deadline - 150, time.time() + 300))
        checks.append(check("READY=1", ok, None))
        if ok:
            sup.wait(lambda: bool(sup.named("probe.baseline")), time.time() + 60)
            base = sup.named("probe.baseline")
            checks.append(check("baseline measured", bool(base), base[0][1] if base else None))
            t0 = time.time()
            stutter.start()
            settled = sup.wait(lambda: any(d.get("decision") == "keep_faster"
                                           for _, d in sup.named("throughput.decision")),
                               ctx.deadline - 25, step=0.5)
            stutter.stop()
            rel = lambda t: round(t - t0, 1)  # noqa: E731 - local shorthand
            ev = policy_events(sup, ("probe.", "throughput", "regression", "engine.spawned", "engine.stop",
                                     "profile.", "supervisor.ready"))
            res["events"] = relative([(t, d) for t, d in ev if t >= t0 - 30], t0, "t_from_stutter_s")
            res["stutter"]["signalled_pids"] = sorted(stutter.seen)
            res["stutter"]["cycles"] = stutter.cycles
            decisions = [(rel(t), d.get("decision"), d.get("ratio"), d.get("detail"))
                         for t, d in sup.named("throughput.decision") if t >= t0]
            res["decisions"] = decisions
            names = [x[1] for x in decisions]
            spawned = [(rel(t), d.get("profile")) for t, d in sup.named("engine.spawned") if t >= t0]
            res["spawned_after_stutter"] = spawned
            checks.append(check("the stutter reached a scheduler process", bool(stutter.seen), stutter.cycles))
            checks.append(check("no explanation found (decision is not 'explained')",
                                "explained" not in names, decisions))
            checks.append(check("restart_same, then try_next_profile, then keep_faster",
                                names[:3] == ["restart_same", "try_next_profile", "keep_faster"], names))
            checks.append(check("the same profile restarted, then the next profile started",
                                [p for _, p in spawned[:2]] == ["decode-graphs", "eager"], spawned))
            checks.append(check("the policy settled within the budget", settled, None))
    finally:
        stutter.stop()
        res["stop"] = sup.stop(60)
        sup.close()
    ctx.record("s12_unexplained", checks, res)
