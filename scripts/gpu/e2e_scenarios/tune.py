"""Scenario tune, s6_tune (issue 16, item 4): `tune` over the ladder on the ~8B model vs a
hand-measured order of the same profiles, then `run` on the same state starts the winner."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import statistics
import subprocess
import time
from typing import Any

import yaml

from .adapters import SupervisorRun
from .bigmodel import big_config
from .common import LOG_LAG_S, PROFILES, check
from .context import Context

# Two profiles whose hand-measured decode medians differ by less than this are a tie: the A/B
# scenario resolves about 0.1 % between launches of one argv, the probes of one launch spread ~1.5 %.
TIE_FRACTION = 0.02


def ranking_disagreements(tune_order: list[str], hand_tps: dict[str, float],
                          tie: float = TIE_FRACTION) -> list[str]:
    """Pairs that the hand measurement orders clearly (more than `tie` apart) and `tune` orders the
    other way, or a hand-measured profile that tune did not rank at all. Empty: they agree."""
    out = [f"{p}: measured by hand, not ranked by tune" for p in hand_tps if p not in tune_order]
    ranked = [p for p in tune_order if p in hand_tps]
    for i, a in enumerate(ranked):
        for b in ranked[i + 1:]:
            if hand_tps[b] > hand_tps[a] * (1 + tie):
                out.append(f"tune ranks {a} above {b}, by hand {b} ({hand_tps[b]:.1f}) beats {a} "
                           f"({hand_tps[a]:.1f}) by more than {tie:.0%}")
    return out


def s6_tune(ctx: Context) -> None:
    """Item 4 of issue 16: `tune` over the ladder (graphs, no-prefill-graph, eager) on the
    GPU-bound ~8B model; its ranking against a hand-measured order of the same profiles (the
    same argv started by hand, streamed probes); then `run` on the same state directory must
    start tune's winner. Hand launches go first: they also compile the prefill graph's kernels,
    so no profile's tune start pays a first-time JIT."""
    if importlib.util.find_spec("sglang_supervisor.commands.tune") is None:
        ctx.skip("s6_tune", "not run: sglang_supervisor/commands/tune.py does not exist in this checkout")
        return
    need = 420 if ctx.real else 40
    if ctx.left() < need:
        ctx.skip("s6_tune", f"not run: budget ({ctx.left():.0f} s left, {need} s needed)")
        return
    cfg = tune_config(ctx)
    names = [p["name"] for p in PROFILES]
    rounds = max(3, ctx.o.probe_runs)
    numbers: dict[str, Any] = {"profiles": names, "rounds": rounds}
    hand = measure_by_hand(ctx, cfg, names, rounds)
    numbers["hand"] = hand
    hand_tps = {n: float(h["median_tok_s"]) for n, h in hand.items() if h.get("median_tok_s")}
    numbers["hand_order"] = sorted(hand_tps, key=lambda n: -hand_tps[n])
    rc, out, err, wall = run_tune(ctx, cfg, rounds)
    numbers["tune_wall_s"] = wall
    numbers["tune_progress"] = err.splitlines()[-30:]
    doc: Any = None
    with contextlib.suppress(ValueError):
        doc = json.loads(out)
    winner = doc.get("winner") if isinstance(doc, dict) else None
    numbers["tune"] = doc
    checks = ranking_checks(ctx, rc, doc, hand_tps, names=names, numbers=numbers)
    # `run` on the same state directory starts the winner (READY in ~56 s on the H200, warm JIT).
    if winner and ctx.left() > (75 if ctx.real else 15):
        checks += run_starts_the_winner(ctx, cfg, winner, numbers)
    else:
        checks.append(check("run of the winner fitted the budget", False,
                            {"winner": winner, "left_s": round(ctx.left())}))
    ctx.record("s6_tune", checks, numbers)


def tune_config(ctx: Context) -> dict[str, Any]:
    """The ~8B model's configuration with the whole ladder, the prefill graph left to the ladder."""
    cfg = big_config(ctx, "tune", PROFILES)
    # The ladder itself decides the prefill graph here (BIG_ARGS keeps it off for the A/B).
    cfg["engine"]["args"].pop("cuda-graph-backend-prefill", None)
    cfg["probe"].update({"max_new_tokens": 256})
    return cfg


