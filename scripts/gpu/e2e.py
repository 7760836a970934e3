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

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import seedshape  # noqa: E402
import warmcache  # noqa: E402

SGLANG_VERSION = "0.5.17"
READY_LINE = "The server is fired up and ready to roll"
CAPTURE_LINE = re.compile(r"Capture (?P<owner>target|draft) (?P<graph>[\w-]+) CUDA graph (?P<state>begin|end)")
DECODE_GEN = re.compile(r"Decode batch.*?gen throughput \(token/s\): (?P<tps>[\d.]+)")
# The flags every profile shares on the pruned 0.5.17 install: no FlashAttention-3, no xgrammar.
REAL_ARGS: dict[str, Any] = {
    "attention-backend": "triton",
    "sampling-backend": "pytorch",
    "grammar-backend": "none",
    "mem-fraction-static": 0.3,
    "max-total-tokens": 65536,
    "enable-metrics": True,
    "cuda-graph-max-bs-decode": 16,
}
PROFILES: list[dict[str, Any]] = [
    {"name": "graphs", "description": "CUDA graphs at their defaults (prefill breakable, decode full)."},
    {"name": "no-prefill-graph", "description": "Prefill eager, decode graphs.",
     "args": {"cuda-graph-backend-prefill": "disabled"}},
    {"name": "eager", "description": "No CUDA graphs at all.",
     "args": {"cuda-graph-backend-prefill": "disabled", "cuda-graph-backend-decode": "disabled"}},
]
# Scenarios 9 and 10: an ~8B dense Qwen3 shape with dummy weights. Batch-1 decode is memory-bound
# there (~16 GB of weights read per token), so 2 % is measurable; decode graphs on, prefill eager.
BIG_ARGS: dict[str, Any] = {
    "attention-backend": "triton", "sampling-backend": "pytorch", "grammar-backend": "none",
    "mem-fraction-static": 0.5, "context-length": 8192, "cuda-graph-max-bs-decode": 8,
    "cuda-graph-backend-prefill": "disabled", "load-format": "dummy", "enable-metrics": True,
}
BIG_MODEL = "/tmp/ab8b"
# A foreign CUDA job on the engine's GPU (not a child of the supervisor): bf16 8192^2 matmuls.
HOG = ("import torch,time,sys\na=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16)\n"
       "t=time.time()\nwhile time.time()-t<float(sys.argv[1]):\n  b=a@a\ntorch.cuda.synchronize()\n")

# Scenario 12: the foreign agent's duty cycle (about half of wall time stopped).
STUTTER_STOP_S = 0.1
# The seed-shape A/B keeps the supervisor's periodic probes running while it measures.
SEED_AB_PROBE_INTERVAL_S = 10
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


# Scenario 3's ladder: a memory fraction that leaves no KV cache (a real, fast start failure),
# then eager.
FAIL_FRACTION = 0.0001
NOTIFY_WAIT_S = 2.0


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


# ----------------------------------------------------------------------------- pure helpers

def build_config(*, engine: str, python: str, model: str, port: int, metrics_port: int,
                 workdir: Path, tp: int, time_scale: float,
                 profiles: list[dict[str, Any]] | None = None,
                 remediation: dict[str, str] | None = None) -> dict[str, Any]:
    """The supervisor configuration for one run (plain YAML data)."""
    real = engine == "real"
    args = dict(REAL_ARGS)
    if tp > 1:
        args["tp-size"] = tp
    env: dict[str, str] = {"SGLANG_LOG_MS": "1"}
    if real:
        command = [python, "-m", "sglang.launch_server"]
    else:
        command = ["{python}", "-m", "sglang_supervisor.simulator"]
        env.update({"SGLANG_SIM_VERSION": SGLANG_VERSION, "SGLANG_SIM_TIME_SCALE": f"{time_scale:g}"})
    # Real timeouts are generous (the first prefill capture JIT-compiles for ~80 s without a line);
    # the simulator's clock runs fast, so its run is bounded tightly.
    t = 1.0 if real else 0.25
    return {
        "name": "gpu-e2e",
        "engine": {
            "command": command, "version": SGLANG_VERSION, "model_path": model,
            "host": "127.0.0.1", "port": port, "args": args, "env": env,
            "log_file": str(workdir / "engine.log"), "log_max_bytes": 64 << 20, "log_backups": 1,
        },
        "profiles": profiles if profiles is not None else PROFILES,
        "remediation": remediation if remediation is not None else {"unknown_flag": "stop", "default": "next"},
        "timeouts": {
            "stall_s": 300 * t, "start_s": 420 * t, "ready_probe_s": 60 * t, "drain_s": 20 * t,
            "kill_s": 10 * t, "gpu_release_s": 30 * t, "health_interval_s": 5 * t,
            "health_timeout_s": 20 * t, "health_failures": 3,
        },
        "restart": {"same_profile_retries": 1, "backoff_s": 1.0 * t, "known_bad_ttl_s": 3600},
        # Background probes would disturb the hand measurements: one probe gates READY, then quiet.
        "probe": {"enabled": True, "interval_s": 3600, "input_tokens": 64, "max_new_tokens": 128,
                  "timeout_s": 60, "baseline_runs": 1, "regression_delta": 0.15,
                  "regression_window": 3, "cooldown_s": 3600, "act_on_regression": False},
        "metrics": {"enabled": True, "address": f"127.0.0.1:{metrics_port}"},
        "logging": {"format": "json", "forward_engine_output": True},
        "state_dir": str(workdir / "state"),
        "runtime_dir": str(workdir / "run"),
    }


# The supervisor logs from a writer thread: its `supervisor.ready` record can reach us a little
# after READY=1 on the notify socket.
LOG_LAG_S = 10.0


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


def fail_profiles() -> list[dict[str, Any]]:
    return [
        {"name": "no-kv-room", "description": "Leaves no memory for the KV cache: fails at start.",
         "args": {"mem-fraction-static": FAIL_FRACTION}},
        PROFILES[2],
    ]


# Scenario 14 (the upgrade canary, issue 24): two real releases, each behind an interpreter
# wrapper that puts exactly one of them on PYTHONPATH.
CANARY_OLD, CANARY_NEW = "0.5.16", "0.5.17"
CANARY_SITE16 = "/tmp/site16"
CANARY_PROFILES: list[dict[str, Any]] = [
    {"name": "decode-graphs", "description": "Decode CUDA graphs, prefill eager.",
     "args": {"cuda-graph-backend-prefill": "disabled"}}]
# Launch-to-launch tok/s of the tiny model varies up to ~15 % (docs/gpu-validation, round 6): the
# product's 0.98 is for real models. TTFT of a 64-token prompt is milliseconds: as noisy.
CANARY_MIN_TPS_RATIO = 0.80
CANARY_MAX_TTFT_RATIO = 3.0
# What the simulator's candidate decodes at under the emulated foreign load (the current: 100).
SIM_TPS, SIM_LOADED_TPS = 100, 40
# The release an interpreter sees, and where its `sglang` package is (found, not imported).
_RELEASE_SNIPPET = ("import importlib.metadata as m, importlib.util as u, json; s = u.find_spec('sglang'); "
                    "print(json.dumps({'version': m.version('sglang'), 'file': s.origin if s else None}))")


def release_wrapper(python: str, prepend: list[str], strip: list[str],
                    lines: list[str] | None = None) -> str:
    """A `python` shell wrapper that execs `python` with PYTHONPATH = `prepend` + the inherited
    PYTHONPATH less every entry of `strip` (so it sees exactly one release), after `lines`."""
    drop = " ".join(f"-e {shlex.quote(x)}" for x in strip) or "-e ''"
    head = ":".join(prepend)
    out = ["#!/bin/sh", "# scripts/gpu/e2e.py (canary): one SGLang release on the path",
           f"rest=$(printf '%s' \"${{PYTHONPATH:-}}\" | tr ':' '\\n' | grep -vxF {drop} | paste -sd: -)"]
    if head:
        out.append(f'export PYTHONPATH={shlex.quote(head)}"${{rest:+:$rest}}"')
    else:
        out.append('export PYTHONPATH="$rest"')
    out += list(lines or [])
    out.append(f'exec {shlex.quote(python)} "$@"')
    return "\n".join(out) + "\n"


def write_wrapper(bindir: Path, text: str) -> str:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / "python"
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def capture_lines(lines: list[tuple[float, str]]) -> list[tuple[float, str, str, str]]:
    """(time, owner, graph, begin|end) of every capture line, read with our own regex."""
    out = []
    for t, text in lines:
        m = CAPTURE_LINE.search(text)
        if m:
            out.append((t, m["owner"], m["graph"], m["state"]))
    return out


def decode_gen_throughputs(lines: list[tuple[float, str]]) -> list[float]:
    return [float(m["tps"]) for _, text in lines if (m := DECODE_GEN.search(text))]


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


def check(name: str, ok: bool, detail: Any = None) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def scenario_status(checks: list[dict[str, Any]]) -> str:
    if not checks:
        return "not run"
    return "pass" if all(c["ok"] for c in checks) else "fail"


def render_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    rows = [f"# GPU end-to-end report ({report['engine']} engine)", "",
            f"- date (UTC): {report['date']}", f"- SGLang: {env.get('sglang_version')}",
            f"- GPU: {env.get('gpu')} (CC {env.get('compute_capability')}), driver {env.get('driver')}",
            f"- torch: {env.get('torch')}, python: {env.get('python')}, tp: {report['tp']}",
            f"- wall time: {report.get('wall_s')} s", ""]
    rows += ["| scenario | status | failed checks |", "|---|---|---|"]
    for name, sc in report["scenarios"].items():
        failed = [c["name"] for c in sc.get("checks", []) if not c["ok"]]
        rows.append(f"| {name} | {sc['status']} | {', '.join(failed) or sc.get('note', '')} |")
    for name, sc in report["scenarios"].items():
        rows += ["", f"## {name}: {sc['status']}", ""]
        if sc.get("note"):
            rows += [sc["note"], ""]
        for c in sc.get("checks", []):
            detail = json.dumps(c["detail"], default=str) if c["detail"] is not None else ""
            rows.append(f"- [{'x' if c['ok'] else ' '}] {c['name']}: {detail[:400]}")
        if sc.get("numbers"):
            rows += ["", "```json", json.dumps(sc["numbers"], indent=1, default=str)[:3000], "```"]
    return "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------- adapters

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, body: Any = None, timeout: float = 10.0) -> tuple[int | None, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as f:
            return f.status, f.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:500]
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


def stream_probe(base: str, max_new: int = 256) -> dict[str, Any]:
    """One streamed /generate: decode tok/s from the first to the last chunk (as realrun.py did)."""
    body = {"text": "The capital city of France is", "stream": True,
            "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0}}
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    chunks: list[float] = []
    last: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=120) as f:
        for raw in f:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunks.append(time.perf_counter() - t0)
            last = json.loads(line[5:])
    n = (last.get("meta_info") or {}).get("completion_tokens")
    dec = None
    if n and len(chunks) > 1 and chunks[-1] > chunks[0]:
        dec = (n - 1) / (chunks[-1] - chunks[0])
    return {"ttft_s": chunks[0] if chunks else None, "tokens": n, "decode_tok_s": dec}


def probe_series(base: str, runs: int, clock: Callable[[], float | None] = lambda: None
                 ) -> dict[str, Any]:
    stream_probe(base, 32)  # warm the path; not counted
    each = []
    for _ in range(runs):
        r = stream_probe(base)
        r["sm_clock_mhz_after"] = clock()
        each.append(r)
    tps = [e["decode_tok_s"] for e in each if e["decode_tok_s"]]
    return {"runs": each, "median_tok_s": statistics.median(tps) if tps else None}


def server_info_gen(base: str) -> float | None:
    st, body = http(base + "/server_info", timeout=20)
    if st != 200:
        return None
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
        info = json.loads(body)
        states = info.get("internal_states") or [info]
        v = states[0].get("last_gen_throughput")
        return float(v) if v is not None else None
    return None


def proc_table() -> list[dict[str, Any]]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            comm = (d / "comm").read_text().strip()
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out.append({"pid": int(d.name), "state": fields[0], "ppid": int(fields[1]),
                    "pgid": int(fields[2]), "comm": comm, "cmd": cmd})
    return out


def sglang_procs(zombies: bool = False) -> list[dict[str, Any]]:
    """Live sglang:: processes (or, with zombies=True, the exited-but-unreaped ones)."""
    return [p for p in proc_table() if ("sglang::" in p["cmd"] or p["comm"].startswith("sglang::"))
            and (p["state"] == "Z") == zombies]


def descendants(root: int) -> list[dict[str, Any]]:
    table = proc_table()
    found: list[dict[str, Any]] = []
    frontier = {root}
    while frontier:
        kids = [p for p in table if p["ppid"] in frontier]
        found += kids
        frontier = {p["pid"] for p in kids}
    return found


class Nvml:
    """Used GPU memory per device through NVML; inert without it (simulator machines)."""

    def __init__(self) -> None:
        self.nv: Any = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nv = pynvml
        except Exception:
            self.nv = None

    def used(self, count: int) -> list[int] | None:
        if self.nv is None:
            return None
        return [int(self.nv.nvmlDeviceGetMemoryInfo(self.nv.nvmlDeviceGetHandleByIndex(i)).used)
                for i in range(count)]

    def sm_clock_mhz(self) -> float | None:
        if self.nv is None:
            return None
        h = self.nv.nvmlDeviceGetHandleByIndex(0)
        return float(self.nv.nvmlDeviceGetClockInfo(h, self.nv.NVML_CLOCK_SM))

    def describe(self) -> dict[str, Any]:
        if self.nv is None:
            return {}
        h = self.nv.nvmlDeviceGetHandleByIndex(0)
        name = self.nv.nvmlDeviceGetName(h)
        cc = self.nv.nvmlDeviceGetCudaComputeCapability(h)
        return {"gpu": name.decode() if isinstance(name, bytes) else name,
                "compute_capability": f"{cc[0]}.{cc[1]}",
                "driver": self.nv.nvmlSystemGetDriverVersion(),
                "gpu_count": self.nv.nvmlDeviceGetCount()}


