"""Scenario captureoom, s15_captureoom (issue 25): a foreign holder leaves too little memory for the
decode graphs at batch 512: a real capture OOM healed by a derived profile (half the batch, graphs
kept), measured against the written no-graph rung."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from .adapters import SupervisorRun, probe_series, reap
from .common import LOG_LAG_S, check
from .context import Context

# Scenario 13: a foreign process on the engine's GPU that tails the engine log. At `Memory pool
# end` (the last line before the decode graph runner allocates its max-batch-sized state and
# captures) it either measures (mode `measure`: free memory then, and the lowest free memory it
# sees, polling every millisecond, until the decode capture ends: what that start's graphs needed)
# or takes all free memory but `margin` bytes (mode `hold`; live free memory, so what the engine
# already took counts) and gives it back when the capture ends, the engine fails (its failure
# lines) or a new start loads weights. Its CUDA context is made first, so the engine's own figures
# already exclude it (< 1 GiB: not the supervisor's "GPU busy").
HOLDER = r"""
import os, re, sys, time, torch
log, mode, margin, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.zeros(1, device="cuda")
print("holder ready", mode, flush=True)
arm = "Memory pool end"
release = ("Load weight begin", "Capture target decode CUDA graph end", "Capture cuda graph failed",
           "Scheduler hit an exception", "Received sigquit", "kill_process_tree", "OutOfMemoryError")
held, pos, buf, watch = None, 0, "", None
def mem():
    return torch.cuda.mem_get_info()[0]
def free():
    global held
    if held is not None:
        held = None
        torch.cuda.empty_cache()
        print("released", round(time.time(), 3), "free_mib", round(mem() / 2**20, 1), flush=True)
while not os.path.exists(stop):
    if watch is not None:
        watch[1] = min(watch[1], mem())
    try:
        with open(log, "rb") as f:
            f.seek(pos)
            chunk = f.read()
    except OSError:
        chunk = b""
    if not chunk:
        time.sleep(0.001 if watch is not None else 0.002)
        continue
    pos += len(chunk)
    buf += chunk.decode(errors="replace")
    *lines, buf = re.split(r"[\r\n]", buf)
    for line in lines:
        if arm in line and mode == "measure":
            watch = [mem(), mem()]
        elif arm in line and held is None:
            for i in range(50):
                want = mem() - margin
                if want <= 0:
                    break
                try:
                    held = torch.empty(want, dtype=torch.uint8, device="cuda")
                    break
                except torch.OutOfMemoryError:
                    time.sleep(0.002)
            print("grabbed", round(time.time(), 3), "took_gib",
                  round((held.numel() if held is not None else 0) / 2**30, 3),
                  "free_after_mib", round(mem() / 2**20, 1), flush=True)
        elif "Capture target decode CUDA graph end" in line and watch is not None:
            watch[1] = min(watch[1], mem())
            print("measured need_bytes", watch[0] - watch[1], "free_at_pool_end", watch[0], flush=True)
            watch = None
        elif held is not None and any(r in line for r in release):
            free()
