"""Scenario seed, s7_seed_shape: qwen.yaml's ladder (tuned first) on a tiny model of the seed's
architecture (scripts/gpu/seedshape.py adapts it); also the seed model and configuration that
scenarios systemd and ab (--ab-model seed) start."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import seedshape
import yaml

from .adapters import SupervisorRun, concurrent_streams, free_port, http, probe_series, proc_net
from .common import GPU_SCRIPTS, LOG_LAG_S, SGLANG_VERSION, check, decode_gen_throughputs
from .context import Context


def seed_drop(ctx: Context) -> tuple[str, ...]:
    return tuple(f for f in ctx.o.seed_drop.split(",") if f)


def seed_model(ctx: Context) -> tuple[str, str | None]:
    """The seed-shape model (real: made by make_tiny_qwen36.py if absent) and what making it said."""
    model = ctx.o.seed_model if ctx.real else seedshape.SIM_MODEL
    made = None
    if ctx.real and not (Path(model) / "config.json").exists():
        r = subprocess.run([ctx.o.engine_python, str(GPU_SCRIPTS / "make_tiny_qwen36.py"), model],
                           capture_output=True, text=True, timeout=300, check=False)
        made = (r.stdout or r.stderr)[-600:]
    return model, made


def seed_config(ctx: Context, work: Path, model: str) -> dict[str, Any]:
    """qwen.yaml adapted to this machine (scripts/gpu/seedshape.py), its files under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    # The simulated GPU is the device's H200 (SM 9.0): it refuses SBO as real 0.5.17 does there.
    sim_env = {"SGLANG_SIM_VERSION": SGLANG_VERSION, "SGLANG_SIM_TIME_SCALE": f"{ctx.o.time_scale:g}",
               "SGLANG_SIM_GPU_SM": "9.0"}
    return seedshape.seed_config(engine=ctx.o.engine, python=ctx.o.engine_python, model=model,
                                 port=free_port(), metrics_port=free_port(), workdir=work, sim_env=sim_env,
                                 drop=seed_drop(ctx))


def supervisor_events(sup: SupervisorRun, lines: list[str]) -> dict[str, Any]:
    """What the supervisor logged of the ladder: attempts, failures, fallbacks, derived profiles,
    captures (also as the engine log has them)."""
    out: dict[str, Any] = {}
    out["attempts"] = [
        {"profile": d.get("profile"), "attempt": d.get("attempt")} for _, d in sup.named("engine.spawned")]
    out["failures"] = [{k: d.get(k) for k in ("profile", "failure_class", "message")}
                       for _, d in sup.named("engine.failed")]
    out["fallbacks"] = [{k: d.get(k) for k in ("from_profile", "to_profile", "failure_class", "rule")}
                        for _, d in sup.named("profile.fallback")]
    out["derived"] = [{k: d.get(k) for k in ("from_profile", "to_profile", "change", "asked_by")}
                      for _, d in sup.named("profile.derived")]
    out["captures_supervisor"] = [
        f"{d.get('profile')}: {d.get('owner')} {d.get('graph')} {d.get('seconds')} s"
        for _, d in sup.named("engine.capture_end")]
    out["capture_lines"] = seedshape.capture_sequence(lines)
    out["prefill_graph_disabled"] = [d.get("reason") for _, d in sup.named("engine.prefill_graph_disabled")]
    out["failure_lines"] = [d.get("message") for _, d in sup.named("engine.failure_line")][:6]
    return out


def measure_serving(ctx: Context, sup: SupervisorRun, numbers: dict[str, Any],
                    checks: list[dict[str, Any]]) -> None:
    """The ready engine: probes, 8 concurrent streams (`Decode batch` lines, NEXTN accept lengths),
    /server_info, the ports it listens on."""
    base = sup.engine_url
    series = probe_series(base, ctx.o.probe_runs, ctx.nvml.sm_clock_mhz)
    t = time.time()
    concurrent_streams(base)
    after = [text for tt, text in sup.tail.lines if tt >= t - 60]
    numbers["probe_series"] = series
    numbers["accept_len"] = seedshape.accept_lengths([text for _, text in sup.tail.lines])[-12:]
    numbers["decode_gen_tok_s"] = decode_gen_throughputs([(0.0, x) for x in after])[-6:]
    _, body = http(base + "/server_info", timeout=20)
    with contextlib.suppress(ValueError, TypeError, AttributeError, IndexError):
        info = json.loads(body)
        states = info.get("internal_states") or [{}]
        numbers["server_info"] = {k: states[0].get(k) for k in
                                  ("avg_spec_accept_length", "last_gen_throughput")}
        numbers["server_info"].update({k: info.get(k) for k in (
            "language_only", "speculative_algorithm", "cuda_graph_backend_prefill",
            "mamba_radix_cache_strategy", "enable_single_batch_overlap")})
    numbers["listening_8997"] = 8997 in seedshape.listening_ports(proc_net())
    checks.append(check("NEXTN accept length logged", bool(numbers["accept_len"]),
                        numbers["accept_len"][-3:]))


