"""Scenario ab, s9_ab (or s9_ab_seed with --ab-model seed): supervised vs hand-launched decode tok/s,
A/B/A/B, the same argv and probes."""

from __future__ import annotations

import statistics
import time
from typing import Any

import seedshape

from .adapters import SupervisorRun, probe_series
from .bigmodel import big_config
from .common import check
from .context import Context
from .seed import seed_config, seed_model

# The seed-shape A/B keeps the supervisor's periodic probes running while it measures.
SEED_AB_PROBE_INTERVAL_S = 10


def seed_ab_config(ctx: Context, name: str) -> dict[str, Any]:
    """The seed scenario's configuration (qwen.yaml adapted, see s7) with the supervisor's
    periodic probes every SEED_AB_PROBE_INTERVAL_S, so that they run during the measurement."""
    cfg = seed_config(ctx, ctx.work / name, seed_model(ctx)[0])
    cfg["probe"]["interval_s"] = SEED_AB_PROBE_INTERVAL_S
    return cfg


def s9_ab(ctx: Context) -> None:
    """Hand-launched (stdout to a file) vs supervised, alternating, the same argv and probes.
    `--ab-model seed`: on the seed's shape (speculative decoding, qwen.yaml's `tuned`), as s9_ab_seed."""
    seed = ctx.o.ab_model == "seed"
    name = "s9_ab_seed" if seed else "s9_ab"
    need = 320 if ctx.real else 40
    if ctx.left() < need:
        ctx.skip(name, f"budget: {ctx.left():.0f} s left, {need} s needed")
        return
    runs = ctx.o.ab_probes
    arms = measure_arms(ctx, seed, runs)
    hand = [a["median"] for a in arms if a["arm"] == "hand" and a.get("median")]
    sup_m = [a["median"] for a in arms if a["arm"] == "supervised" and a.get("median")]
    ratio = round(statistics.mean(sup_m) / statistics.mean(hand), 4) if hand and sup_m else None
    numbers = {"probes_per_arm": runs, "arms": arms, "hand_medians": hand, "supervised_medians": sup_m,
               "ratio_supervised_over_hand": ratio,
               # ~8.19B bf16 parameters read per token at the 4.3 TB/s copy rate measured on this GPU kind
               "copy_bandwidth_ceiling_tok_s": round(4.3e12 / (2 * 8.19e9), 1) if ctx.real and not seed else None}
    if seed:
        numbers["supervisor_probe_interval_s"] = SEED_AB_PROBE_INTERVAL_S
        numbers["adaptations"] = seedshape.adaptations(seed_ab_config(ctx, "ab-adaptations"))
    checks = [check("two hand and two supervised arms measured", len(hand) == 2 and len(sup_m) == 2,
                    {"hand": hand, "supervised": sup_m}),
              check("supervised / hand-launched >= 0.98", ratio is not None and ratio >= 0.98, ratio)]
    if seed:
        checks.append(check("every supervised arm served qwen.yaml's tuned profile",
                            all(a.get("profile") == "tuned" for a in arms if a["arm"] == "supervised"),
                            [a.get("profile") for a in arms if a["arm"] == "supervised"]))
    if not ctx.real:
        checks = [c for c in checks if "0.98" not in c["name"]]  # a shared CPU measures the neighbours
    ctx.record(name, checks, numbers)


def measure_arms(ctx: Context, seed: bool, runs: int) -> list[dict[str, Any]]:
    """The four arms, hand / supervised / hand / supervised, each a fresh start of the same
    configuration; stops at the first arm the budget has no room for."""
    profiles = [{"name": "decode-graphs", "description": "Decode CUDA graphs, prefill eager."}]
    profile = "tuned" if seed else "decode-graphs"
    arms: list[dict[str, Any]] = []
    for i, arm in enumerate(["hand", "supervised", "hand", "supervised"]):
        if ctx.left() < (110 if ctx.real else 10):
            arms.append({"arm": arm, "skipped": f"{ctx.left():.0f} s left"})
            break
        cfg = seed_ab_config(ctx, f"ab{i}") if seed else big_config(ctx, f"ab{i}", profiles)
        if arm == "hand":
            arms.append(hand_arm(ctx, cfg, i, profile, runs))
        else:
            arms.append(supervised_arm(ctx, cfg, i, runs))
    return arms


def hand_arm(ctx: Context, cfg: dict[str, Any], i: int, profile: str, runs: int) -> dict[str, Any]:
    """Arm `i`: `profile`'s argv started by hand, stdout to a file, `runs` streamed probes."""
    res = ctx.hand_launch(cfg, profile=profile, log_name=f"ab{i}-hand-engine.log", runs=runs)
    series = res.get("probe_series") or {}
    return {"arm": "hand", "i": i, "ready_s": res.get("ready_after_s"),
            "tok_s": [r["decode_tok_s"] for r in series.get("runs", [])],
            "median": series.get("median_tok_s"), "error": res.get("error")}


def supervised_arm(ctx: Context, cfg: dict[str, Any], i: int, runs: int) -> dict[str, Any]:
    """Arm `i`: the supervisor starts `cfg`; after READY, `runs` streamed probes while its own
    periodic probes go on (counted), then SIGTERM."""
    t0 = time.time()
    sup = SupervisorRun(ctx.o.python, cfg, ctx.work / f"ab{i}", f"ab{i}")
    try:
        ok = sup.wait(lambda: bool(sup.notify.times("READY=1")), min(ctx.deadline - 60, t0 + 300))
        rec: dict[str, Any] = {"arm": "supervised", "i": i,
                               "ready_s": round(time.time() - t0, 1) if ok else None}
        readies = sup.named("supervisor.ready")
        rec["profile"] = readies[0][1].get("profile") if readies else None
        if ok:
            series = probe_series(sup.engine_url, runs, ctx.nvml.sm_clock_mhz)
            rec.update({"tok_s": [r["decode_tok_s"] for r in series["runs"]],
                        "median": series["median_tok_s"]})
        rec["supervisor_probes_during"] = len([1 for t, _ in sup.named("probe.ok") if t > t0])
        rec["stop"] = sup.stop(60)
        return rec
    finally:
        sup.close()
        time.sleep(2)
