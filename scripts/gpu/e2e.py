"""End-to-end proof of the supervisor on a real engine (issue 8), or on the simulator.

Run by `scripts/gpu-e2e`, which prepares the environment (overlay, tiny model, PYTHONPATH). This
file drives the supervisor exactly as systemd would (`sglang-supervisor run` with a NOTIFY_SOCKET
that this script owns) and checks, from the outside, what it did:

  s1_ready_gate      every capture line detected; READY=1 only after capture, ready line and probe
  s2_throughput      probe tok/s vs SGLang's own numbers, and vs a hand-launched server (same argv)
  s3_fallback        a real start failure -> classified -> next profile -> READY
  s4_restart_stop    SIGKILL of a scheduler -> restart; SIGTERM -> bounded drain, nothing left
  s5_doctor_metrics  `doctor` and the NVML gauges of the metrics endpoint on the real GPU
  s6_tune            `tune` over the ladder on the ~8B model vs a hand-measured order; run starts the winner
  s7_seed_shape      qwen.yaml's ladder (tuned first) on a tiny model of the seed's architecture
  s8_systemd         the shipped unit, hardening unchanged, under a carried real systemd (GPU machine)
  s9_ab              supervised vs hand-launched decode tok/s, A/B/A/B, on a GPU-bound ~8B dummy model
  s10_regression     a foreign matmul loop on the same GPU: explained once, its end once, no restart
  s12_unexplained    a foreign agent stutters the scheduler (SIGSTOP/SIGCONT): restart, next profile, keep faster
  s13_warmcache      kernel caches under CACHE_DIRECTORY: cold start, restart, SIGKILL, fallback; each warm
                     start <= 0.5 x cold (issue 26; the unit's PrivateTmp/ProtectHome emulated per start)
  s15_captureoom     a foreign holder leaves memory for decode graphs up to 256, not 512: a real capture OOM,
                     healed by a derived profile with half the batch (graphs kept), vs the no-graph rung
  s14_canary         the upgrade canary between two real releases: 0.5.16 serves, 0.5.17 checked and
                     promoted, then 0.5.16 on trial under a foreign GPU load: rolled back (issue 24)

Writes OUT/report.json, OUT/report.md and OUT/logs.tar.xz. Stdlib + the supervisor package only.
"""
# This file is the runner (options, the scenario order, the report's end); each scenario is a
# module of e2e_scenarios/ beside it, their shared parts in e2e_scenarios/{common,adapters,context}.py.

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script (scripts/gpu-e2e) or imported (tests): either way e2e_scenarios, seedshape and
# warmcache are found beside this file, with nothing installed.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_scenarios import (
    ab,
    canary,
    captureoom,
    fallback,
    fidelity,
    hand,
    multinode,
    regress,
    seed,
    systemd,
    tune,
    warm,
)
from e2e_scenarios.adapters import sglang_procs
from e2e_scenarios.context import Context
from e2e_scenarios.main import main_run

# --only's names, in the order --help lists them (a run follows the order --only gives).
SCENARIOS: dict[str, Callable[[Context], None]] = {
    "main": main_run, "fallback": fallback.s3_fallback, "pipe": hand.s2b_pipe,
    "tune": tune.s6_tune, "hand": hand.s2a_hand_first, "seed": seed.s7_seed_shape,
    "systemd": systemd.s8_systemd, "ab": ab.s9_ab, "regress": regress.s10_regression,
    "unexplained": regress.s12_unexplained, "warmcache": warm.s13_warmcache,
    "captureoom": captureoom.s15_captureoom, "multinode": multinode.s11_multinode,
    "canary": canary.s14_canary, "fidelity": fidelity.s16_fidelity,
}
DEFAULT_ONLY = "main,fallback,pipe,tune"


