"""Scenario fallback, s3_fallback (issue 8): a real start failure (no memory left for the KV
cache) classified, the next profile started, READY on it."""

from __future__ import annotations

import time
from typing import Any

from .adapters import SupervisorRun
from .common import FAIL_FRACTION, LOG_LAG_S, PROFILES, check
from .context import Context


def fail_profiles() -> list[dict[str, Any]]:
    return [
        {"name": "no-kv-room", "description": "Leaves no memory for the KV cache: fails at start.",
         "args": {"mem-fraction-static": FAIL_FRACTION}},
        PROFILES[2],
    ]


def s3_fallback(ctx: Context) -> None:
    need = 150 if ctx.real else 40
    if ctx.left() < need:
        ctx.skip("s3_fallback", f"budget: {ctx.left():.0f} s left, {need} s needed")
        return
    profiles = fail_profiles()
    if not ctx.real:
        # The simulator fails the same way, on the same flag value.
        profiles[0] = {**profiles[0], "env": {
            "SGLANG_SIM_FAULTS": f"kv-oom+when=--mem-fraction-static={FAIL_FRACTION:g}"}}
    cfg = ctx.config("fallback", profiles=profiles)
    sup = SupervisorRun(ctx.o.python, cfg, ctx.work / "fallback", "fallback")
    checks: list[dict[str, Any]] = []
    try:
        ready = sup.wait(lambda: bool(sup.notify.times("READY=1")), ctx.deadline - 15)
        if ready:
            sup.wait(lambda: bool(sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
        failed = sup.named("engine.failed")
        fallback = sup.named("profile.fallback")
        readies = sup.named("supervisor.ready")
        cls = failed[0][1].get("failure_class") if failed else None
        checks.append(check("first profile failed", bool(failed), failed[0][1] if failed else None))
        checks.append(check("classified as kv_cache_oom", cls == "kv_cache_oom", cls))
        checks.append(check("fell back to the next profile", bool(fallback),
                            fallback[0][1] if fallback else None))
        checks.append(check("READY on the fallback profile",
                            ready and bool(readies) and readies[0][1].get("profile") == "eager",
                            readies[0][1] if readies else None))
        numbers = {"failure": failed[0][1] if failed else None,
                   "fallback": fallback[0][1] if fallback else None,
                   "ready": readies[0][1] if readies else None,
                   "launch_to_READY_s": round(sup.notify.times("READY=1")[0] - sup.t0, 1) if ready else None,
                   "status_attempts": sup.status().get("attempts")}
        rc, secs = sup.stop(60)
        numbers["sigterm"] = {"rc": rc, "seconds": secs}
        ctx.record("s3_fallback", checks, numbers)
    finally:
        sup.close()
