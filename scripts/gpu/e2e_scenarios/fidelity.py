"""Scenario fidelity, s16_fidelity (issue 23): the output-fidelity reference under eager, then a
CUDA-graph start, a repeat, and a copy of the checkpoint with one layer damaged on disk."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from .adapters import SupervisorRun, free_port
from .common import GPU_SCRIPTS, LOG_LAG_S, build_config, check
from .context import Context

# Scenario 13: the profile the fidelity reference is taken under.
FID_REFERENCE = "eager"


def damage_layer(path: Path) -> dict[str, Any]:
    """Multiply the last decoder layer's MLP down and attention output projections by 256 in a
    safetensors file, in place (+8 on each element's exponent): the checkpoint still loads, the
    layer's contribution swamps the residual stream, the model computes something else. Plain
    bytes (bf16/f32): no torch needed."""
    import array
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    layers = sorted({int(m.group(1)) for k in header if (m := re.match(r"model\.layers\.(\d+)\.", k))})
    if not layers:
        return {"damaged": [], "error": "no model.layers.N tensors"}
    last = layers[-1]
    kinds = {"BF16": ("H", 8 << 7, 0x7F80), "F32": ("I", 8 << 23, 0x7F800000)}  # code, +8 exp, exp mask
    done = []
    for name, meta in header.items():
        if name == "__metadata__" or not name.startswith(f"model.layers.{last}."):
            continue
        if not name.endswith(("mlp.down_proj.weight", "self_attn.o_proj.weight")) or meta["dtype"] not in kinds:
            continue
        code, step, mask = kinds[meta["dtype"]]
        begin, end = (8 + n + o for o in meta["data_offsets"])
        vals = array.array(code, bytes(raw[begin:end]))  # little endian on x86
        for i, v in enumerate(vals):
            exp = v & mask
            if exp and exp + step < mask:  # not zero/subnormal, and no overflow into inf
                vals[i] = v + step
        raw[begin:end] = vals.tobytes()
        done.append(name)
    path.write_bytes(bytes(raw))
    return {"layer": last, "damaged": done, "factor": 256}


def fidelity_model(ctx: Context) -> str:
    """A private copy of the tiny checkpoint (real: its weights are damaged later, in place)."""
    if not ctx.real:
        return ctx.o.model
    src = Path(ctx.o.model)
    if not (src / "model.safetensors").exists():
        src = ctx.work / "fid-src"
        subprocess.run([ctx.o.engine_python, str(GPU_SCRIPTS / "make_tiny_qwen3.py"), str(src)],
                       capture_output=True, timeout=300, check=False)
    dst = ctx.work / "fid-model"
    shutil.copytree(src, dst)
    return str(dst)


def fidelity_run(ctx: Context, name: str, model: str, profiles: list[dict[str, Any]], state_dir: Path,
                 *, faults: str = "") -> dict[str, Any]:
    """One supervised start: READY (or its end), the fidelity events, stopped."""
    cfg = build_config(engine=ctx.o.engine, python=ctx.o.engine_python, model=model, port=free_port(),
                       metrics_port=free_port(), workdir=ctx.work / name, tp=ctx.o.tp,
                       time_scale=ctx.o.time_scale, profiles=copy.deepcopy(profiles))
    # One reference for every run (copied from the first run's state), but each run its own
    # memory of failed profiles: a mismatch in one run must not skip the profile in the next.
    if state_dir != ctx.work / name / "state" and (state_dir / "fidelity").is_dir():
        shutil.copytree(state_dir / "fidelity", ctx.work / name / "state" / "fidelity")
    cfg["state_dir"] = str(ctx.work / name / "state")
    # The damaged run's ladder is graphs alone: the reference exists, none is taken there.
    cfg["fidelity"] = {"interval_s": 0, **({"reference_profile": FID_REFERENCE}
                                           if any(p["name"] == FID_REFERENCE for p in profiles) else {})}
    if faults:
        cfg["profiles"][0].setdefault("env", {})["SGLANG_SIM_FAULTS"] = faults
    sup = SupervisorRun(ctx.o.python, cfg, ctx.work / name, name)
    out: dict[str, Any] = {}
    try:
        done = lambda: bool(sup.notify.times("READY=1")) or bool(sup.named("fidelity.mismatch"))  # noqa: E731
        sup.wait(done, min(ctx.deadline - 10, time.time() + (200 if ctx.real else 40)))
        sup.wait(lambda: bool(sup.named("fidelity.check") or sup.named("fidelity.reference_taken")
                              or sup.named("fidelity.mismatch")), time.time() + LOG_LAG_S)
        if sup.named("fidelity.mismatch"):  # the ladder's end: the supervisor exits 69
            sup.wait(lambda: bool(sup.named("engine.failed")), time.time() + 60)
        ready = sup.notify.times("READY=1")
        strip = ("level", "timestamp", "event")
        out = {"ready": bool(ready),
               "launch_to_READY_s": round(ready[0] - sup.t0, 1) if ready else None,
               "ready_profile": next((d.get("profile") for _, d in sup.named("supervisor.ready")), None),
               "reference_taken": [d for _, d in sup.named("fidelity.reference_taken")],
               "checks": [{k: v for k, v in d.items() if k not in strip} for _, d in sup.named("fidelity.check")],
               "mismatch": [{k: v for k, v in d.items() if k not in strip}
                            for _, d in sup.named("fidelity.mismatch")],
               "failed": [(d.get("profile"), d.get("failure_class")) for _, d in sup.named("engine.failed")],
               "unavailable": [{k: v for k, v in d.items() if k not in strip}
                               for _, d in sup.named("fidelity.unavailable")],
               "spawned": [d.get("profile") for _, d in sup.named("engine.spawned")],
               "status_fidelity": sup.status().get("fidelity")}
        out["stop"] = sup.stop(60)
    finally:
        sup.close()
    return out


def s16_fidelity(ctx: Context) -> None:
    """Issue 23 item 6: the reference taken under the conservative profile (eager,
    --disable-cuda-graph); a CUDA-graph profile passes, a repeated start passes, a start on
    the same checkpoint with one layer's weights damaged on disk fails with output_mismatch.
    Every check's statistic is recorded (numbers.runs.*.checks) to calibrate the tolerance."""
    need = 230 if ctx.real else 40
    if ctx.left() < need:
        ctx.skip("s16_fidelity", f"budget: {ctx.left():.0f} s left, {need} s needed")
        return
    model = fidelity_model(ctx)
    state_dir = ctx.work / "fid-ref" / "state"  # where the reference is taken
    graphs = {"name": "graphs", "description": "Decode CUDA graphs, prefill eager.",
              "args": {"cuda-graph-backend-prefill": "disabled"}}
    eager = {"name": FID_REFERENCE, "description": "No CUDA graphs at all.",
             "args": {"disable-cuda-graph": True}}
    runs: dict[str, Any] = {}
    checks: list[dict[str, Any]] = []
    runs["reference"] = r = fidelity_run(ctx, "fid-ref", model, [eager], state_dir)
    checks.append(check("reference taken under eager at READY", r.get("ready") and bool(r.get("reference_taken")),
                        r.get("reference_taken")))
    runs["graphs"] = r = fidelity_run(ctx, "fid-graphs", model, [graphs, eager], state_dir)
    checks.append(check("the CUDA-graph profile passes fidelity and is READY",
                        r.get("ready_profile") == "graphs" and any(c.get("result") == "pass"
                                                                   for c in r.get("checks", [])),
                        {"checks": r.get("checks"), "mismatch": r.get("mismatch")}))
    runs["graphs_again"] = r = fidelity_run(ctx, "fid-graphs2", model, [graphs, eager], state_dir)
    checks.append(check("a repeated start of the same profile passes",
                        r.get("ready_profile") == "graphs" and any(c.get("result") == "pass"
                                                                   for c in r.get("checks", [])),
                        {"checks": r.get("checks"), "mismatch": r.get("mismatch")}))
    if ctx.real:
        runs["damaged"] = {"damage": damage_layer(Path(model) / "model.safetensors")}
        faults = ""
    else:
        runs["damaged"] = {"damage": "simulated: garbage-output"}
        faults = "garbage-output"
    runs["damaged"].update(fidelity_run(ctx, "fid-damaged", model, [graphs], state_dir, faults=faults))
    r = runs["damaged"]
    checks.append(check("the damaged start never sent READY", not r.get("ready"), r.get("launch_to_READY_s")))
    checks.append(check("it failed with output_mismatch", ("graphs", "output_mismatch") in
                        [tuple(f) for f in r.get("failed", [])], {"failed": r.get("failed"),
                                                                   "mismatch": r.get("mismatch")}))
    ctx.record("s16_fidelity", checks, {"runs": runs, "model": model})

# -- scenario 6 ------------------------------------------------------------------------------