free()
"""
MEASURED = re.compile(r"measured need_bytes (?P<need>-?\d+)")
CAPTURE_MEM = re.compile(r"Capture target decode CUDA graph (?P<state>begin|end)\..*?"
                         r"(?:bs=\[(?P<bs>[\d, ]*)\].*?)?(?:mem usage=(?P<usage>[\d.]+) GB.*?)?"
                         r"avail mem=(?P<avail>[\d.]+) GB")


# Scenario 13's ladder: decode graphs up to batch 512 (prefill eager: a start stays ~40 s, the
# prefill graph's first-use JIT is not what this scenario is about), then the hand-written rung
# that gives the decode graphs up.
OOM_MAX_BS = 512
CAPTUREOOM_PROFILES: list[dict[str, Any]] = [
    {"name": "graphs-bs512", "description": "Decode CUDA graphs up to batch 512, prefill eager.",
     "args": {"cuda-graph-max-bs-decode": OOM_MAX_BS, "cuda-graph-backend-prefill": "disabled"}},
    {"name": "no-graphs", "description": "No CUDA graphs (the written rung below).",
     "args": {"cuda-graph-backend-prefill": "disabled", "cuda-graph-backend-decode": "disabled"}},
]
# Calibration only: what the derived profile's first step will need.
CALIBRATE_HALF = {"name": "graphs-bs256", "description": "Decode CUDA graphs up to batch 256.",
                  "args": {"cuda-graph-max-bs-decode": OOM_MAX_BS // 2, "cuda-graph-backend-prefill": "disabled"}}


def decode_captures(lines: list[tuple[float, str]]) -> list[dict[str, Any]]:
    """Each decode graph capture line of an engine log, in order: state, the batch sizes (begin),
    mem usage (end) and avail mem, as SGLang 0.5.17 prints them."""
    out: list[dict[str, Any]] = []
    for t, text in lines:
        m = CAPTURE_MEM.search(text)
        if m:
            bs = [int(x) for x in m["bs"].split(",") if x.strip()] if m["bs"] else []
            out.append({"t": t, "state": m["state"], "max_bs": max(bs) if bs else None,
                        "usage_gb": float(m["usage"]) if m["usage"] else None,
                        "avail_gb": float(m["avail"])})
    return out


def oom_margin_bytes(need_top: int | None, need_half: int | None, override_gb: float | None
                     ) -> int | None:
    """What the holder leaves free at `Memory pool end`: the flag's value, else halfway between
    what the decode graphs needed (measured by the holder in the calibration starts) at batch 512
    and at 256, so 512 cannot fit and 256 can. None: no such gap was measured."""
    if override_gb is not None:
        return int(override_gb * 2**30)
    if need_top is None or need_half is None or not 0 < need_half < need_top:
        return None
    return (need_top + need_half) // 2


def s15_captureoom(ctx: Context) -> None:
    """Issue 25 on the GPU: a real decode graph capture OOM, caused by a foreign process that
    leaves too little memory for the decode graphs at batch 512 (but enough for 256), healed
    by a derived profile (half the max batch, decode graphs kept) instead of the written
    no-graph rung; both measured."""
    name = "s15_captureoom"
    need = 220 if ctx.real else 30
    if ctx.left() < need:
        ctx.skip(name, f"budget: {ctx.left():.0f} s left, {need} s needed")
        return
    numbers: dict[str, Any] = {}
    checks: list[dict[str, Any]] = []
    top = _captureoom_calibrate(ctx, "graphs-bs512", numbers, checks)
    half = (_captureoom_calibrate(ctx, "graphs-bs256", numbers, checks)
            if ctx.o.oom_margin_gb is None else {})
    margin = oom_margin_bytes(top.get("need_bytes"), half.get("need_bytes"), ctx.o.oom_margin_gb)
    numbers["margin_bytes"] = margin
    if ctx.real:
        checks.append(check("calibration: batch 512 needs more memory than 256 (a margin between)",
                            margin is not None, {"512": top.get("need_bytes"),
                                                 "256": half.get("need_bytes")}))
        if margin is None:
            ctx.record(name, checks, numbers)
            return
    derived_tps = _captureoom_supervised(ctx, margin or 0, numbers, checks)
    cfg = ctx.config("captureoom-written", profiles=CAPTUREOOM_PROFILES)
    written = ctx.hand_launch(cfg, profile="no-graphs", log_name="captureoom-written-engine.log",
                              runs=3)
    numbers["written_no_graphs"] = written
    written_tps = (written.get("probe_series") or {}).get("median_tok_s")
    checks.append(check("the written no-graph rung measured", bool(written_tps), written_tps))
    ratio = round(derived_tps / written_tps, 3) if derived_tps and written_tps else None
    numbers["derived_over_written"] = ratio
    numbers["calibrated_bs512_over_written"] = (
        round(top["tok_s"] / written_tps, 3) if top.get("tok_s") and written_tps else None)
    if ctx.real:  # the simulator's tok/s model says nothing about graphs vs eager here
        checks.append(check("derived (decode graphs) faster than the written no-graph rung",
                            ratio is not None and ratio > 1.0, ratio))
    ctx.record(name, checks, numbers,
               note=f"holder leaves {margin} bytes free at `Memory pool end` of each start")


def _holder(ctx: Context, log_file: str, mode: str, margin: int, work: Path) -> tuple[Any, Path, Path]:
    """The foreign holder (real engine only), started and ready before the engine."""
    work.mkdir(parents=True, exist_ok=True)
    stop_file, out = work / f"holder-{mode}.stop", work / f"holder-{mode}.log"
    stop_file.unlink(missing_ok=True)
    if not ctx.real:
        out.write_text("")
        return None, stop_file, out
    with out.open("w") as f:
        proc = subprocess.Popen([ctx.o.engine_python, "-c", HOLDER, log_file, mode, str(margin),
                                 str(stop_file)], stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    t = time.time()
    while time.time() - t < 60 and "holder ready" not in out.read_text() and proc.poll() is None:
        time.sleep(0.2)
    return proc, stop_file, out


def _holder_stop(proc: Any, stop_file: Path) -> None:
    stop_file.touch()
    if proc is None:
        return
    reap(proc, 20)


def _captureoom_calibrate(ctx: Context, profile: str, numbers: dict[str, Any], checks: list[dict[str, Any]]
                          ) -> dict[str, Any]:
    """(1) `profile` alone, no interference: what its decode graphs need (the holder measures,
    takes nothing) and, for the 512 one, its tok/s."""
    cfg = ctx.config(f"captureoom-calib-{profile}", profiles=[*CAPTUREOOM_PROFILES, CALIBRATE_HALF])
    log_name = f"captureoom-calib-{profile}-engine.log"
    log_path = ctx.work / log_name
    log_path.unlink(missing_ok=True)
    proc, stop_file, out = _holder(ctx, str(log_path), "measure", 0, ctx.work / "captureoom")
    try:
        res = ctx.hand_launch(cfg, profile=profile, log_name=log_name,
                              runs=3 if profile == "graphs-bs512" else 1)
    finally:
        _holder_stop(proc, stop_file)
    text = log_path.read_text(errors="replace")
    caps = decode_captures([(0.0, x) for x in re.split(r"[\r\n]", text)])
    begin = next((c for c in caps if c["state"] == "begin"), {})
    end = next((c for c in caps if c["state"] == "end"), {})
    m = MEASURED.search(out.read_text())
    calib = {"ready_after_s": res.get("ready_after_s"), "error": res.get("error"),
             "tok_s": (res.get("probe_series") or {}).get("median_tok_s"),
             "max_bs": begin.get("max_bs"), "avail_gb": begin.get("avail_gb"),
             "usage_gb": end.get("usage_gb"), "need_bytes": int(m["need"]) if m else None}
    numbers[f"calibration_{profile}"] = calib
    want = int(profile.rsplit("bs", 1)[-1])
    # SGLang's batch list may stop a little short of the flag; above half of it is what matters.
    checks.append(check(f"calibration: {profile} ready, decode graphs above batch {want // 2} captured",
                        bool(res.get("ready_after_s")) and want // 2 < (calib["max_bs"] or 0) <= want,
                        calib))
    return calib


def _captureoom_supervised(ctx: Context, margin: int, numbers: dict[str, Any],
                           checks: list[dict[str, Any]]) -> float | None:
    """(2) the supervised ladder with the holder on the GPU: capture_oom, derived, READY."""
    profiles = json.loads(json.dumps(CAPTUREOOM_PROFILES))
    if not ctx.real:  # the simulator's OOM, only at batch 512 (the holder needs a GPU)
        profiles[0]["env"] = {"SGLANG_SIM_FAULTS": "capture-fail:decode:oom"
                                                   f"+when=--cuda-graph-max-bs-decode={OOM_MAX_BS}"}
    cfg = ctx.config("captureoom", profiles=profiles)
    cfg["restart"]["derived_steps"] = 3  # 512 -> 64 at most
    work = ctx.work / "captureoom"
    proc, stop_file, out = _holder(ctx, cfg["engine"]["log_file"], "hold", margin, work)
    sup = SupervisorRun(ctx.o.python, cfg, work, "captureoom")
    tps = None
    try:
        ready = sup.wait(lambda: bool(sup.notify.times("READY=1")), ctx.deadline - 80)
        if ready:
            sup.wait(lambda: bool(sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
            series = probe_series(sup.engine_url, 3, ctx.nvml.sm_clock_mhz)
            tps = series["median_tok_s"]
            numbers["derived_probe_series"] = series
        _captureoom_checks(ctx, sup, ready, tps, numbers=numbers, checks=checks)
        numbers["sigterm"] = sup.stop(60)
    finally:
        sup.close()
        _holder_stop(proc, stop_file)
    numbers["holder"] = out.read_text()[-2000:]
    if ctx.real:
        checks.append(check("the holder took the memory at a start's `Memory pool end`",
                            "grabbed" in numbers["holder"], numbers["holder"][-400:]))
    return tps


def _captureoom_checks(ctx: Context, sup: SupervisorRun, ready: bool, tps: float | None, *,
                       numbers: dict[str, Any], checks: list[dict[str, Any]]) -> None:
    failed = sup.named("engine.failed")
    derived = [d for _, d in sup.named("profile.derived")]
    readies = sup.named("supervisor.ready")
    spawned = [d.get("profile") for _, d in sup.named("engine.spawned")]
    ready_profile = readies[0][1].get("profile") if readies else None
    first = failed[0][1] if failed else {}
    numbers.update({"failed": [d for _, d in failed], "derived": derived, "spawned": spawned,
                    "ready_profile": ready_profile, "derived_tok_s": tps,
                    "status_attempts": sup.status().get("attempts")})
    checks.append(check("attempt 1 (graphs-bs512) failed with capture_oom",
                        first.get("profile") == "graphs-bs512"
                        and first.get("failure_class") == "capture_oom", first))
    checks.append(check("the failure is SGLang's capture OOM text",
                        "out of memory" in str(first.get("message", "")).lower()
                        or "Capture cuda graph failed" in str(first.get("message", "")),
                        str(first.get("message", ""))[:300]))
    checks.append(check("profile.derived: graphs-bs512 -> graphs-bs512-graph-bs-256 first",
                        bool(derived) and derived[0].get("to_profile") == "graphs-bs512-graph-bs-256"
                        and derived[0].get("change") == "--cuda-graph-max-bs-decode 512 -> 256",
                        derived[:1]))
    checks.append(check("READY on a derived profile (not the written no-graph rung)",
                        ready and str(ready_profile).startswith("graphs-bs512-graph-bs-")
                        and "no-graphs" not in spawned, {"ready": ready_profile, "spawned": spawned}))
    # The serving engine's own capture lines: decode graphs on, at the derived max batch.
    lines = sup.tail.lines
    loads = [i for i, (_, x) in enumerate(lines) if "Load weight begin" in x]
    last = decode_captures(lines[loads[-1]:] if loads else lines)
    want = int(str(ready_profile).rsplit("-", 1)[-1]) if ready_profile and ready else None
    begin = next((c for c in last if c["state"] == "begin"), {})
    checks.append(check("the serving engine captured decode graphs at the derived max batch",
                        want is not None and want // 2 < (begin.get("max_bs") or 0) <= want
                        and any(c["state"] == "end" for c in last), {"want": want, "captures": last}))
    checks.append(check("derived tok/s measured", bool(tps), tps))
# -- scenario 13: output fidelity (issue 23) -------------------------------------------------