def s7_seed_shape(ctx: Context) -> None:
    need = 240 if ctx.real else 40
    if ctx.left() < need:
        ctx.skip("s7_seed_shape", f"budget: {ctx.left():.0f} s left, {need} s needed")
        return
    work = ctx.work / "seed"
    model, made = seed_model(ctx)
    cfg = seed_config(ctx, work, model)
    numbers: dict[str, Any] = {"model_made": made, "adaptations": seedshape.adaptations(cfg)}
    from sglang_supervisor.core.profiles import REDACTED, default_secret_config_path, render
    from sglang_supervisor.shell.files.configfile import parse_checked
    parsed = parse_checked(yaml.safe_dump(cfg), "seed.yaml")
    secret_path = default_secret_config_path(parsed, os.environ)
    numbers["rendered"] = {p.name: render(parsed, p.name, SGLANG_VERSION, python=ctx.o.engine_python,
                                          api_key=REDACTED, secret_config_path=secret_path).argv[3:]
                           for p in parsed.profiles}
    sup = SupervisorRun(ctx.o.python, cfg, work, "seed")
    checks: list[dict[str, Any]] = []
    try:
        reserve = 150 if ctx.real else 15
        ready = sup.wait(lambda: bool(sup.notify.times("READY=1")), ctx.deadline - reserve)
        if ready:
            sup.wait(lambda: bool(sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
        lines = [text for _, text in sup.tail.lines]
        readies = sup.named("supervisor.ready")
        numbers.update(supervisor_events(sup, lines))
        numbers["ready"] = readies[0][1] if readies else None
        numbers["launch_to_READY_s"] = round(sup.notify.times("READY=1")[0] - sup.t0, 1) if ready else None
        checks.append(check("READY=1 on some rung of the ladder", ready, numbers["ready"]))
        checks.append(check("every capture line read by the supervisor",
                            len(sup.named("engine.capture_end")) == sum(
                                1 for c in numbers["capture_lines"] if c.endswith(" end")),
                            {"supervisor": len(sup.named("engine.capture_end")),
                             "log": len(numbers["capture_lines"])}))
        if numbers["failures"]:
            classes = [f["failure_class"] for f in numbers["failures"]]
            checks.append(check("no start failure classified as unknown", "unknown" not in classes, classes))
        lang = [text[:200] for text in lines if "server_args=" not in text and (
            "language-only" in text or "EncoderBootstrap" in text
            or ("encoder" in text.lower() and "bootstrap" in text.lower()))]
        numbers["language_only_lines"] = lang[:6]
        if ready:
            measure_serving(ctx, sup, numbers, checks)
        rc, secs = sup.stop(60)
        numbers["sigterm"] = {"rc": rc, "seconds": secs}
        checks.append(check("supervisor exits 0 on SIGTERM", rc == 0, rc))
        prof = (numbers["ready"] or {}).get("profile")
        if ctx.o.seed_hand and ready and prof and ctx.left() > (150 if ctx.real else 15):
            hand = ctx.hand_launch(cfg, profile=prof, log_name="seed-hand-engine.log")
            numbers["hand"] = hand
            hmed = (hand.get("probe_series") or {}).get("median_tok_s")
            smed = numbers["probe_series"]["median_tok_s"]
            numbers["supervised_over_hand"] = round(smed / hmed, 4) if smed and hmed else None
    finally:
        sup.close()
    ctx.record("s7_seed_shape", checks, numbers)

# -- scenario 8: the shipped unit under real systemd ------------------------------------
