"""Scenario warmcache, s13_warmcache (issue 26): the kernel caches under an emulated
CacheDirectory (scripts/gpu/warmcache.py): cold start, restart, SIGKILL, fallback; each warm start
<= 0.5 x the cold one. Named warm.py: warmcache.py beside e2e.py holds the scenario's helpers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import warmcache

from .adapters import SupervisorRun, descendants
from .common import FAIL_FRACTION, LOG_LAG_S, PROFILES, check
from .context import Context


def warm_start(ctx: Context, name: str, cache_dir: Path, profiles: list[dict[str, Any]],
               reserve: float) -> tuple[SupervisorRun, bool]:
    """One supervisor start in the unit's emulated environment (scripts/gpu/warmcache.py)."""
    env = warmcache.unit_environment(dict(os.environ), cache_dir, ctx.work / "warmcache" / f"{name}-scratch")
    cfg = ctx.config(f"warmcache-{name}", profiles=profiles)
    sup = SupervisorRun(ctx.o.python, cfg, ctx.work / f"warmcache-{name}", name, environ=env)
    ready = sup.wait(lambda: bool(sup.notify.times("READY=1")), ctx.deadline - reserve)
    if ready:
        sup.wait(lambda: bool(sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
    return sup, ready


def warm_numbers(ctx: Context, sup: SupervisorRun, t0: float, ready_t: float | None,
                 cache_dir: Path) -> dict[str, Any]:
    pid = sup.status().get("engine_pid")
    env = warmcache.engine_environ(int(pid)) if pid else {}
    scratch = ctx.work / "warmcache" / f"{sup.cfg_path.stem}-scratch"
    readies = [d for t, d in sup.named("supervisor.ready") if t >= t0]
    return {"to_READY_s": round(ready_t - t0, 1) if ready_t else None,
            "ready_profile": readies[0].get("profile") if readies else None,
            "attempts": [(d.get("profile"), d.get("failure_class")) for t, d in sup.named("engine.failed") if t >= t0],
            # What this start wrote into its private /tmp and ~: gone at the next unit start.
            "lost_at_restart": {d: warmcache.sizes(scratch / d, 2) for d in ("tmp", "home")},
            "phases": warmcache.phases(sup.tail.since(t0), t0),
            "captures": [f"{d.get('owner')} {d.get('graph')} {d.get('seconds')} s"
                         for t, d in sup.named("engine.capture_end") if t >= t0],
            "engine_cache_env": {k: env.get(k) for k in sorted(warmcache.CACHE_VAR_NAMES)},
            "cache": warmcache.cache_report(cache_dir)}


def started(ctx: Context, sup: SupervisorRun, ready: bool, cache_dir: Path) -> dict[str, Any]:
    """warm_numbers of a start from the supervisor's launch to its first READY=1."""
    t_ready = sup.notify.times("READY=1")[0] if ready else None
    return warm_numbers(ctx, sup, sup.t0, t_ready, cache_dir)


def on_first_rung(what: str, ready: bool, start: dict[str, Any], **detail: Any) -> dict[str, Any]:
    return check(f"{what} READY on the first rung", ready and start["ready_profile"] == PROFILES[0]["name"],
                 {"s": start["to_READY_s"], "profile": start["ready_profile"], **detail})


def s13_warmcache(ctx: Context) -> None:
    """Long because: one sequence (cold, restart, SIGKILL, fallback) over one cache directory."""
    need = 320 if ctx.real else 40
    if ctx.left() < need:
        ctx.skip("s13_warmcache", f"budget: {ctx.left():.0f} s left, {need} s needed")
        return
    cache_dir = ctx.work / "warmcache" / "var-cache-sglang-supervisor"
    shutil.rmtree(ctx.work / "warmcache", ignore_errors=True)
    cache_dir.mkdir(parents=True)
    numbers_pre: dict[str, Any] = {}
    if ctx.real:
        # Not what a cache fixes: the disk's page cache and Python's bytecode for torch and
        # SGLang. One import first (its JIT output into a throwaway folder), so that (a) is cold
        # in the kernel caches only, as a host that already served some other model.
        throw = ctx.work / "warmcache" / "preimport"
        env = warmcache.unit_environment(dict(os.environ), throw / "cache", throw)
        env.update({v: str(throw / "jit" / v.lower()) for v, _ in warmcache.CACHE_VARS})
        t = time.time()
        r = subprocess.run([ctx.o.engine_python, "-c", "import torch, triton, sglang.srt.server_args"],
                           env=env, capture_output=True, text=True, timeout=120, check=False)
        numbers_pre = {"rc": r.returncode, "seconds": round(time.time() - t, 1), "stderr": r.stderr[-300:]}
    jit_before = time.time()
    ladder = [PROFILES[0], PROFILES[1]]  # graphs (prefill breakable + decode full), no-prefill-graph
    checks: list[dict[str, Any]] = []
    numbers: dict[str, Any] = {"emulation": warmcache.__doc__.split("\n\n")[1].replace("\n", " "),
                               "preimport": numbers_pre}
    starts: dict[str, float | None] = {}
    # (a) cold: an empty cache directory
    sup, ready = warm_start(ctx, "a-cold", cache_dir, ladder, 170 if ctx.real else 25)
    try:
        numbers["a_cold"] = a = started(ctx, sup, ready, cache_dir)
        starts["a_cold"] = a["to_READY_s"]
        checks.append(on_first_rung("(a) cold start", ready, a, failed=a["attempts"]))
        env = numbers["a_cold"]["engine_cache_env"]
        keys = sorted(numbers["a_cold"]["cache"]["keys"])
        key_dir = str(cache_dir / "engine-cache" / keys[0]) if len(keys) == 1 else None
        checks.append(check("one key directory under CACHE_DIRECTORY/engine-cache", key_dir is not None, keys))
        placed = [v for v, _ in warmcache.CACHE_VARS if (env.get(v) or "").startswith(f"{key_dir}/")]
        checks.append(check("the engine's cache variables all point into the key directory",
                            key_dir is not None and len(placed) == len(warmcache.CACHE_VARS),
                            {"placed": len(placed), "of": len(warmcache.CACHE_VARS), "env": env}))
        if ctx.real:
            key_bytes = sum(numbers["a_cold"]["cache"]["keys"].get(keys[0], {}).values()) if key_dir else 0
            checks.append(check("the cold start's JIT output landed in the key directory (> 1 MiB)",
                                key_bytes > (1 << 20), key_bytes))
        rc, secs = sup.stop(60)
        numbers["a_cold"]["sigterm"] = {"rc": rc, "seconds": secs}
    finally:
        sup.close()
    numbers["cache_after_a"] = warmcache.cache_report(cache_dir)
    if not ready:
        ctx.record("s13_warmcache", checks, numbers, note="the cold start never became ready")
        return
    # (b) `systemctl restart`: a new supervisor, a new PrivateTmp, the same CacheDirectory
    sup, ready = warm_start(ctx, "b-restart", cache_dir, ladder, 110 if ctx.real else 15)
    try:
        numbers["b_restart"] = b = started(ctx, sup, ready, cache_dir)
        starts["b_restart"] = b["to_READY_s"]
        checks.append(on_first_rung("(b) restart", ready, b))
        # (c) SIGKILL of the engine's scheduler: the supervisor relaunches it (same unit, same /tmp)
        pid = sup.status().get("engine_pid")
        kids = descendants(int(pid)) if pid else []
        scheds = [k for k in kids if "scheduler" in k["cmd"] or "scheduler" in k["comm"]]
        victim = scheds[-1]["pid"] if scheds else (int(pid) if pid and not ctx.real else None)
        if ready and victim and ctx.left() > (90 if ctx.real else 10):
            n = len(sup.named("supervisor.ready"))
            tk = time.time()
            os.kill(victim, signal.SIGKILL)
            again = sup.wait(lambda: len(sup.named("supervisor.ready")) > n, ctx.deadline - (75 if ctx.real else 8))
            t_again = sup.named("supervisor.ready")[-1][0] if again else None
            numbers["c_sigkill"] = warm_numbers(ctx, sup, tk, t_again, cache_dir)
            starts["c_sigkill"] = numbers["c_sigkill"]["to_READY_s"]
            checks.append(check("(c) READY again after SIGKILL of the scheduler", again, starts["c_sigkill"]))
        else:
            numbers["c_sigkill"] = f"not run: victim {victim}, {ctx.left():.0f} s left"
        rc, secs = sup.stop(60)
    finally:
        sup.close()
    # (d) a fallback start: the first rung cannot allocate its KV cache, the second starts
    if ctx.left() > (70 if ctx.real else 8):
        bad = {**PROFILES[0], "name": "no-kv-room", "args": {"mem-fraction-static": FAIL_FRACTION}}
        if not ctx.real:
            bad["env"] = {"SGLANG_SIM_FAULTS": f"kv-oom+when=--mem-fraction-static={FAIL_FRACTION:g}"}
        sup, ready = warm_start(ctx, "d-fallback", cache_dir, [bad, PROFILES[1]], 10 if ctx.real else 3)
        try:
            spawned = [(t, d) for t, d in sup.named("engine.spawned") if d.get("profile") == PROFILES[1]["name"]]
            readies = sup.named("supervisor.ready")
            t_ready = readies[0][0] if ready and readies else None
            t1 = spawned[0][0] if spawned else sup.t0
            numbers["d_fallback"] = warm_numbers(ctx, sup, t1, t_ready, cache_dir)
            numbers["d_fallback"]["supervisor_start_to_READY_s"] = round(t_ready - sup.t0, 1) if t_ready else None
            numbers["d_fallback"]["ready_profile"] = readies[0][1].get("profile") if readies else None
            starts["d_fallback_second_rung"] = numbers["d_fallback"]["to_READY_s"]
            checks.append(check("(d) READY on the second rung", ready and bool(spawned)
                                and numbers["d_fallback"]["ready_profile"] == PROFILES[1]["name"],
                                numbers["d_fallback"]["ready_profile"]))
            sup.stop(60)
        finally:
            sup.close()
    else:
        numbers["d_fallback"] = f"not run: {ctx.left():.0f} s left"
    cold = starts.get("a_cold")
    numbers["to_READY_s"] = starts
    numbers["ratio_to_cold"] = {k: round(v / cold, 3) for k, v in starts.items() if v and cold and k != "a_cold"}
    numbers["cache_final"] = warmcache.cache_report(cache_dir)
    numbers["dominant"] = {k: (v["phases"]["largest_gaps"][:2] if isinstance(v, dict) else v)
                           for k, v in numbers.items() if k[:2] in ("a_", "b_", "c_", "d_")}
    outside = {k: v for k, v in numbers["cache_final"]["outside_keys"].items() if v > (1 << 20)}
    checks.append(check("nothing over 1 MiB in the cache directory outside the key directories",
                        not outside, outside))
    written = warmcache.newer_files(Path("/tmp/jit"), jit_before)
    checks.append(check("nothing written to the old /tmp/jit paths", not written, written[:5]))
    for k, r in numbers["ratio_to_cold"].items():
        if ctx.real:  # the simulator has no JIT: its ratios say nothing
            checks.append(check(f"{k} <= 0.5 x the cold start", r <= 0.5, {"ratio": r, "s": starts[k], "cold_s": cold}))
    missing = [k for k in ("b_restart", "c_sigkill", "d_fallback_second_rung") if not starts.get(k)]
    checks.append(check("every warm start measured", not missing, missing))
    ctx.record("s13_warmcache", checks, numbers,
               note="emulated unit environment (CACHE_DIRECTORY, fresh TMPDIR and HOME per start); "
                     "not real systemd")