def measure_by_hand(ctx: Context, cfg: dict[str, Any], names: list[str],
                    rounds: int) -> dict[str, dict[str, Any]]:
    """Each profile's argv started by hand, `rounds` streamed probes: decode and TTFT medians."""
    hand: dict[str, dict[str, Any]] = {}
    for name in names:
        if ctx.left() < (250 if ctx.real else 20):  # tune's three starts and run's one
            hand[name] = {"skipped": f"{ctx.left():.0f} s left"}
            continue
        res = ctx.hand_launch(cfg, profile=name, log_name=f"tune-hand-{name}.log", runs=rounds)
        series = res.get("probe_series") or {}
        ttfts = [r["ttft_s"] for r in series.get("runs", []) if r.get("ttft_s") is not None]
        hand[name] = {"ready_s": res.get("ready_after_s"), "median_tok_s": series.get("median_tok_s"),
                      "tok_s": [r["decode_tok_s"] for r in series.get("runs", [])],
                      "ttft_median_s": statistics.median(ttfts) if ttfts else None,
                      "error": res.get("error")}
    return hand


def run_tune(ctx: Context, cfg: dict[str, Any], rounds: int) -> tuple[Any, str, str, float]:
    """`sglang_supervisor tune --json` on `cfg` within the budget: (rc or "timeout", stdout,
    stderr, wall seconds)."""
    path = ctx.work / "tune" / "tune.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    t0 = time.time()
    rc: Any
    try:
        r = subprocess.run([ctx.o.python, "-m", "sglang_supervisor", "tune", "--config", str(path),
                            "--rounds", str(rounds), "--json"], capture_output=True, text=True,
                           timeout=max(10, ctx.left() - (90 if ctx.real else 10)), check=False)
        out, err, rc = r.stdout, r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc = "timeout"
    return rc, out, err, round(time.time() - t0, 1)


def ranking_checks(ctx: Context, rc: Any, doc: Any, hand_tps: dict[str, float], *, names: list[str],
                   numbers: dict[str, Any]) -> list[dict[str, Any]]:
    """tune's exit and ranking against the hand-measured medians; adds tune_order and
    tune_over_hand to `numbers`."""
    ranking = doc.get("ranking", []) if isinstance(doc, dict) else []
    tune_order = [e["profile"] for e in ranking if e.get("decode_tps_p50") is not None]
    numbers["tune_order"] = tune_order
    numbers["tune_over_hand"] = {
        e["profile"]: round(e["decode_tps_p50"] / hand_tps[e["profile"]], 4)
        for e in ranking if e.get("decode_tps_p50") and e["profile"] in hand_tps}
    checks = [check("tune exit 0", rc == 0, rc),
              check("tune ranked every profile of the ladder", len(tune_order) == len(names), tune_order),
              check("every profile measured by hand", len(hand_tps) == len(names), numbers["hand_order"])]
    if ctx.real:  # on a shared CPU the order measures the neighbours
        bad = ranking_disagreements(tune_order, hand_tps)
        checks.append(check(f"tune's order agrees with the hand-measured order (ties: < {TIE_FRACTION:.0%})",
                            bool(tune_order) and len(hand_tps) == len(names) and not bad,
                            bad or {"tune": tune_order, "hand": numbers["hand_order"]}))
    return checks


def run_starts_the_winner(ctx: Context, cfg: dict[str, Any], winner: str,
                          numbers: dict[str, Any]) -> list[dict[str, Any]]:
    """`run` on tune's state directory: it spawns the winner first and is READY on it. Adds
    numbers["run"]."""
    checks: list[dict[str, Any]] = []
    sup = SupervisorRun(ctx.o.python, cfg, ctx.work / "tune-run", "tune-run")
    try:
        ok = sup.wait(lambda: bool(sup.notify.times("READY=1")), ctx.deadline - 5)
        if ok:
            sup.wait(lambda: bool(sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
        spawned = [d.get("profile") for _, d in sup.named("engine.spawned")]
        readies = sup.named("supervisor.ready")
        numbers["run"] = {"spawned": spawned, "ready": readies[0][1] if readies else None,
                          "launch_to_READY_s": round(sup.notify.times("READY=1")[0] - sup.t0, 1)
                          if ok else None}
        checks.append(check("run started tune's winner first", spawned[:1] == [winner],
                            {"winner": winner, "spawned": spawned}))
        checks.append(check("run READY on the winner", ok and bool(readies)
                            and readies[0][1].get("profile") == winner, numbers["run"]["ready"]))
        numbers["run"]["stop"] = sup.stop(60)
    finally:
        sup.close()
    return checks