class NotifySocket:
    """The datagram socket systemd would own: records every sd_notify message with its time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.time(), data.decode(errors="replace")))

    def times(self, key: str) -> list[float]:
        return [t for t, m in self.messages if any(line == key for line in m.split("\n"))]

    def close(self) -> None:
        self._stop = True
        self.thread.join(1)
        self.sock.close()


class FileTail:
    """Timestamps each line of a growing file (the engine log the supervisor writes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[tuple[float, str]] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        pos = 0
        buf = b""
        while not self._stop:
            try:
                with self.path.open("rb") as f:
                    f.seek(pos)
                    data = f.read()
            except OSError:
                data = b""
            if data:
                pos += len(data)
                buf += data
                now = time.time()
                parts = re.split(rb"[\r\n]", buf)
                buf = parts.pop()
                self.lines += [(now, p.decode(errors="replace")) for p in parts if p.strip()]
            time.sleep(0.02)

    def since(self, t: float) -> list[tuple[float, str]]:
        return [x for x in self.lines if x[0] >= t]

    def close(self) -> None:
        self._stop = True
        self.thread.join(1)


class SupervisorRun:
    """`sglang-supervisor run` as systemd would start it, with its JSON log captured."""

    def __init__(self, python: str, config: dict[str, Any], workdir: Path, name: str,
                 environ: dict[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.config = config
        self.cfg_path = workdir / f"{name}.yaml"
        self.cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.notify = NotifySocket(workdir / "notify.sock")
        self.tail = FileTail(Path(config["engine"]["log_file"]))
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.log_path = workdir / "supervisor.log"
        self._log = self.log_path.open("w")
        env = dict(os.environ if environ is None else environ, NOTIFY_SOCKET=str(self.notify.path))
        self.t0 = time.time()
        self.proc = subprocess.Popen(
            [python, "-m", "sglang_supervisor", "run", "--config", str(self.cfg_path), "--log-format", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            now = time.time()
            line = raw.decode(errors="replace").rstrip("\n")
            self._log.write(f"{now - self.t0:9.3f} {line}\n")
            self._log.flush()
            try:
                doc = json.loads(line)
            except ValueError:
                doc = {"event": "raw", "text": line}
            if isinstance(doc, dict):
                self.events.append((now, doc))

    @property
    def metrics_url(self) -> str:
        return "http://" + self.config["metrics"]["address"]

    @property
    def engine_url(self) -> str:
        e = self.config["engine"]
        return f"http://{e['host']}:{e['port']}"

    def named(self, event: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, d) for t, d in self.events if d.get("event") == event]

    def status(self) -> dict[str, Any]:
        st, body = http(self.metrics_url + "/status", timeout=5)
        if st != 200:
            return {}
        try:
            doc = json.loads(body)
        except ValueError:
            return {}
        return doc if isinstance(doc, dict) else {}

    def wait(self, pred: Callable[[], bool], deadline: float, step: float = 0.1) -> bool:
        while time.time() < deadline:
            if pred():
                return True
            if self.proc.poll() is not None:
                return bool(pred())
            time.sleep(step)
        return bool(pred())

    def stop(self, timeout: float) -> tuple[int | str, float]:
        t = time.time()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc: int | str = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            rc = f"killed after {timeout:g} s"
            self.proc.wait(10)
        return rc, round(time.time() - t, 2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.stop(30)
        self.reader.join(5)
        self.notify.close()
        self.tail.close()
        self._log.close()


# ----------------------------------------------------------------------------- the scenarios

class E2E:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.o = opts
        self.out = Path(opts.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(opts.workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.t_start = time.time()
        self.deadline = self.t_start + opts.budget_s
        self.real = opts.engine == "real"
        self.nvml = Nvml()
        self.report: dict[str, Any] = {
            "engine": opts.engine, "tp": opts.tp,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "environment": self._environment(), "scenarios": {},
        }
        self.baseline_mem = self.nvml.used(opts.tp)
        self.report["environment"]["gpu_memory_used_baseline_bytes"] = self.baseline_mem
        self.after_restart: dict[str, Any] | None = None

    def left(self) -> float:
        return self.deadline - time.time()

    def _environment(self) -> dict[str, Any]:
        env: dict[str, Any] = {"python": sys.version.split()[0]}
        if self.real:
            from importlib.metadata import PackageNotFoundError, version
            for pkg in ("sglang", "torch", "transformers", "sglang-kernel"):
                with contextlib.suppress(PackageNotFoundError):
                    env[pkg.replace("-", "_") + ("_version" if pkg == "sglang" else "")] = version(pkg)
        else:
            env["sglang_version"] = f"simulator emulating {SGLANG_VERSION}"
        env.update(self.nvml.describe())
        return env

    def config(self, name: str, **kw: Any) -> dict[str, Any]:
        return build_config(engine=self.o.engine, python=self.o.engine_python, model=self.o.model,
                            port=free_port(), metrics_port=free_port(), workdir=self.work / name,
                            tp=self.o.tp, time_scale=self.o.time_scale, **kw)

    def record(self, name: str, checks: list[dict[str, Any]], numbers: dict[str, Any] | None = None,
               note: str = "") -> None:
        self.report["scenarios"][name] = {"status": scenario_status(checks), "checks": checks,
                                          "numbers": numbers or {}, "note": note}
        self.save()

    def skip(self, name: str, note: str) -> None:
        self.report["scenarios"][name] = {"status": "not run", "checks": [], "numbers": {}, "note": note}
        self.save()

    def save(self) -> None:
        self.report["wall_s"] = round(time.time() - self.t_start, 1)
        (self.out / "report.json").write_text(json.dumps(self.report, indent=1, default=str))
        (self.out / "report.md").write_text(render_markdown(self.report))

    # -- scenario 1, 2 (supervised half), 5, 4 on one supervised engine -------------------------

    def main_run(self) -> None:
        cfg = self.config("main")
        sup = SupervisorRun(self.o.python, cfg, self.work / "main", "main")
        try:
            reserve = (80 if self.o.throughput_ab else 200) if self.real else 20
            ready = sup.wait(lambda: bool(sup.notify.times("READY=1")), self.deadline - reserve)
            if ready:  # the JSON log (a writer thread) may trail the notify datagram a little
                sup.wait(lambda: bool(sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
            self.s1_ready_gate(sup, ready)
            if not ready:
                for n in ("s2_throughput", "s4_restart_stop", "s5_doctor_metrics"):
                    self.skip(n, "the supervised engine never became ready (see s1)")
                return
            supervised = self.s2_supervised(sup)
            self.hand_cfg = cfg
            if self.o.throughput_ab:
                rc, secs = sup.stop(60)
                self.record("s2_throughput", [check("supervised probe measured",
                                                    bool(supervised["probe_series"]["median_tok_s"]),
                                                    supervised["probe_series"]["median_tok_s"])],
                            {"supervised": supervised, "sigterm": {"rc": rc, "seconds": secs}},
                            note="A/B run: hand (file) first, then supervised, then hand (pipe)")
                return
            # doctor imports SGLang's parser (seconds of CPU): never while the probes run.
            self.s5_doctor_metrics(sup, self.start_doctor(sup))
            self.s4_restart_stop(sup)
            self.s2_hand(supervised, cfg)
        finally:
            sup.close()

    def s1_ready_gate(self, sup: SupervisorRun, ready: bool) -> None:
        checks: list[dict[str, Any]] = []
        t_ready = sup.notify.times("READY=1")
        lines = sup.tail.lines
        caps = capture_lines(lines)
        begins_log = [c for c in caps if c[3] == "begin"]
        ends_log = [c for c in caps if c[3] == "end"]
        sup_begins = sup.named("engine.capture_begin")
        sup_ends = sup.named("engine.capture_end")
        ready_lines = [t for t, text in lines if READY_LINE in text]
        probe_ok = sup.named("supervisor.ready")
        checks.append(check("READY=1 sent", ready, {"notify_messages": len(sup.notify.messages)}))
        checks.append(check("every capture begin line detected",
                            len(begins_log) > 0 and len(sup_begins) == len(begins_log),
                            {"log_lines": len(begins_log), "supervisor_events": len(sup_begins)}))
        checks.append(check("every capture end line detected",
                            len(ends_log) > 0 and len(sup_ends) == len(ends_log),
                            {"log_lines": len(ends_log), "supervisor_events": len(sup_ends),
                             "graphs": [f"{c[1]} {c[2]}" for c in ends_log]}))
        last_end = sup_ends[-1][1] if sup_ends else {}
        checks.append(check("all expected captures ended before READY",
                            bool(last_end) and last_end.get("done") == last_end.get("expected"),
                            {k: last_end.get(k) for k in ("done", "expected")}))
        numbers: dict[str, Any] = {}
        if t_ready and ready_lines:
            first_ready = t_ready[0]
            checks.append(check("READY=1 after the last capture end line",
                                bool(ends_log) and first_ready > ends_log[-1][0],
                                round(first_ready - ends_log[-1][0], 3) if ends_log else None))
            checks.append(check("READY=1 after SGLang's ready line", first_ready > ready_lines[0],
                                round(first_ready - ready_lines[0], 3)))
            checks.append(check("READY=1 after the first probe succeeded",
                                bool(probe_ok) and probe_ok[0][0] <= first_ready + 1.0
                                and probe_ok[0][1].get("tok_s") is not None,
                                probe_ok[0][1] if probe_ok else None))
            numbers = {
                "ready_line_to_READY_s": round(first_ready - ready_lines[0], 3),
                "launch_to_READY_s": round(first_ready - sup.t0, 2),
                "capture_seconds": {f"{d.get('owner')} {d.get('graph')}": d.get("seconds")
                                    for _, d in sup_ends},
                "first_probe": probe_ok[0][1] if probe_ok else None,
                "status_messages": [m for _, m in sup.notify.messages if m.startswith("STATUS=")][:12],
            }
        else:
            checks.append(check("SGLang's ready line seen", bool(ready_lines), None))
        self.record("s1_ready_gate", checks, numbers)

    def start_doctor(self, sup: SupervisorRun) -> subprocess.Popen[bytes]:
        path = self.work / "doctor.json"
        return subprocess.Popen(
            [self.o.python, "-m", "sglang_supervisor", "doctor", "--config", str(sup.cfg_path),
             "--url", sup.engine_url, "--json"], stdout=path.open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True)

    def s2_supervised(self, sup: SupervisorRun) -> dict[str, Any]:
        t = time.time()
        series = probe_series(sup.engine_url, self.o.probe_runs, self.nvml.sm_clock_mhz)
        # 8 concurrent streams make SGLang print `Decode batch` lines with a running batch.
        threads = [threading.Thread(target=stream_probe, args=(sup.engine_url,)) for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        time.sleep(0.5)
        gens = decode_gen_throughputs(sup.tail.since(t))
        status = sup.status()
        return {"probe_series": series, "decode_batch_gen_tok_s": gens,
                "server_info_last_gen_throughput": server_info_gen(sup.engine_url),
                "supervisor_first_probe": (sup.named("supervisor.ready") or [(0, {})])[0][1].get("tok_s"),
                "supervisor_status_throughput": status.get("throughput")}

    def s2_hand(self, supervised: dict[str, Any], cfg: dict[str, Any]) -> None:
        numbers: dict[str, Any] = {"supervised": supervised}
        checks: list[dict[str, Any]] = []
        sup_med = supervised["probe_series"]["median_tok_s"]
        checks.append(check("supervised probe measured", bool(sup_med), sup_med))
        first = supervised.get("supervisor_first_probe")
        gens = supervised["decode_batch_gen_tok_s"]
        numbers["supervisor_probe_vs_stream_probe"] = round(first / sup_med, 3) if first and sup_med else None
        checks.append(check("SGLang printed Decode batch gen throughput", bool(gens), gens[-5:]))
        checks.append(check("/server_info last_gen_throughput read",
                            supervised["server_info_last_gen_throughput"] is not None,
                            supervised["server_info_last_gen_throughput"]))
        need = 150 if self.real else 10
        if self.left() < need:
            numbers["hand"] = f"skipped: {self.left():.0f} s left, {need} s needed"
            self.record("s2_throughput", checks, numbers,
                        note="the hand-launched comparison did not fit the budget")
            return
        hand = self.hand_launch(cfg)
        numbers["hand"] = hand
        hand_med = (hand.get("probe_series") or {}).get("median_tok_s")
        ratio = round(sup_med / hand_med, 4) if sup_med and hand_med else None
        numbers["supervised_over_hand"] = ratio
        if self.after_restart is not None:
            numbers["supervised_after_restart"] = self.after_restart
            again = self.after_restart["median_tok_s"]
            numbers["supervised_after_restart_over_hand"] = (
                round(again / hand_med, 4) if again and hand_med else None)
        self.hand_cfg = cfg
        checks.append(check("supervised / hand-launched >= 0.98", ratio is not None and ratio >= 0.98, ratio))
        self.record("s2_throughput", checks, numbers)

    def hand_launch(self, cfg: dict[str, Any], pipe: bool = False, profile: str = "graphs",
                    log_name: str | None = None, runs: int | None = None) -> dict[str, Any]:
        """The same argv and environment the supervisor renders, started by hand."""
        from sglang_supervisor.core.profiles import default_secret_config_path, render
        from sglang_supervisor.shell.engineproc.apikey import read_api_key
        from sglang_supervisor.shell.files.configfile import parse_checked
        cfg = json.loads(json.dumps(cfg))
        port = free_port()
        cfg["engine"]["port"] = port
        config = parse_checked(yaml.safe_dump(cfg), "hand.yaml")
        rc = render(config, profile, SGLANG_VERSION, python=self.o.python, api_key=read_api_key(config.engine),
                    secret_config_path=default_secret_config_path(config, os.environ))
        env = dict(os.environ, **rc.env)
        env.pop("NOTIFY_SOCKET", None)
        log_path = self.work / (log_name or ("hand-pipe-engine.log" if pipe else "hand-engine.log"))
        t0 = time.time()
        logf = log_path.open("wb")
        p = subprocess.Popen(rc.argv, stdout=subprocess.PIPE if pipe else logf, stderr=subprocess.STDOUT,
                             env=env, start_new_session=True)
        if pipe:
            def drain() -> None:
                assert p.stdout is not None
                while chunk := p.stdout.read1(65536):
                    logf.write(chunk)
                    logf.flush()
            threading.Thread(target=drain, daemon=True).start()
        res: dict[str, Any] = {"argv_tail": rc.argv[3:], "stdout": "pipe" if pipe else "file"}
        try:
            while time.time() < self.deadline - 60 and p.poll() is None:
                if READY_LINE.encode() in log_path.read_bytes():
                    res["ready_after_s"] = round(time.time() - t0, 1)
                    break
                time.sleep(0.2)
            if "ready_after_s" in res:
                res["probe_series"] = probe_series(f"http://127.0.0.1:{port}", runs or self.o.probe_runs,
                                                   self.nvml.sm_clock_mhz)
            else:
                res["error"] = f"not ready (rc {p.poll()})"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
            time.sleep(1)
        return res

    def s5_doctor_metrics(self, sup: SupervisorRun, doctor: subprocess.Popen[bytes]) -> None:
        checks: list[dict[str, Any]] = []
        st, text = http(sup.metrics_url + "/metrics", timeout=10)
        gauges = {}
        for line in text.splitlines() if st == 200 else []:
            m = re.match(r"(sglang_supervisor_gpu_\w+)\{[^}]*\} (\S+)", line)
            if m and "throttle" not in m[1]:
                gauges.setdefault(m[1], float(m[2]))
        try:
            rc = doctor.wait(max(5.0, min(120.0, self.left() - 60)))
        except subprocess.TimeoutExpired:
            doctor.kill()
            rc = "timeout"
        raw = (self.work / "doctor.json").read_text(errors="replace")
        doc: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            doc = json.loads(raw)
        gpus = ((doc.get("host") or {}).get("gpus") or doc.get("gpus") or []) if doc else []
        if not gpus and doc:
            gpus = _find_key(doc, "gpus") or []
        numbers = {"metrics_status": st, "gpu_gauges": gauges, "doctor_rc": rc,
                   "doctor_gpus": gpus, "doctor_findings": _findings(doc),
                   "doctor_raw_head": raw[:600] if not doc else None}
        if self.real:
            checks.append(check("metrics endpoint serves NVML memory gauges",
                                gauges.get("sglang_supervisor_gpu_memory_total_bytes", 0) > 100e9
                                and gauges.get("sglang_supervisor_gpu_memory_used_bytes", 0) > 1e9,
                                {k: gauges.get(k) for k in ("sglang_supervisor_gpu_memory_used_bytes",
                                                            "sglang_supervisor_gpu_memory_total_bytes")}))
            checks.append(check("metrics endpoint serves the SM clock",
                                gauges.get("sglang_supervisor_gpu_sm_clock_hertz", 0) > 1e8,
                                gauges.get("sglang_supervisor_gpu_sm_clock_hertz")))
            checks.append(check("doctor reports compute capability 9.0",
                                any(g.get("compute_capability") == "9.0" for g in gpus), gpus[:1]))
        else:
            checks.append(check("metrics endpoint answers", st == 200, st))
            checks.append(check("doctor produced JSON", bool(doc), raw[:200]))
        checks.append(check("doctor exit code 0 or 1 (findings)", rc in (0, 1), rc))
        self.record("s5_doctor_metrics", checks, numbers)

    def s4_restart_stop(self, sup: SupervisorRun) -> None:
        checks: list[dict[str, Any]] = []
        numbers: dict[str, Any] = {}
        status = sup.status()
        engine_pid = status.get("engine_pid")
        kids = descendants(int(engine_pid)) if engine_pid else []
        numbers["engine_children"] = [f"{k['pid']} {k['cmd'][:60]}" for k in kids]
        scheds = sorted((k for k in kids if "scheduler" in k["cmd"] or "scheduler" in k["comm"]),
                        key=lambda k: k["cmd"])
        victim = scheds[-1] if scheds else None  # the highest rank's scheduler under TP
        if victim is None and not self.real and engine_pid:
            victim = {"pid": int(engine_pid), "cmd": "launcher (the simulator has no scheduler child)"}
        checks.append(check("found a scheduler process", victim is not None,
                            victim["cmd"][:80] if victim else numbers["engine_children"]))
        restart_budget = 200 if self.real else 40  # a loaded CI CPU: relaunch took 10.2 s once
        if victim is not None and self.left() > restart_budget:
            n_ready = len(sup.named("supervisor.ready"))
            tk = time.time()
            os.kill(victim["pid"], signal.SIGKILL)
            again = sup.wait(lambda: len(sup.named("supervisor.ready")) > n_ready,
                             tk + restart_budget - 10)
            exited = [d for t, d in sup.named("engine.exited") if t >= tk]
            failed = [d for t, d in sup.named("engine.failed") if t >= tk]
            launches = [d for t, d in sup.named("engine.spawned") if t >= tk]
            numbers["after_kill"] = {"exited": exited[:1], "failed": failed[:1],
                                     "relaunched": launches[:1],
                                     "kill_to_READY_s": round(sup.named("supervisor.ready")[-1][0] - tk, 1)
                                     if again else None}
            checks.append(check("the supervisor saw the engine die", bool(exited or failed),
                                (failed or exited or [None])[0]))
            checks.append(check("the supervisor relaunched the engine", bool(launches),
                                launches[:1]))
            checks.append(check("READY again after the restart", again,
                                numbers["after_kill"]["kill_to_READY_s"]))
            if again:
                # The restarted engine loads the JIT cache the first one wrote: a second supervised
                # measurement separates "first launch" effects from the supervisor's own cost.
                self.after_restart = probe_series(sup.engine_url, self.o.probe_runs, self.nvml.sm_clock_mhz)
                numbers["after_restart_probe_median_tok_s"] = self.after_restart["median_tok_s"]
        elif victim is not None:
            checks.append(check("restart scenario fitted the budget", False, f"{self.left():.0f} s left"))
        # SIGTERM: bounded drain, nothing left, GPU memory back.
        drain = float(sup.config["timeouts"]["drain_s"]) + float(sup.config["timeouts"]["kill_s"])
        pgid_before = [p["pid"] for p in proc_table() if p["pgid"] == sup.proc.pid]
        engine_pid = sup.status().get("engine_pid")
        ours = {int(engine_pid), *(k["pid"] for k in descendants(int(engine_pid)))} if engine_pid else set()
        rc, secs = sup.stop(drain + 30)
        numbers["sigterm"] = {"rc": rc, "seconds": secs, "group_before": len(pgid_before)}
        checks.append(check("supervisor exits 0 on SIGTERM", rc == 0, rc))
        checks.append(check(f"stop bounded by drain+kill ({drain:g} s) + 5 s", secs <= drain + 5, secs))
        # On the GPU machine every sglang:: process is ours; elsewhere others may run simulators.
        left = sglang_procs() if self.real else []
        group_left = [p for p in proc_table() if p["pid"] in pgid_before]
        engine_left = [p for p in proc_table() if p["pid"] in ours and p["state"] != "Z"]
        checks.append(check("no process of the engine left", bool(ours) and not engine_left,
                            {"engine_processes": len(ours), "left": [p["cmd"][:60] for p in engine_left]}))
        if self.real:
            checks.append(check("no live sglang:: process left", not left, [p["cmd"][:60] for p in left]))
        # A scheduler we SIGKILLed ourselves is reparented to the machine's PID 1; if that PID 1
        # does not reap, it stays a zombie (no memory, no GPU context): reported, not a failure.
        numbers["zombies_left"] = [f"{p['pid']} {p['comm']} ppid={p['ppid']}" for p in sglang_procs(True)]
        checks.append(check("no process of the supervisor's group left", not group_left,
                            [p["cmd"][:60] for p in group_left]))
        if self.baseline_mem is not None:
            t = time.time()
            mem = self.nvml.used(self.o.tp) or []
            while time.time() - t < 15 and any(m > b + (256 << 20) for m, b in zip(mem, self.baseline_mem)):
                time.sleep(0.5)
                mem = self.nvml.used(self.o.tp) or []
            numbers["gpu_memory_used_after_bytes"] = mem
            numbers["gpu_memory_release_s"] = round(time.time() - t, 1)
            checks.append(check("GPU memory back to the baseline (+256 MiB)",
                                all(m <= b + (256 << 20) for m, b in zip(mem, self.baseline_mem)),
                                {"baseline": self.baseline_mem, "after": mem}))
        else:
            numbers["gpu_memory"] = "no NVML here"
        self.record("s4_restart_stop", checks, numbers)

    # -- scenario 3 ------------------------------------------------------------------------------

    def s3_fallback(self) -> None:
        need = 150 if self.real else 40
        if self.left() < need:
            self.skip("s3_fallback", f"budget: {self.left():.0f} s left, {need} s needed")
            return
        profiles = fail_profiles()
        if not self.real:
            # The simulator fails the same way, on the same flag value.
            profiles[0] = {**profiles[0], "env": {
                "SGLANG_SIM_FAULTS": f"kv-oom+when=--mem-fraction-static={FAIL_FRACTION:g}"}}
        cfg = self.config("fallback", profiles=profiles)
        sup = SupervisorRun(self.o.python, cfg, self.work / "fallback", "fallback")
        checks: list[dict[str, Any]] = []
        try:
            ready = sup.wait(lambda: bool(sup.notify.times("READY=1")), self.deadline - 15)
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
            self.record("s3_fallback", checks, numbers)
        finally:
            sup.close()

    def s2a_hand_first(self) -> None:
        """A/B diagnostic: a hand launch as the FIRST engine on the machine (stdout to a file)."""
        cfg = self.config("handfirst")
        res = self.hand_launch(cfg)
        med = (res.get("probe_series") or {}).get("median_tok_s")
        self.record("s2a_hand_first", [check("hand launch measured", bool(med), med)], {"hand_first": res})

    def s2b_pipe(self) -> None:
        """Diagnostic: the same hand launch with stdout into a pipe that a thread drains."""
        cfg = getattr(self, "hand_cfg", None)
        need = 100 if self.real else 10
        if cfg is None or self.left() < need:
            self.skip("s2b_pipe_diagnostic", f"not run ({self.left():.0f} s left, or no hand run)")
            return
        res = self.hand_launch(cfg, pipe=True)
        med = (res.get("probe_series") or {}).get("median_tok_s")
        nums = {**self.report["scenarios"].get("s2a_hand_first", {}).get("numbers", {}),
                **self.report["scenarios"]["s2_throughput"]["numbers"]}
        file_run = nums.get("hand") if isinstance(nums.get("hand"), dict) else nums.get("hand_first", {})
        file_med = (file_run.get("probe_series") or {}).get("median_tok_s")
        self.record("s2b_pipe_diagnostic", [check("pipe launch measured", bool(med), med)],
                    {"hand_pipe": res, "pipe_over_file": round(med / file_med, 4) if med and file_med else None})

    # -- scenario 7: the seed's shape ---------------------------------------------------------

    def seed_drop(self) -> tuple[str, ...]:
        return tuple(f for f in self.o.seed_drop.split(",") if f)

    def s7_seed_shape(self) -> None:
        need = 240 if self.real else 40
        if self.left() < need:
            self.skip("s7_seed_shape", f"budget: {self.left():.0f} s left, {need} s needed")
            return
        work = self.work / "seed"
        work.mkdir(parents=True, exist_ok=True)
        model = self.o.seed_model if self.real else seedshape.SIM_MODEL
        made = None
        if self.real and not (Path(model) / "config.json").exists():
            r = subprocess.run([self.o.engine_python, str(Path(__file__).parent / "make_tiny_qwen36.py"), model],
                               capture_output=True, text=True, timeout=300)
            made = (r.stdout or r.stderr)[-600:]
        # The simulated GPU is the device's H200 (SM 9.0): it refuses SBO as real 0.5.17 does there.
        sim_env = {"SGLANG_SIM_VERSION": SGLANG_VERSION, "SGLANG_SIM_TIME_SCALE": f"{self.o.time_scale:g}",
                   "SGLANG_SIM_GPU_SM": "9.0"}
        cfg = seedshape.seed_config(engine=self.o.engine, python=self.o.engine_python, model=model,
                                    port=free_port(), metrics_port=free_port(), workdir=work, sim_env=sim_env,
                                    drop=self.seed_drop())
        numbers: dict[str, Any] = {"model_made": made, "adaptations": seedshape.adaptations(cfg)}
        from sglang_supervisor.core.profiles import REDACTED, default_secret_config_path, render
        from sglang_supervisor.shell.files.configfile import parse_checked
        parsed = parse_checked(yaml.safe_dump(cfg), "seed.yaml")
        secret_path = default_secret_config_path(parsed, os.environ)
        numbers["rendered"] = {p.name: render(parsed, p.name, SGLANG_VERSION, python=self.o.engine_python,
                                              api_key=REDACTED, secret_config_path=secret_path).argv[3:]
                               for p in parsed.profiles}
        sup = SupervisorRun(self.o.python, cfg, work, "seed")
        checks: list[dict[str, Any]] = []
        try:
            reserve = 150 if self.real else 15
            ready = sup.wait(lambda: bool(sup.notify.times("READY=1")), self.deadline - reserve)
            if ready:
                sup.wait(lambda: bool(sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
            lines = [text for _, text in sup.tail.lines]
            readies = sup.named("supervisor.ready")
            numbers["attempts"] = [
                {"profile": d.get("profile"), "attempt": d.get("attempt")} for _, d in sup.named("engine.spawned")]
            numbers["failures"] = [{k: d.get(k) for k in ("profile", "failure_class", "message")}
                                   for _, d in sup.named("engine.failed")]
            numbers["fallbacks"] = [{k: d.get(k) for k in ("from_profile", "to_profile", "failure_class", "rule")}
                                    for _, d in sup.named("profile.fallback")]
            numbers["derived"] = [{k: d.get(k) for k in ("from_profile", "to_profile", "change", "asked_by")}
                                  for _, d in sup.named("profile.derived")]
            numbers["captures_supervisor"] = [
                f"{d.get('profile')}: {d.get('owner')} {d.get('graph')} {d.get('seconds')} s"
                for _, d in sup.named("engine.capture_end")]
            numbers["capture_lines"] = seedshape.capture_sequence(lines)
            numbers["prefill_graph_disabled"] = [d.get("reason") for _, d in sup.named("engine.prefill_graph_disabled")]
            numbers["failure_lines"] = [d.get("message") for _, d in sup.named("engine.failure_line")][:6]
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
                base = sup.engine_url
                series = probe_series(base, self.o.probe_runs, self.nvml.sm_clock_mhz)
                t = time.time()
                threads = [threading.Thread(target=stream_probe, args=(base,)) for _ in range(8)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(120)
                time.sleep(0.5)
                after = [text for tt, text in sup.tail.lines if tt >= t - 60]
                numbers["probe_series"] = series
                numbers["accept_len"] = seedshape.accept_lengths([text for _, text in sup.tail.lines])[-12:]
                numbers["decode_gen_tok_s"] = decode_gen_throughputs([(0.0, x) for x in after])[-6:]
                st, body = http(base + "/server_info", timeout=20)
                with contextlib.suppress(ValueError, TypeError, AttributeError, IndexError):
                    info = json.loads(body)
                    states = info.get("internal_states") or [{}]
                    numbers["server_info"] = {k: states[0].get(k) for k in
                                              ("avg_spec_accept_length", "last_gen_throughput")}
                    numbers["server_info"].update({k: info.get(k) for k in (
                        "language_only", "speculative_algorithm", "cuda_graph_backend_prefill",
                        "mamba_radix_cache_strategy", "enable_single_batch_overlap")})
                numbers["listening_8997"] = 8997 in seedshape.listening_ports(_proc_net())
                checks.append(check("NEXTN accept length logged", bool(numbers["accept_len"]),
                                    numbers["accept_len"][-3:]))
            rc, secs = sup.stop(60)
            numbers["sigterm"] = {"rc": rc, "seconds": secs}
            checks.append(check("supervisor exits 0 on SIGTERM", rc == 0, rc))
            prof = (numbers["ready"] or {}).get("profile")
            if self.o.seed_hand and ready and prof and self.left() > (150 if self.real else 15):
                hand = self.hand_launch(cfg, profile=prof, log_name="seed-hand-engine.log")
                numbers["hand"] = hand
                hmed = (hand.get("probe_series") or {}).get("median_tok_s")
                smed = numbers["probe_series"]["median_tok_s"]
                numbers["supervised_over_hand"] = round(smed / hmed, 4) if smed and hmed else None
        finally:
            sup.close()
        self.record("s7_seed_shape", checks, numbers)

    # -- scenario 8: the shipped unit under real systemd ------------------------------------

    def s8_systemd(self) -> None:
        root = Path(__file__).resolve().parents[2]
        if not self.real or not list((root / ".sd").glob("systemd_*.deb")):
            self.skip("s8_systemd", "needs the GPU machine and Debian 12's systemd packages in .sd/")
            return
        if self.left() < 200:
            self.skip("s8_systemd", f"budget: {self.left():.0f} s left, 200 s needed")
            return
        model = self.o.seed_model
        if not (Path(model) / "config.json").exists():
            subprocess.run([self.o.engine_python, str(Path(__file__).parent / "make_tiny_qwen36.py"), model],
                           capture_output=True, timeout=300, check=False)
        cfg = seedshape.unit_config(python=self.o.engine_python, model=model, metrics_port=free_port(),
                                    drop=self.seed_drop())
        path = self.work / "seed-unit.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        env = dict(os.environ, CONFIG=str(path), MODEL=model, OUT=str(self.out),
                   WAIT_S=str(int(max(60, self.left() - 90))), RESTART=str(int(self.o.systemd_restart)))
        try:
            r = subprocess.run(["bash", str(Path(__file__).parent / "systemd-unit.sh")], env=env,
                               capture_output=True, text=True, timeout=max(30, self.left() - 10))
            rc: int | str = r.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        text = (self.out / "systemd.txt").read_text(errors="replace") if (self.out / "systemd.txt").exists() else ""
        checks = [check(line[5:], line.startswith("PASS"), None)
                  for line in text.splitlines() if line.startswith(("PASS ", "FAIL "))]
        checks.append(check("systemd-unit.sh exit 0", rc == 0, rc))
        self.record("s8_systemd", checks, {"transcript_tail": text[-3000:]})

    # -- scenario warmcache: kernel caches across restarts and fallbacks (issue 26) -------------

    def warm_start(self, name: str, cache_dir: Path, profiles: list[dict[str, Any]],
                   reserve: float) -> tuple[SupervisorRun, bool]:
        """One supervisor start in the unit's emulated environment (scripts/gpu/warmcache.py)."""
        env = warmcache.unit_environment(dict(os.environ), cache_dir, self.work / "warmcache" / f"{name}-scratch")
        cfg = self.config(f"warmcache-{name}", profiles=profiles)
        sup = SupervisorRun(self.o.python, cfg, self.work / f"warmcache-{name}", name, environ=env)
        ready = sup.wait(lambda: bool(sup.notify.times("READY=1")), self.deadline - reserve)
        if ready:
            sup.wait(lambda: bool(sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
        return sup, ready

    def warm_numbers(self, sup: SupervisorRun, t0: float, ready_t: float | None, cache_dir: Path) -> dict[str, Any]:
        pid = sup.status().get("engine_pid")
        env = warmcache.engine_environ(int(pid)) if pid else {}
        scratch = self.work / "warmcache" / f"{sup.cfg_path.stem}-scratch"
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

    def s13_warmcache(self) -> None:
        """Long because: one sequence (cold, restart, SIGKILL, fallback) over one cache directory."""
        need = 320 if self.real else 40
        if self.left() < need:
            self.skip("s13_warmcache", f"budget: {self.left():.0f} s left, {need} s needed")
            return
        cache_dir = self.work / "warmcache" / "var-cache-sglang-supervisor"
        shutil.rmtree(self.work / "warmcache", ignore_errors=True)
        cache_dir.mkdir(parents=True)
        numbers_pre: dict[str, Any] = {}
        if self.real:
            # Not what a cache fixes: the disk's page cache and Python's bytecode for torch and
            # SGLang. One import first (its JIT output into a throwaway folder), so that (a) is cold
            # in the kernel caches only, as a host that already served some other model.
            throw = self.work / "warmcache" / "preimport"
            env = warmcache.unit_environment(dict(os.environ), throw / "cache", throw)
            env.update({v: str(throw / "jit" / v.lower()) for v, _ in warmcache.CACHE_VARS})
            t = time.time()
            r = subprocess.run([self.o.engine_python, "-c", "import torch, triton, sglang.srt.server_args"],
                               env=env, capture_output=True, text=True, timeout=120, check=False)
            numbers_pre = {"rc": r.returncode, "seconds": round(time.time() - t, 1), "stderr": r.stderr[-300:]}
        jit_before = time.time()
        ladder = [PROFILES[0], PROFILES[1]]  # graphs (prefill breakable + decode full), no-prefill-graph
        checks: list[dict[str, Any]] = []
        numbers: dict[str, Any] = {"emulation": warmcache.__doc__.split("\n\n")[1].replace("\n", " "),
                                   "preimport": numbers_pre}
        starts: dict[str, float | None] = {}
        # (a) cold: an empty cache directory
        sup, ready = self.warm_start("a-cold", cache_dir, ladder, 170 if self.real else 25)
        try:
            t_ready = sup.notify.times("READY=1")[0] if ready else None
            numbers["a_cold"] = self.warm_numbers(sup, sup.t0, t_ready, cache_dir)
            starts["a_cold"] = numbers["a_cold"]["to_READY_s"]
            checks.append(check("(a) cold start READY on the first rung", ready
                                and numbers["a_cold"]["ready_profile"] == PROFILES[0]["name"],
                                {"s": starts["a_cold"], "profile": numbers["a_cold"]["ready_profile"],
                                 "failed": numbers["a_cold"]["attempts"]}))
            env = numbers["a_cold"]["engine_cache_env"]
            keys = sorted(numbers["a_cold"]["cache"]["keys"])
            key_dir = str(cache_dir / "engine-cache" / keys[0]) if len(keys) == 1 else None
            checks.append(check("one key directory under CACHE_DIRECTORY/engine-cache", key_dir is not None, keys))
            placed = [v for v, _ in warmcache.CACHE_VARS if (env.get(v) or "").startswith(f"{key_dir}/")]
            checks.append(check("the engine's cache variables all point into the key directory",
                                key_dir is not None and len(placed) == len(warmcache.CACHE_VARS),
                                {"placed": len(placed), "of": len(warmcache.CACHE_VARS), "env": env}))
            if self.real:
                key_bytes = sum(numbers["a_cold"]["cache"]["keys"].get(keys[0], {}).values()) if key_dir else 0
                checks.append(check("the cold start's JIT output landed in the key directory (> 1 MiB)",
                                    key_bytes > (1 << 20), key_bytes))
            rc, secs = sup.stop(60)
            numbers["a_cold"]["sigterm"] = {"rc": rc, "seconds": secs}
        finally:
            sup.close()
        numbers["cache_after_a"] = warmcache.cache_report(cache_dir)
        if not ready:
            self.record("s13_warmcache", checks, numbers, note="the cold start never became ready")
            return
        # (b) `systemctl restart`: a new supervisor, a new PrivateTmp, the same CacheDirectory
        sup, ready = self.warm_start("b-restart", cache_dir, ladder, 110 if self.real else 15)
        try:
            t_ready = sup.notify.times("READY=1")[0] if ready else None
            numbers["b_restart"] = self.warm_numbers(sup, sup.t0, t_ready, cache_dir)
            starts["b_restart"] = numbers["b_restart"]["to_READY_s"]
            checks.append(check("(b) restart READY on the first rung", ready
                                and numbers["b_restart"]["ready_profile"] == PROFILES[0]["name"],
                                {"s": starts["b_restart"], "profile": numbers["b_restart"]["ready_profile"]}))
            # (c) SIGKILL of the engine's scheduler: the supervisor relaunches it (same unit, same /tmp)
            pid = sup.status().get("engine_pid")
            kids = descendants(int(pid)) if pid else []
            scheds = [k for k in kids if "scheduler" in k["cmd"] or "scheduler" in k["comm"]]
            victim = scheds[-1]["pid"] if scheds else (int(pid) if pid and not self.real else None)
            if ready and victim and self.left() > (90 if self.real else 10):
                n = len(sup.named("supervisor.ready"))
                tk = time.time()
                os.kill(victim, signal.SIGKILL)
                again = sup.wait(lambda: len(sup.named("supervisor.ready")) > n, self.deadline - (75 if self.real else 8))
                t_again = sup.named("supervisor.ready")[-1][0] if again else None
                numbers["c_sigkill"] = self.warm_numbers(sup, tk, t_again, cache_dir)
                starts["c_sigkill"] = numbers["c_sigkill"]["to_READY_s"]
                checks.append(check("(c) READY again after SIGKILL of the scheduler", again, starts["c_sigkill"]))
            else:
                numbers["c_sigkill"] = f"not run: victim {victim}, {self.left():.0f} s left"
            rc, secs = sup.stop(60)
        finally:
            sup.close()
        # (d) a fallback start: the first rung cannot allocate its KV cache, the second starts
        if self.left() > (70 if self.real else 8):
            bad = {**PROFILES[0], "name": "no-kv-room", "args": {"mem-fraction-static": FAIL_FRACTION}}
            if not self.real:
                bad["env"] = {"SGLANG_SIM_FAULTS": f"kv-oom+when=--mem-fraction-static={FAIL_FRACTION:g}"}
            sup, ready = self.warm_start("d-fallback", cache_dir, [bad, PROFILES[1]], 10 if self.real else 3)
            try:
                spawned = [(t, d) for t, d in sup.named("engine.spawned") if d.get("profile") == PROFILES[1]["name"]]
                readies = sup.named("supervisor.ready")
                t_ready = readies[0][0] if ready and readies else None
                t1 = spawned[0][0] if spawned else sup.t0
                numbers["d_fallback"] = self.warm_numbers(sup, t1, t_ready, cache_dir)
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
            numbers["d_fallback"] = f"not run: {self.left():.0f} s left"
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
            if self.real:  # the simulator has no JIT: its ratios say nothing
                checks.append(check(f"{k} <= 0.5 x the cold start", r <= 0.5, {"ratio": r, "s": starts[k], "cold_s": cold}))
        missing = [k for k in ("b_restart", "c_sigkill", "d_fallback_second_rung") if not starts.get(k)]
        checks.append(check("every warm start measured", not missing, missing))
        self.record("s13_warmcache", checks, numbers,
                    note="emulated unit environment (CACHE_DIRECTORY, fresh TMPDIR and HOME per start); "
                         "not real systemd")


    # -- scenarios 9 and 10: the GPU-bound model ---------------------------------------------

    def big_model(self) -> str:
        """An ~8B dense Qwen3 config (dummy weights) with the tiny model's tokenizer."""
        if not self.real:
            return "Qwen/Qwen3-8B"
        big = Path(BIG_MODEL)
        if not (big / "config.json").exists():
            big.mkdir(parents=True, exist_ok=True)
            for f in os.listdir(self.o.model):
                if f.startswith("tokenizer") or f.endswith(".jinja"):
                    shutil.copy(os.path.join(self.o.model, f), big)
            from transformers import Qwen3Config
            cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                              num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                              max_position_embeddings=32768, tie_word_embeddings=False, rms_norm_eps=1e-6,
                              rope_theta=1000000.0)
            cfg.architectures = ["Qwen3ForCausalLM"]
            cfg.dtype = "bfloat16"
            cfg.save_pretrained(big)
        return str(big)

    def big_config(self, name: str, profiles: list[dict[str, Any]]) -> dict[str, Any]:
        cfg = build_config(engine=self.o.engine, python=self.o.engine_python, model=self.big_model(),
                           port=free_port(), metrics_port=free_port(), workdir=self.work / name, tp=self.o.tp,
                           time_scale=self.o.time_scale, profiles=profiles)
        cfg["engine"]["args"] = {**BIG_ARGS, **({"tp-size": self.o.tp} if self.o.tp > 1 else {})}
        return cfg

    def seed_ab_config(self, name: str) -> dict[str, Any]:
        """The seed scenario's configuration (qwen.yaml adapted, see s7) with the supervisor's
        periodic probes every SEED_AB_PROBE_INTERVAL_S, so that they run during the measurement."""
        work = self.work / name
        work.mkdir(parents=True, exist_ok=True)
        model = self.o.seed_model if self.real else seedshape.SIM_MODEL
        if self.real and not (Path(model) / "config.json").exists():
            subprocess.run([self.o.engine_python, str(Path(__file__).parent / "make_tiny_qwen36.py"), model],
                           capture_output=True, timeout=300, check=False)
        # The simulated GPU is the device's H200 (SM 9.0): it refuses SBO as real 0.5.17 does there.
        sim_env = {"SGLANG_SIM_VERSION": SGLANG_VERSION, "SGLANG_SIM_TIME_SCALE": f"{self.o.time_scale:g}",
                   "SGLANG_SIM_GPU_SM": "9.0"}
        cfg = seedshape.seed_config(engine=self.o.engine, python=self.o.engine_python, model=model,
                                    port=free_port(), metrics_port=free_port(), workdir=work, sim_env=sim_env,
                                    drop=self.seed_drop())
        cfg["probe"]["interval_s"] = SEED_AB_PROBE_INTERVAL_S
        return cfg

    def s9_ab(self) -> None:
        """Hand-launched (stdout to a file) vs supervised, alternating, the same argv and probes.
        `--ab-model seed`: on the seed's shape (speculative decoding, qwen.yaml's `tuned`), as s9_ab_seed."""
        seed = self.o.ab_model == "seed"
        name = "s9_ab_seed" if seed else "s9_ab"
        need = 320 if self.real else 40
        if self.left() < need:
            self.skip(name, f"budget: {self.left():.0f} s left, {need} s needed")
            return
        profiles = [{"name": "decode-graphs", "description": "Decode CUDA graphs, prefill eager."}]
        profile = "tuned" if seed else "decode-graphs"
        runs = self.o.ab_probes
        arms: list[dict[str, Any]] = []
        for i, arm in enumerate(["hand", "supervised", "hand", "supervised"]):
            if self.left() < (110 if self.real else 10):
                arms.append({"arm": arm, "skipped": f"{self.left():.0f} s left"})
                break
            cfg = self.seed_ab_config(f"ab{i}") if seed else self.big_config(f"ab{i}", profiles)
            t0 = time.time()
            if arm == "hand":
                res = self.hand_launch(cfg, profile=profile, log_name=f"ab{i}-hand-engine.log", runs=runs)
                series = res.get("probe_series") or {}
                arms.append({"arm": arm, "i": i, "ready_s": res.get("ready_after_s"),
                             "tok_s": [r["decode_tok_s"] for r in series.get("runs", [])],
                             "median": series.get("median_tok_s"), "error": res.get("error")})
                continue
            sup = SupervisorRun(self.o.python, cfg, self.work / f"ab{i}", f"ab{i}")
            try:
                ok = sup.wait(lambda: bool(sup.notify.times("READY=1")), min(self.deadline - 60, t0 + 300))
                rec: dict[str, Any] = {"arm": arm, "i": i, "ready_s": round(time.time() - t0, 1) if ok else None}
                readies = sup.named("supervisor.ready")
                rec["profile"] = readies[0][1].get("profile") if readies else None
                if ok:
                    series = probe_series(sup.engine_url, runs, self.nvml.sm_clock_mhz)
                    rec.update({"tok_s": [r["decode_tok_s"] for r in series["runs"]],
                                "median": series["median_tok_s"]})
                rec["supervisor_probes_during"] = len([1 for t, _ in sup.named("probe.ok") if t > t0])
                rec["stop"] = sup.stop(60)
                arms.append(rec)
            finally:
                sup.close()
                time.sleep(2)
        hand = [a["median"] for a in arms if a["arm"] == "hand" and a.get("median")]
        sup_m = [a["median"] for a in arms if a["arm"] == "supervised" and a.get("median")]
        ratio = round(statistics.mean(sup_m) / statistics.mean(hand), 4) if hand and sup_m else None
        numbers = {"probes_per_arm": runs, "arms": arms, "hand_medians": hand, "supervised_medians": sup_m,
                   "ratio_supervised_over_hand": ratio,
                   # ~8.19B bf16 parameters read per token at the 4.3 TB/s copy rate measured on this GPU kind
                   "copy_bandwidth_ceiling_tok_s": round(4.3e12 / (2 * 8.19e9), 1) if self.real and not seed else None}
        if seed:
            numbers["supervisor_probe_interval_s"] = SEED_AB_PROBE_INTERVAL_S
            numbers["adaptations"] = seedshape.adaptations(self.seed_ab_config("ab-adaptations"))
        checks = [check("two hand and two supervised arms measured", len(hand) == 2 and len(sup_m) == 2,
                        {"hand": hand, "supervised": sup_m}),
                  check("supervised / hand-launched >= 0.98", ratio is not None and ratio >= 0.98, ratio)]
        if seed:
            checks.append(check("every supervised arm served qwen.yaml's tuned profile",
                                all(a.get("profile") == "tuned" for a in arms if a["arm"] == "supervised"),
                                [a.get("profile") for a in arms if a["arm"] == "supervised"]))
        if not self.real:
            checks = [c for c in checks if "0.98" not in c["name"]]  # a shared CPU measures the neighbours
        self.record(name, checks, numbers)

    def s10_regression(self) -> None:
        """Probes every 5 s; a foreign matmul loop on the same GPU for hog_s; then quiet."""
        need = 200 if self.real else 40
        if self.left() < need or not self.real:
            self.skip("s10_regression", "needs the GPU machine" if not self.real
                      else f"budget: {self.left():.0f} s left, {need} s needed")
            return
        profiles = [{"name": "decode-graphs", "description": "Decode CUDA graphs, prefill eager."},
                    {"name": "eager", "description": "No CUDA graphs.",
                     "args": {"cuda-graph-backend-decode": "disabled"}}]
        cfg = self.big_config("regress", profiles)
        cfg["probe"].update({"interval_s": 5, "baseline_runs": 3, "regression_window": 3, "regression_delta": 0.15,
                             "cooldown_s": 30, "act_on_regression": True, "max_new_tokens": 64})
        sup = SupervisorRun(self.o.python, cfg, self.work / "regress", "regress")
        hog_s = max(20.0, min(60.0, self.left() - 150))
        res: dict[str, Any] = {"hog_s": hog_s}
        checks: list[dict[str, Any]] = []
        try:
            ok = sup.wait(lambda: bool(sup.notify.times("READY=1")), min(self.deadline - 120, time.time() + 300))
            checks.append(check("READY=1", ok, None))
            if ok:
                time.sleep(20)  # baseline probes
                t_hog = time.time()
                hog = subprocess.Popen([self.o.engine_python, "-c", HOG, str(hog_s)])
                hog.wait(hog_s + 60)
                t_end = time.time()
                time.sleep(min(45.0, max(10.0, self.left() - 40)))
                rel = lambda t: round(t - t_hog, 1)  # noqa: E731 - local shorthand
                ev = [(t, d) for t, d in sup.events if str(d.get("event", "")).startswith(
                    ("probe", "throughput", "regression", "engine.launch", "engine.stop", "profile."))]
                res["events"] = [{"t_from_hog_s": rel(t), **{k: v for k, v in d.items()
                                                              if k not in ("level", "timestamp")}} for t, d in ev]
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
        self.record("s10_regression", checks, res)

    def s12_unexplained(self) -> None:
        """Item 5b of issue 16: a slowdown the supervisor cannot explain, caused for real, acted on.

        A foreign agent keeps SIGSTOPping the engine's scheduler processes (STUTTER_STOP_S stopped,
        STUTTER_RUN_S running; it finds each new scheduler by its process title, so it follows the
        engine across restarts): decode really slows, the GPU is neither throttled nor shared, no
        other process is on it, decode still runs CUDA graphs, nothing else is queued. The policy
        (regression.py) must then restart the same profile once, find it still slow, try the next
        profile, and keep whichever probes faster."""
        if not self.real:
            # The simulator paces tokens against its own schedule: a stopped process catches up
            # afterwards, so a stutter does not slow its decode (tried: no decision in 120 s).
            self.skip("s12_unexplained", "needs the GPU machine")
            return
        if self.left() < 280:
            self.skip("s12_unexplained", f"budget: {self.left():.0f} s left, 280 s needed")
            return
        profiles = [{"name": "decode-graphs", "description": "Decode CUDA graphs, prefill eager."},
                    {"name": "eager", "description": "No CUDA graphs.",
                     "args": {"cuda-graph-backend-decode": "disabled"}}]
        cfg = self.big_config("unexplained", profiles)
        cfg["probe"].update({"interval_s": 5, "baseline_runs": 3, "regression_window": 3, "regression_delta": 0.15,
                             "cooldown_s": 3600, "act_on_regression": True, "max_new_tokens": 64})
        sup = SupervisorRun(self.o.python, cfg, self.work / "unexplained", "unexplained")
        stutter = Stutter(lambda: [p["pid"] for p in descendants(sup.proc.pid)
                                   if p["comm"].startswith("sglang::sched") or "sglang::scheduler" in p["cmd"]])
        res: dict[str, Any] = {"stutter": {"stop_s": STUTTER_STOP_S, "run_s": STUTTER_RUN_S}}
        checks: list[dict[str, Any]] = []
        try:
            ok = sup.wait(lambda: bool(sup.notify.times("READY=1")), min(self.deadline - 150, time.time() + 300))
            checks.append(check("READY=1", ok, None))
            if ok:
                sup.wait(lambda: bool(sup.named("probe.baseline")), time.time() + 60)
                base = sup.named("probe.baseline")
                checks.append(check("baseline measured", bool(base), base[0][1] if base else None))
                t0 = time.time()
                stutter.start()
                settled = sup.wait(lambda: any(d.get("decision") == "keep_faster"
                                               for _, d in sup.named("throughput.decision")),
                                   self.deadline - 25, step=0.5)
                stutter.stop()
                rel = lambda t: round(t - t0, 1)  # noqa: E731 - local shorthand
                ev = [(t, d) for t, d in sup.events if str(d.get("event", "")).startswith(
                    ("probe.", "throughput", "regression", "engine.spawned", "engine.stop", "profile.",
                     "supervisor.ready"))]
                res["events"] = [{"t_from_stutter_s": rel(t), **{k: v for k, v in d.items()
                                                                 if k not in ("level", "timestamp")}}
                                 for t, d in ev if t >= t0 - 30]
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
        self.record("s12_unexplained", checks, res)

    # -- scenario 13 -----------------------------------------------------------------------------

    def s15_captureoom(self) -> None:
        """Issue 25 on the GPU: a real decode graph capture OOM, caused by a foreign process that
        leaves too little memory for the decode graphs at batch 512 (but enough for 256), healed
        by a derived profile (half the max batch, decode graphs kept) instead of the written
        no-graph rung; both measured."""
        name = "s15_captureoom"
        need = 220 if self.real else 30
        if self.left() < need:
            self.skip(name, f"budget: {self.left():.0f} s left, {need} s needed")
            return
        numbers: dict[str, Any] = {}
        checks: list[dict[str, Any]] = []
        top = self._captureoom_calibrate("graphs-bs512", numbers, checks)
        half = (self._captureoom_calibrate("graphs-bs256", numbers, checks)
                if self.o.oom_margin_gb is None else {})
        margin = oom_margin_bytes(top.get("need_bytes"), half.get("need_bytes"), self.o.oom_margin_gb)
        numbers["margin_bytes"] = margin
        if self.real:
            checks.append(check("calibration: batch 512 needs more memory than 256 (a margin between)",
                                margin is not None, {"512": top.get("need_bytes"),
                                                     "256": half.get("need_bytes")}))
            if margin is None:
                self.record(name, checks, numbers)
                return
        derived_tps = self._captureoom_supervised(margin or 0, numbers, checks)
        cfg = self.config("captureoom-written", profiles=CAPTUREOOM_PROFILES)
        written = self.hand_launch(cfg, profile="no-graphs", log_name="captureoom-written-engine.log",
                                   runs=3)
        numbers["written_no_graphs"] = written
        written_tps = (written.get("probe_series") or {}).get("median_tok_s")
        checks.append(check("the written no-graph rung measured", bool(written_tps), written_tps))
        ratio = round(derived_tps / written_tps, 3) if derived_tps and written_tps else None
        numbers["derived_over_written"] = ratio
        numbers["calibrated_bs512_over_written"] = (
            round(top["tok_s"] / written_tps, 3) if top.get("tok_s") and written_tps else None)
        if self.real:  # the simulator's tok/s model says nothing about graphs vs eager here
            checks.append(check("derived (decode graphs) faster than the written no-graph rung",
                                ratio is not None and ratio > 1.0, ratio))
        self.record(name, checks, numbers,
                    note=f"holder leaves {margin} bytes free at `Memory pool end` of each start")

    def _holder(self, log_file: str, mode: str, margin: int, work: Path) -> tuple[Any, Path, Path]:
        """The foreign holder (real engine only), started and ready before the engine."""
        work.mkdir(parents=True, exist_ok=True)
        stop_file, out = work / f"holder-{mode}.stop", work / f"holder-{mode}.log"
        stop_file.unlink(missing_ok=True)
        if not self.real:
            out.write_text("")
            return None, stop_file, out
        with out.open("w") as f:
            proc = subprocess.Popen([self.o.engine_python, "-c", HOLDER, log_file, mode, str(margin),
                                     str(stop_file)], stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        t = time.time()
        while time.time() - t < 60 and "holder ready" not in out.read_text() and proc.poll() is None:
            time.sleep(0.2)
        return proc, stop_file, out

    @staticmethod
    def _holder_stop(proc: Any, stop_file: Path) -> None:
        stop_file.touch()
        if proc is None:
            return
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def _captureoom_calibrate(self, profile: str, numbers: dict[str, Any], checks: list[dict[str, Any]]
                              ) -> dict[str, Any]:
        """(1) `profile` alone, no interference: what its decode graphs need (the holder measures,
        takes nothing) and, for the 512 one, its tok/s."""
        cfg = self.config(f"captureoom-calib-{profile}", profiles=[*CAPTUREOOM_PROFILES, CALIBRATE_HALF])
        log_name = f"captureoom-calib-{profile}-engine.log"
        log_path = self.work / log_name
        log_path.unlink(missing_ok=True)
        proc, stop_file, out = self._holder(str(log_path), "measure", 0, self.work / "captureoom")
        try:
            res = self.hand_launch(cfg, profile=profile, log_name=log_name,
                                   runs=3 if profile == "graphs-bs512" else 1)
        finally:
            self._holder_stop(proc, stop_file)
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

    def _captureoom_supervised(self, margin: int, numbers: dict[str, Any],
                               checks: list[dict[str, Any]]) -> float | None:
        """(2) the supervised ladder with the holder on the GPU: capture_oom, derived, READY."""
        profiles = json.loads(json.dumps(CAPTUREOOM_PROFILES))
        if not self.real:  # the simulator's OOM, only at batch 512 (the holder needs a GPU)
            profiles[0]["env"] = {"SGLANG_SIM_FAULTS": "capture-fail:decode:oom"
                                                       f"+when=--cuda-graph-max-bs-decode={OOM_MAX_BS}"}
        cfg = self.config("captureoom", profiles=profiles)
        cfg["restart"]["derived_steps"] = 3  # 512 -> 64 at most
        work = self.work / "captureoom"
        proc, stop_file, out = self._holder(cfg["engine"]["log_file"], "hold", margin, work)
        sup = SupervisorRun(self.o.python, cfg, work, "captureoom")
        tps = None
        try:
            ready = sup.wait(lambda: bool(sup.notify.times("READY=1")), self.deadline - 80)
            if ready:
                sup.wait(lambda: bool(sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
                series = probe_series(sup.engine_url, 3, self.nvml.sm_clock_mhz)
                tps = series["median_tok_s"]
                numbers["derived_probe_series"] = series
            self._captureoom_checks(sup, ready, tps, numbers, checks)
            numbers["sigterm"] = sup.stop(60)
        finally:
            sup.close()
            self._holder_stop(proc, stop_file)
        numbers["holder"] = out.read_text()[-2000:]
        if self.real:
            checks.append(check("the holder took the memory at a start's `Memory pool end`",
                                "grabbed" in numbers["holder"], numbers["holder"][-400:]))
        return tps

    def _captureoom_checks(self, sup: SupervisorRun, ready: bool, tps: float | None,
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

    def fidelity_model(self) -> str:
        """A private copy of the tiny checkpoint (real: its weights are damaged later, in place)."""
        if not self.real:
            return self.o.model
        src = Path(self.o.model)
        if not (src / "model.safetensors").exists():
            src = self.work / "fid-src"
            subprocess.run([self.o.engine_python, str(Path(__file__).parent / "make_tiny_qwen3.py"), str(src)],
                           capture_output=True, timeout=300, check=False)
        dst = self.work / "fid-model"
        shutil.copytree(src, dst)
        return str(dst)

    def fidelity_run(self, name: str, model: str, profiles: list[dict[str, Any]], state_dir: Path,
                     faults: str = "") -> dict[str, Any]:
        """One supervised start: READY (or its end), the fidelity events, stopped."""
        cfg = build_config(engine=self.o.engine, python=self.o.engine_python, model=model, port=free_port(),
                           metrics_port=free_port(), workdir=self.work / name, tp=self.o.tp,
                           time_scale=self.o.time_scale, profiles=copy.deepcopy(profiles))
        # One reference for every run (copied from the first run's state), but each run its own
        # memory of failed profiles: a mismatch in one run must not skip the profile in the next.
        if state_dir != self.work / name / "state" and (state_dir / "fidelity").is_dir():
            shutil.copytree(state_dir / "fidelity", self.work / name / "state" / "fidelity")
        cfg["state_dir"] = str(self.work / name / "state")
        # The damaged run's ladder is graphs alone: the reference exists, none is taken there.
        cfg["fidelity"] = {"interval_s": 0, **({"reference_profile": FID_REFERENCE}
                                               if any(p["name"] == FID_REFERENCE for p in profiles) else {})}
        if faults:
            cfg["profiles"][0].setdefault("env", {})["SGLANG_SIM_FAULTS"] = faults
        sup = SupervisorRun(self.o.python, cfg, self.work / name, name)
        out: dict[str, Any] = {}
        try:
            done = lambda: bool(sup.notify.times("READY=1")) or bool(sup.named("fidelity.mismatch"))  # noqa: E731
            sup.wait(done, min(self.deadline - 10, time.time() + (200 if self.real else 40)))
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

    def s16_fidelity(self) -> None:
        """Issue 23 item 6: the reference taken under the conservative profile (eager,
        --disable-cuda-graph); a CUDA-graph profile passes, a repeated start passes, a start on
        the same checkpoint with one layer's weights damaged on disk fails with output_mismatch.
        Every check's statistic is recorded (numbers.runs.*.checks) to calibrate the tolerance."""
        need = 230 if self.real else 40
        if self.left() < need:
            self.skip("s16_fidelity", f"budget: {self.left():.0f} s left, {need} s needed")
            return
        model = self.fidelity_model()
        state_dir = self.work / "fid-ref" / "state"  # where the reference is taken
        graphs = {"name": "graphs", "description": "Decode CUDA graphs, prefill eager.",
                  "args": {"cuda-graph-backend-prefill": "disabled"}}
        eager = {"name": FID_REFERENCE, "description": "No CUDA graphs at all.",
                 "args": {"disable-cuda-graph": True}}
        runs: dict[str, Any] = {}
        checks: list[dict[str, Any]] = []
        runs["reference"] = r = self.fidelity_run("fid-ref", model, [eager], state_dir)
        checks.append(check("reference taken under eager at READY", r.get("ready") and bool(r.get("reference_taken")),
                            r.get("reference_taken")))
        runs["graphs"] = r = self.fidelity_run("fid-graphs", model, [graphs, eager], state_dir)
        checks.append(check("the CUDA-graph profile passes fidelity and is READY",
                            r.get("ready_profile") == "graphs" and any(c.get("result") == "pass"
                                                                       for c in r.get("checks", [])),
                            {"checks": r.get("checks"), "mismatch": r.get("mismatch")}))
        runs["graphs_again"] = r = self.fidelity_run("fid-graphs2", model, [graphs, eager], state_dir)
        checks.append(check("a repeated start of the same profile passes",
                            r.get("ready_profile") == "graphs" and any(c.get("result") == "pass"
                                                                       for c in r.get("checks", [])),
                            {"checks": r.get("checks"), "mismatch": r.get("mismatch")}))
        if self.real:
            runs["damaged"] = {"damage": damage_layer(Path(model) / "model.safetensors")}
            faults = ""
        else:
            runs["damaged"] = {"damage": "simulated: garbage-output"}
            faults = "garbage-output"
        runs["damaged"].update(self.fidelity_run("fid-damaged", model, [graphs], state_dir, faults))
        r = runs["damaged"]
        checks.append(check("the damaged start never sent READY", not r.get("ready"), r.get("launch_to_READY_s")))
        checks.append(check("it failed with output_mismatch", ("graphs", "output_mismatch") in
                            [tuple(f) for f in r.get("failed", [])], {"failed": r.get("failed"),
                                                                       "mismatch": r.get("mismatch")}))
        self.record("s16_fidelity", checks, {"runs": runs, "model": model})

    # -- scenario 6 ------------------------------------------------------------------------------

    def s6_tune(self) -> None:
        """Item 4 of issue 16: `tune` over the ladder (graphs, no-prefill-graph, eager) on the
        GPU-bound ~8B model; its ranking against a hand-measured order of the same profiles (the
        same argv started by hand, streamed probes); then `run` on the same state directory must
        start tune's winner. Hand launches go first: they also compile the prefill graph's kernels,
        so no profile's tune start pays a first-time JIT."""
        if importlib.util.find_spec("sglang_supervisor.commands.tune") is None:
            self.skip("s6_tune", "not run: sglang_supervisor/commands/tune.py does not exist in this checkout")
            return
        need = 420 if self.real else 40
        if self.left() < need:
            self.skip("s6_tune", f"not run: budget ({self.left():.0f} s left, {need} s needed)")
            return
        cfg = self.big_config("tune", PROFILES)
        # The ladder itself decides the prefill graph here (BIG_ARGS keeps it off for the A/B).
        cfg["engine"]["args"].pop("cuda-graph-backend-prefill", None)
        cfg["probe"].update({"max_new_tokens": 256})
        names = [p["name"] for p in PROFILES]
        rounds = max(3, self.o.probe_runs)
        numbers: dict[str, Any] = {"profiles": names, "rounds": rounds}
        checks: list[dict[str, Any]] = []
        hand: dict[str, dict[str, Any]] = {}
        for name in names:
            if self.left() < (250 if self.real else 20):  # tune's three starts and run's one
                hand[name] = {"skipped": f"{self.left():.0f} s left"}
                continue
            res = self.hand_launch(cfg, profile=name, log_name=f"tune-hand-{name}.log", runs=rounds)
            series = res.get("probe_series") or {}
            ttfts = [r["ttft_s"] for r in series.get("runs", []) if r.get("ttft_s") is not None]
            hand[name] = {"ready_s": res.get("ready_after_s"), "median_tok_s": series.get("median_tok_s"),
                          "tok_s": [r["decode_tok_s"] for r in series.get("runs", [])],
                          "ttft_median_s": statistics.median(ttfts) if ttfts else None,
                          "error": res.get("error")}
        numbers["hand"] = hand
        hand_tps = {n: float(h["median_tok_s"]) for n, h in hand.items() if h.get("median_tok_s")}
        numbers["hand_order"] = sorted(hand_tps, key=lambda n: -hand_tps[n])
        path = self.work / "tune" / "tune.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        t0 = time.time()
        try:
            r = subprocess.run([self.o.python, "-m", "sglang_supervisor", "tune", "--config", str(path),
                                "--rounds", str(rounds), "--json"], capture_output=True, text=True,
                               timeout=max(10, self.left() - (90 if self.real else 10)))
            out, err, rc = r.stdout, r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            rc = "timeout"
        numbers["tune_wall_s"] = round(time.time() - t0, 1)
        numbers["tune_progress"] = err.splitlines()[-30:]
        doc: Any = None
        with contextlib.suppress(ValueError):
            doc = json.loads(out)
        ranking = doc.get("ranking", []) if isinstance(doc, dict) else []
        winner = doc.get("winner") if isinstance(doc, dict) else None
        numbers["tune"] = doc
        tune_order = [e["profile"] for e in ranking if e.get("decode_tps_p50") is not None]
        numbers["tune_order"] = tune_order
        numbers["tune_over_hand"] = {
            e["profile"]: round(e["decode_tps_p50"] / hand_tps[e["profile"]], 4)
            for e in ranking if e.get("decode_tps_p50") and e["profile"] in hand_tps}
        checks.append(check("tune exit 0", rc == 0, rc))
        checks.append(check("tune ranked every profile of the ladder", len(tune_order) == len(names), tune_order))
        checks.append(check("every profile measured by hand", len(hand_tps) == len(names), numbers["hand_order"]))
        if self.real:  # on a shared CPU the order measures the neighbours
            bad = ranking_disagreements(tune_order, hand_tps)
            checks.append(check(f"tune's order agrees with the hand-measured order (ties: < {TIE_FRACTION:.0%})",
                                bool(tune_order) and len(hand_tps) == len(names) and not bad,
                                bad or {"tune": tune_order, "hand": numbers["hand_order"]}))
        # `run` on the same state directory starts the winner (READY in ~56 s on the H200, warm JIT).
        if winner and self.left() > (75 if self.real else 15):
            sup = SupervisorRun(self.o.python, cfg, self.work / "tune-run", "tune-run")
            try:
                ok = sup.wait(lambda: bool(sup.notify.times("READY=1")), self.deadline - 5)
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
        else:
            checks.append(check("run of the winner fitted the budget", False,
                                {"winner": winner, "left_s": round(self.left())}))
        self.record("s6_tune", checks, numbers)

    # -- scenario 11: a multi-node group on one host (--nnodes 2: one GPU per "node") -----------

    def s11_multinode(self) -> None:
        """Leader + worker supervisors, SGLang's --nnodes 2 --dist-init-addr 127.0.0.1:PORT, one
        GPU each (CUDA_VISIBLE_DEVICES): READY only after the worker's captures; a worker rank
        SIGKILLed -> the group restarts within the bound and is READY again."""
        if self.o.nnodes != 2 or self.o.tp % 2:
            self.skip("s11_multinode", "not run: needs --nnodes 2 and an even --tp")
            return
        host = self.o.dist_init_addr
        dist, link = f"{host}:{free_port()}", f"{host}:{free_port()}"
        runs: list[SupervisorRun] = []
        # The link's shared secret (group.secret_file): one owner-only file for both nodes.
        secret = self.work / "group.secret"
        self.work.mkdir(parents=True, exist_ok=True)
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        try:
            for rank in (0, 1):
                cfg = self.config(f"node{rank}")
                cfg["group"] = {"nnodes": 2, "node_rank": rank, "dist_init_addr": dist, "link": link,
                                "leader_timeout_s": 10.0, "poll_interval_s": 0.5,
                                "secret_file": str(secret)}
                if self.real:  # SGLang uses GPU base_gpu_id + local rank on each node: split them
                    per = self.o.tp // 2
                    cfg["engine"]["env"]["CUDA_VISIBLE_DEVICES"] = ",".join(
                        str(g) for g in range(rank * per, (rank + 1) * per))
                runs.append(SupervisorRun(self.o.python, cfg, self.work / f"node{rank}", f"node{rank}"))
            leader, worker = runs
            deadline = time.time() + min(self.left(), 600)
            ready = leader.wait(lambda: bool(leader.notify.times("READY=1")), deadline)
            # The log line comes through the supervisor's log writer thread: it may reach us some
            # ms after the READY=1 datagram (measured up to ~30 ms under load), so wait for it.
            leader.wait(lambda: bool(leader.named("supervisor.ready")), time.time() + 10)
            members = leader.named("group.members_ready")
            sup_ready = leader.named("supervisor.ready")
            checks = [check("leader READY=1", bool(ready)),
                      check("members ready before supervisor.ready",
                            bool(members and sup_ready and members[0][0] <= sup_ready[0][0])),
                      check("worker engine started", bool(worker.named("group.engine_start")))]
            numbers: dict[str, Any] = {}
            ranks = [p for p in descendants(worker.proc.pid)
                     if "scheduler" in p["cmd"] or p["comm"].startswith("sglang::sched")]
            if ready and ranks:
                t_kill = time.time()
                os.kill(ranks[0]["pid"], signal.SIGKILL)
                again = leader.wait(lambda: len(leader.notify.times("READY=1")) >= 2,
                                    time.time() + min(self.left(), 600))
                stopped = [t for t, d in leader.named("engine.stopped")
                           if d.get("reason") == "group_member_failed"]
                numbers["worker_rank_kill_to_leader_engine_stopped_s"] = (
                    round(stopped[0] - t_kill, 2) if stopped else None)
                checks += [check("group restarted and READY again", again),
                           check("leader engine ended within 30 s",
                                 bool(stopped) and stopped[0] - t_kill < 30,
                                 numbers["worker_rank_kill_to_leader_engine_stopped_s"])]
            else:
                checks.append(check("a scheduler process of the worker node was found", bool(ranks)))
            for run in (worker, leader):
                rc, secs = run.stop(60)
                checks.append(check(f"{run.cfg_path.stem} stopped with 0", rc == 0, {"rc": rc, "s": secs}))
            self.record("s11_multinode", checks, numbers)
        finally:
            for run in runs:
                run.close()

    # -- scenario 14: the upgrade canary between two real releases (issue 24) -------------------

    def canary_releases(self, work: Path) -> tuple[dict[str, str], dict[str, Any], list[dict[str, Any]]]:
        """Two interpreter wrappers, each seeing exactly one release; what each one sees."""
        python = self.o.engine_python
        if self.real:
            spec = {CANARY_OLD: (Path("/tmp/rel16/bin"), [CANARY_SITE16], [], CANARY_SITE16),
                    CANARY_NEW: (Path("/tmp/rel17/bin"), [], [], "/tmp/site")}
            strip = [CANARY_SITE16]
        else:  # as tests/integration/test_upgrade_canary.py: a dist-info + the simulator's release
            spec, strip = {}, []
            for version in (CANARY_OLD, CANARY_NEW):
                root = work / f"rel{version.rsplit('.', 1)[1]}"
                dist = root / "site" / f"sglang-{version}.dist-info"
                dist.mkdir(parents=True, exist_ok=True)
                (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
                load = shlex.quote(str(work / "foreign-load"))
                lines = [f"export SGLANG_SIM_VERSION={version} SGLANG_SIM_DECODE_TPS={SIM_TPS}",
                         f"[ -e {load} ] && export SGLANG_SIM_DECODE_TPS={SIM_LOADED_TPS}"]
                spec[version] = (root / "bin", [str(root / "site")], lines, str(root / "site"))
                strip.append(str(root / "site"))
        pythons: dict[str, str] = {}
        seen: dict[str, Any] = {}
        checks: list[dict[str, Any]] = []
        for version, (bindir, prepend, lines, site) in spec.items():
            pythons[version] = write_wrapper(bindir, release_wrapper(python, prepend, strip, lines))
            r = subprocess.run([pythons[version], "-c", _RELEASE_SNIPPET], capture_output=True,
                               text=True, timeout=120, check=False)
            got: dict[str, Any] = {"rc": r.returncode, "stderr_tail": r.stderr[-300:] or None}
            with contextlib.suppress(ValueError, IndexError):
                got.update(json.loads(r.stdout.strip().splitlines()[-1]))
            seen[pythons[version]] = got
            where = got.get("file") or ""
            ok = got.get("version") == version and (not self.real or where.startswith(site + "/"))
            checks.append(check(f"wrapper {pythons[version]} sees SGLang {version} only"
                                + (f" (from {site})" if self.real else ""), ok, got))
        (work / "releases-seen.json").write_text(json.dumps(seen, indent=1))
        return pythons, seen, checks

    def canary_config(self, python: str) -> dict[str, Any]:
        cfg = self.config("canary", profiles=CANARY_PROFILES)
        e = cfg["engine"]
        e["command"] = [python, "-m", "sglang.launch_server" if self.real else "sglang_supervisor.simulator"]
        e["version"] = "auto"
        if not self.real:  # the simulator's release comes from the wrapper, as for a real venv
            e["interpreter"] = python
            e["env"].pop("SGLANG_SIM_VERSION", None)
        cfg["upgrade"] = {"min_tps_ratio": CANARY_MIN_TPS_RATIO, "max_ttft_ratio": CANARY_MAX_TTFT_RATIO}
        return cfg

    def upgrade_cli(self, sup: SupervisorRun, name: str, *args: str) -> dict[str, Any]:
        """`sglang-supervisor upgrade`, its output saved beside the supervisor's log."""
        r = subprocess.run([self.o.python, "-m", "sglang_supervisor", "upgrade", "--config",
                            str(sup.cfg_path), *args], capture_output=True, text=True, timeout=180,
                           check=False)
        (sup.workdir / f"{name}.log").write_text(
            f"$ upgrade {' '.join(args)}\nrc={r.returncode}\n--- stdout\n{r.stdout}--- stderr\n{r.stderr}")
        return {"rc": r.returncode, "stdout": r.stdout[-3000:], "stderr": r.stderr[-1000:]}

    def served_version(self, sup: SupervisorRun) -> dict[str, Any]:
        """The serving release: the engine's own /server_info (real SGLang) and /status."""
        out: dict[str, Any] = {"status_engine_version": sup.status().get("engine_version")}
        for route in ("/server_info", "/get_server_info"):
            st, body = http(sup.engine_url + route, timeout=20)
            if st == 200:
                with contextlib.suppress(ValueError, AttributeError):
                    out["engine_version"] = json.loads(body).get("version")
                break
        # The simulator answers with its behaviour row's release (0.5.16 runs as 0.5.14's row).
        out["version"] = out.get("engine_version") if self.real else out["status_engine_version"]
        return out

    def canary_wait(self, sup: SupervisorRun, n_verdicts: int, n_ready: int, budget: float) -> bool:
        until = min(self.deadline - 25, time.time() + budget)
        return sup.wait(lambda: len(sup.named("upgrade.verdict")) > n_verdicts
                        and len(sup.notify.times("READY=1")) > n_ready, until, step=0.5)

    def s14_canary(self) -> None:
        """The upgrade canary on two real releases: 0.5.16 serves, 0.5.17 is checked and put on
        trial (promoted), made the configured release, then 0.5.16 is put on trial under a foreign
        GPU load (rolled back: 0.5.17 serves again). See docs/OPERATIONS.md, "Upgrade SGLang"."""
        name = "s14_canary"
        need = 280 if self.real else 60
        if self.real and not Path(CANARY_SITE16, "sglang").is_dir():
            self.skip(name, f"{CANARY_SITE16} is missing: carry .sgl16 (sglang16.tar.xz)")
            return
        if self.left() < need:
            self.skip(name, f"budget: {self.left():.0f} s left, {need} s needed")
            return
        work = self.work / "canary"
        work.mkdir(parents=True, exist_ok=True)
        pythons, seen, checks = self.canary_releases(work)
        old, new = pythons[CANARY_OLD], pythons[CANARY_NEW]
        numbers: dict[str, Any] = {"wrappers": seen, "min_tps_ratio": CANARY_MIN_TPS_RATIO,
                                   "max_ttft_ratio": CANARY_MAX_TTFT_RATIO}
        cfg = self.canary_config(old)
        sup = SupervisorRun(self.o.python, cfg, work, "canary")
        try:
            if self.canary_promote(sup, old, new, checks, numbers):
                self.canary_rollback(sup, cfg, old, new, checks, numbers)
            self.canary_finish(sup, checks, numbers)
        finally:
            sup.close()
        self.record(name, checks, numbers, note=(
            f"upgrade.min_tps_ratio {CANARY_MIN_TPS_RATIO} (product default 0.98, meant for real "
            "models): the tiny model's launch-to-launch tok/s varies up to ~15 % (docs/gpu-validation "
            f"round 6); upgrade.max_ttft_ratio {CANARY_MAX_TTFT_RATIO} for the same reason (a "
            "millisecond TTFT). The rollback is caused by a foreign matmul loop on the same GPU."))

    def canary_promote(self, sup: SupervisorRun, old: str, new: str, checks: list[dict[str, Any]],
                       numbers: dict[str, Any]) -> bool:
        """Steps 1-3: the old release serves; `upgrade --check`; `upgrade --now`: promoted."""
        ok = sup.wait(lambda: bool(sup.notify.times("READY=1")),
                      min(self.deadline - 200, time.time() + (240 if self.real else 60)))
        if ok:
            sup.wait(lambda: bool(sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
        readies = sup.named("supervisor.ready")
        served = self.served_version(sup) if ok else {}
        numbers["step1_serve_old"] = {"ready": readies[0][1] if readies else None, "served": served,
                                      "launch_to_READY_s": round(sup.notify.times("READY=1")[0] - sup.t0, 1)
                                      if ok else None}
        checks.append(check(f"step 1: READY with SGLang {CANARY_OLD}", ok, numbers["step1_serve_old"]))
        checks.append(check(f"step 1: the engine serves {CANARY_OLD}", served.get("version") == CANARY_OLD
                            and served.get("status_engine_version") == CANARY_OLD, served))
        if not ok:
            return False
        checked = self.upgrade_cli(sup, "upgrade-check", "--to", new, "--check")
        numbers["step2_check"] = checked
        checks.append(check("step 2: upgrade --check exits 0 with a line per profile",
                            checked["rc"] == 0 and "decode-graphs" in checked["stdout"],
                            {"rc": checked["rc"], "stdout": checked["stdout"][-600:]}))
        n_ready = len(sup.notify.times("READY=1"))
        asked = self.upgrade_cli(sup, "upgrade-now-promote", "--to", new, "--now")
        judged = asked["rc"] == 0 and self.canary_wait(sup, 0, n_ready, 240 if self.real else 60)
        verdicts = sup.named("upgrade.verdict")
        v = verdicts[0][1] if verdicts else {}
        served = self.served_version(sup) if judged else {}
        numbers["step3_promote"] = {"upgrade_now": asked, "verdict": v, "served": served,
                                    "canary_begin": (sup.named("upgrade.canary_begin") or [(0, None)])[0][1]}
        checks.append(check(f"step 3: {CANARY_OLD} -> {CANARY_NEW} promoted",
                            v.get("verdict") == "promoted", {k: v.get(k) for k in (
                                "verdict", "tps_ratio", "tok_s", "reference_tok_s", "ttft_ratio", "reason")}))
        checks.append(check(f"step 3: the engine serves {CANARY_NEW}", served.get("version") == CANARY_NEW
                            and served.get("status_engine_version") == CANARY_NEW, served))
        return v.get("verdict") == "promoted"

    def foreign_load(self, work: Path) -> Callable[[], dict[str, Any]]:
        """Start the foreign GPU load (s10's matmul loop; on the simulator a file the wrappers
        read); the returned function ends it and says what ran."""
        t0 = time.time()
        if not self.real:
            (work / "foreign-load").write_text("on\n")

            def end_sim() -> dict[str, Any]:
                (work / "foreign-load").unlink(missing_ok=True)
                return {"kind": f"simulated: the candidate decodes at {SIM_LOADED_TPS} of {SIM_TPS}",
                        "seconds": round(time.time() - t0, 1)}
            return end_sim
        hog = subprocess.Popen([self.o.engine_python, "-c", HOG, "480"], start_new_session=True,
                               stdout=(work / "foreign-load.log").open("wb"), stderr=subprocess.STDOUT)

        def end() -> dict[str, Any]:
            alive = hog.poll() is None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(hog.pid, signal.SIGKILL)
            hog.wait(30)
            return {"kind": "bf16 8192^2 matmul loop (s10's)", "pid": hog.pid,
                    "alive_until_verdict": alive, "seconds": round(time.time() - t0, 1)}
        return end

    def canary_rollback(self, sup: SupervisorRun, cfg: dict[str, Any], old: str, new: str,
                        checks: list[dict[str, Any]], numbers: dict[str, Any]) -> None:
        """Step 4: the promoted release made the configured one (a reload), then the other release
        on trial while a foreign load slows the GPU: rolled back, the promoted one serves again."""
        moved = json.loads(json.dumps(cfg))
        moved["engine"]["command"][0] = new
        if not self.real:
            moved["engine"]["interpreter"] = new
        sup.cfg_path.write_text(yaml.safe_dump(moved, sort_keys=False))
        n_end, n_launch = len(sup.named("supervisor.reload_end")), len(sup.named("engine.launch"))
        sup.proc.send_signal(signal.SIGHUP)
        reloaded = sup.wait(lambda: len(sup.named("supervisor.reload_end")) > n_end,
                            time.time() + (90 if self.real else 30), step=0.5)
        end = sup.named("supervisor.reload_end")[n_end:]
        numbers["step4a_configure_new"] = {"reload_end": end[0][1] if end else None,
                                           "engine_launches": len(sup.named("engine.launch")) - n_launch,
                                           "served": self.served_version(sup)}
        checks.append(check(f"step 4a: engine.command moved to {CANARY_NEW}'s venv, reloaded, still serving it",
                            reloaded and numbers["step4a_configure_new"]["served"].get("version") == CANARY_NEW,
                            numbers["step4a_configure_new"]))
        n_ready, n_verdict = len(sup.notify.times("READY=1")), len(sup.named("upgrade.verdict"))
        end_load = self.foreign_load(sup.workdir)
        try:
            asked = self.upgrade_cli(sup, "upgrade-now-rollback", "--to", old, "--now")
            sup.wait(lambda: len(sup.named("upgrade.verdict")) > n_verdict,
                     min(self.deadline - 60, time.time() + (240 if self.real else 60)), step=0.5)
        finally:
            load = end_load()
        again = self.canary_wait(sup, n_verdict, n_ready, 180 if self.real else 60)
        v = (sup.named("upgrade.verdict")[n_verdict:] or [(0, {})])[0][1]
        rolled = (sup.named("supervisor.reload_rolled_back") or [(0, {})])[-1][1]
        t_v = (sup.named("upgrade.verdict")[n_verdict:] or [(time.time(), {})])[0][0]
        if again:  # the JSON log (a writer thread) may trail the READY=1 datagram a little
            sup.wait(lambda: any(t >= t_v for t, _ in sup.named("supervisor.ready")), time.time() + LOG_LAG_S)
        after = [d for t, d in sup.named("supervisor.ready") if t >= t_v]
        served = self.served_version(sup) if again else {}
        ref = v.get("reference_tok_s")
        numbers["step4b_rollback"] = {
            "upgrade_now": asked, "verdict": v, "reload_rolled_back": rolled, "served": served,
            "foreign_load": load, "ready_after_rollback": after[0] if after else None,
            "candidate_tok_s_under_load_over_reference": v.get("tps_ratio"),
            "served_again_tok_s_over_reference": round(after[0]["tok_s"] / ref, 4)
            if after and after[0].get("tok_s") and ref else None}
        checks.append(check(f"step 4: {CANARY_NEW} -> {CANARY_OLD} under a foreign GPU load rolled back",
                            v.get("verdict") == "rolled_back", {k: v.get(k) for k in (
                                "verdict", "tps_ratio", "tok_s", "reference_tok_s", "ttft_ratio", "reason")}))
        checks.append(check("step 4: rolled back by the canary's measurement (canary_rejected)",
                            rolled.get("failure_class") == "canary_rejected", rolled or None))
        checks.append(check(f"step 4: READY again, the engine serves {CANARY_NEW}",
                            again and served.get("version") == CANARY_NEW
                            and served.get("status_engine_version") == CANARY_NEW, served))

    def canary_finish(self, sup: SupervisorRun, checks: list[dict[str, Any]], numbers: dict[str, Any]) -> None:
        """The release memory, /status, doctor; then the stop leaves no SGLang process."""
        status = sup.status()
        numbers["status_upgrade"] = status.get("upgrade")
        last = ((status.get("upgrade") or {}).get("last_verdict") or {})
        checks.append(check("/status upgrade block names the last verdict (rolled_back, 0.5.16)",
                            last.get("verdict") == "rolled_back" and last.get("version") == CANARY_OLD,
                            last or status.get("upgrade")))
        book_path = Path(sup.config["state_dir"]) / f"{sup.config['name']}.releases.json"
        book: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            book = json.loads(book_path.read_text())
        verdicts = [(r.get("version"), r.get("verdict")) for r in book.get("releases") or []]
        numbers["release_memory"] = {"path": str(book_path), "releases": verdicts,
                                     "references": {v: {p: r.get("tok_s") for p, r in refs.items()}
                                                    for v, refs in (book.get("references") or {}).items()},
                                     "promoted": book.get("promoted")}
        checks.append(check("release memory lists both releases with their verdicts",
                            (CANARY_NEW, "promoted") in verdicts and (CANARY_OLD, "rolled_back") in verdicts,
                            verdicts))
        path = sup.workdir / "doctor.json"
        rc: int | str
        try:
            with path.open("wb") as f:
                rc = subprocess.run([self.o.python, "-m", "sglang_supervisor", "doctor", "--config",
                                     str(sup.cfg_path), "--json"], stdout=f, stderr=subprocess.STDOUT,
                                    timeout=max(30.0, min(180.0, self.left() - 30)), check=False).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        doc: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            doc = json.loads(path.read_text(errors="replace"))
        listed = [f.get("what", "") for f in doc.get("findings") or [] if isinstance(f, dict)
                  and str(f.get("code", "")).startswith("upgrade.")]
        numbers["doctor"] = {"rc": rc, "upgrade_findings": listed}
        checks.append(check("doctor lists both releases with their verdicts",
                            any(f"release {CANARY_NEW}" in w and "promoted" in w for w in listed)
                            and any(f"release {CANARY_OLD}" in w and "rolled_back" in w for w in listed),
                            listed))
        engine_pid = status.get("engine_pid")
        rc_stop, secs = sup.stop(90)
        numbers["sigterm"] = {"rc": rc_stop, "seconds": secs}
        checks.append(check("supervisor exits 0 on SIGTERM", rc_stop == 0, numbers["sigterm"]))
        t = time.time()
        while time.time() - t < 15 and (self.real and sglang_procs()):
            time.sleep(0.5)
        left = [p["cmd"][:60] for p in sglang_procs()] if self.real else [
            p["cmd"][:60] for p in proc_table() if engine_pid and p["pid"] == int(engine_pid) and p["state"] != "Z"]
        checks.append(check("no SGLang process left", not left, left))

    # -- driver ---------------------------------------------------------------------------------

    def run(self) -> int:
        order = {"main": self.main_run, "fallback": self.s3_fallback, "tune": self.s6_tune,
                 "pipe": self.s2b_pipe, "hand": self.s2a_hand_first, "seed": self.s7_seed_shape,
                 "systemd": self.s8_systemd, "ab": self.s9_ab, "regress": self.s10_regression,
                 "unexplained": self.s12_unexplained, "warmcache": self.s13_warmcache,
                 "captureoom": self.s15_captureoom,
                 "multinode": self.s11_multinode, "canary": self.s14_canary,
                 "fidelity": self.s16_fidelity}
        for name in self.o.only.split(","):
            try:
                order[name]()
            except Exception as exc:
                self.report.setdefault("errors", []).append(f"{name}: {type(exc).__name__}: {exc}")
                self.save()
        self.report["left_sglang_processes"] = [p["cmd"][:60] for p in sglang_procs()]
        self.save()
        self.pack_logs()
        failed = [n for n, s in self.report["scenarios"].items() if s["status"] == "fail"]
        print(json.dumps({n: s["status"] for n, s in self.report["scenarios"].items()}), flush=True)
        return 1 if failed or self.report.get("errors") else 0

    def pack_logs(self) -> None:
        with tarfile.open(self.out / "logs.tar.xz", "w:xz") as tar:
            for p in sorted(self.work.rglob("*")):
                if p.relative_to(self.work).parts[0] == "warmcache":
                    continue  # the kernel caches of s13 (Triton's *.json among them), not logs
                if p.is_file() and p.suffix in (".log", ".yaml", ".json") or p.name.startswith("engine.log"):
                    tar.add(p, arcname=str(p.relative_to(self.work)))


def _proc_net() -> list[str]:
    out: list[str] = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            out += Path(name).read_text().splitlines()[1:]
    return out


def _find_key(doc: Any, key: str) -> Any:
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        for v in doc.values():
            found = _find_key(v, key)
            if found is not None:
                return found
    elif isinstance(doc, list):
        for v in doc:
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def _findings(doc: Any) -> list[str]:
    items = _find_key(doc, "findings") or []
    out = []
    for f in items if isinstance(items, list) else []:
        if isinstance(f, dict):
            # The profile a finding belongs to: two profiles' graph findings look alike without it.
            where = f" [{f['profile']}]" if f.get("profile") else ""
            out.append(f"{f.get('severity', '?')}: {f.get('code', '')}{where}: {f.get('what', '')}"[:160])
    return out[:20]


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
                   help="comma-separated, in order: main,fallback,pipe,tune,hand,seed,systemd,ab,regress,"
                        "unexplained,warmcache,captureoom,multinode,canary,fidelity "
                        "(default: main,fallback,pipe,tune; with --nnodes 2: multinode)")
    p.add_argument("--ab-probes", type=int, default=15, help="s9_ab: streamed 256-token probes per arm")
    p.add_argument("--ab-model", choices=["big", "seed"], default="big",
                   help="s9_ab: the ~8B dense dummy model (big) or the seed's tiny hybrid shape with MTP "
                        "(seed: qwen.yaml's tuned, with --seed-drop; reported as s9_ab_seed)")
    p.add_argument("--seed-hand", action="store_true",
                   help="s7_seed_shape: also hand-launch the profile that became ready (same argv, same probes)")
    p.add_argument("--seed-drop", default="",
                   help="seed scenarios: comma-separated flags taken out of every qwen.yaml profile")
    p.add_argument("--seed-model", default="/tmp/tiny36",
                   help="seed scenario: model directory (real; made by make_tiny_qwen36.py if absent)")
    p.add_argument("--systemd-restart", action="store_true",
                   help="s8_systemd: also time `systemctl restart` to READY against the unit's first start "
                        "(real PrivateTmp, the kernel caches under CacheDirectory; issue 26)")
    p.add_argument("--oom-margin-gb", type=float, default=None,
                   help="captureoom: GB the holder leaves free at each start's `Memory pool end` (default: "
                        "halfway between what the decode graphs needed at batch 512 and at 256, measured "
                        "in two calibration starts; the flag skips the 256 one)")
    p.add_argument("--nnodes", type=int, default=1,
                   help="2: the multi-node scenario, two supervisors on one host, --tp/2 GPUs each")
    p.add_argument("--dist-init-addr", default="127.0.0.1",
                   help="host of the leader's dist-init store and group link (ports are picked)")
    opts = p.parse_args(argv)
    if opts.only is None:
        opts.only = "multinode" if opts.nnodes > 1 else "main,fallback,pipe,tune"
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.tp < 1:
        print("gpu-e2e: --tp must be at least 1", file=sys.stderr)
        return 2
    shutil.rmtree(opts.workdir, ignore_errors=True)
    return E2E(opts).run()


if __name__ == "__main__":
    sys.exit(main())