# The options of single scenarios, in --help's order: (flag, argparse keywords, help).
SCENARIO_OPTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("--ab-probes", {"type": int, "default": 15}, "s9_ab: streamed 256-token probes per arm"),
    ("--ab-model", {"choices": ["big", "seed"], "default": "big"},
     "s9_ab: the ~8B dense dummy model (big) or the seed's tiny hybrid shape with MTP "
     "(seed: qwen.yaml's tuned, with --seed-drop; reported as s9_ab_seed)"),
    ("--seed-hand", {"action": "store_true"},
     "s7_seed_shape: also hand-launch the profile that became ready (same argv, same probes)"),
    ("--seed-drop", {"default": ""},
     "seed scenarios: comma-separated flags taken out of every qwen.yaml profile"),
    ("--seed-model", {"default": "/tmp/tiny36"},
     "seed scenario: model directory (real; made by make_tiny_qwen36.py if absent)"),
    ("--systemd-restart", {"action": "store_true"},
     "s8_systemd: also time `systemctl restart` to READY against the unit's first start "
     "(real PrivateTmp, the kernel caches under CacheDirectory; issue 26)"),
    ("--oom-margin-gb", {"type": float, "default": None},
     "captureoom: GB the holder leaves free at each start's `Memory pool end` (default: "
     "halfway between what the decode graphs needed at batch 512 and at 256, measured "
     "in two calibration starts; the flag skips the 256 one)"),
    ("--canary-rollback-only", {"action": "store_true"},
     "canary: skip steps 1-3 (0.5.16 serves, promoted to 0.5.17): the supervisor starts on 0.5.17, "
     "then step 4b alone (0.5.16 on trial under the foreign load, rolled back)"),
    ("--nnodes", {"type": int, "default": 1},
     "2: the multi-node scenario, two supervisors on one host, --tp/2 GPUs each"),
    ("--dist-init-addr", {"default": "127.0.0.1"},
     "host of the leader's dist-init store and group link (ports are picked)"),
]


def run(ctx: Context) -> int:
    for name in ctx.o.only.split(","):
        try:
            SCENARIOS[name](ctx)
        except Exception as exc:
            ctx.report.setdefault("errors", []).append(f"{name}: {type(exc).__name__}: {exc}")
            ctx.save()
    ctx.report["left_sglang_processes"] = [p["cmd"][:60] for p in sglang_procs()]
    ctx.save()
    pack_logs(ctx.out, ctx.work)
    failed = [n for n, s in ctx.report["scenarios"].items() if s["status"] == "fail"]
    print(json.dumps({n: s["status"] for n, s in ctx.report["scenarios"].items()}), flush=True)
    return 1 if failed or ctx.report.get("errors") else 0


def pack_logs(out: Path, work: Path) -> None:
    with tarfile.open(out / "logs.tar.xz", "w:xz") as tar:
        for p in sorted(work.rglob("*")):
            if p.relative_to(work).parts[0] == "warmcache":
                continue  # the kernel caches of s13 (Triton's *.json among them), not logs
            if (p.is_file() and p.suffix in (".log", ".yaml", ".json")) or p.name.startswith("engine.log"):
                tar.add(p, arcname=str(p.relative_to(work)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=["real", "sim"], default="real")
    p.add_argument("--model", default="/tmp/tiny", help="model directory (real) or name (sim)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size (GPUs)")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-e2e-out"))
    p.add_argument("--workdir", default="/tmp/gpu-e2e")
    p.add_argument("--budget-s", type=float, default=500.0, help="wall-clock budget for all scenarios")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs the supervisor")
    p.add_argument("--engine-python", default=sys.executable, help="interpreter that runs SGLang")
    p.add_argument("--probe-runs", type=int, default=5)
    p.add_argument("--throughput-ab", action="store_true",
                   help="main run only measures tok/s and stops (for --only hand,main,pipe)")
    p.add_argument("--time-scale", type=float, default=0.02, help="simulator clock scale")
    p.add_argument("--only", default=None,
                   help=f"comma-separated, in order: {','.join(SCENARIOS)} "
                        f"(default: {DEFAULT_ONLY}; with --nnodes 2: multinode)")
    for flag, kw, text in SCENARIO_OPTIONS:
        p.add_argument(flag, help=text, **kw)
    opts = p.parse_args(argv)
    if opts.only is None:
        opts.only = "multinode" if opts.nnodes > 1 else DEFAULT_ONLY
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.tp < 1:
        print("gpu-e2e: --tp must be at least 1", file=sys.stderr)
        return 2
    shutil.rmtree(opts.workdir, ignore_errors=True)
    return run(Context(opts))


if __name__ == "__main__":
    sys.exit(main())
