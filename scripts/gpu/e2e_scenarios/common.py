"""What every scenario of scripts/gpu/e2e.py shares: the release, the supervisor configuration one
run gets, the engine log lines read with our own regexes, a check and the report's Markdown."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# scripts/gpu/: the helper scripts (make_tiny_qwen3*.py, systemd-unit.sh) beside e2e.py.
GPU_SCRIPTS = Path(__file__).resolve().parents[1]
ROOT = GPU_SCRIPTS.parents[1]
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
# A foreign CUDA job on the engine's GPU (not a child of the supervisor): bf16 8192^2 matmuls.
HOG = ("import torch,time,sys\na=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16)\n"
       "t=time.time()\nwhile time.time()-t<float(sys.argv[1]):\n  b=a@a\ntorch.cuda.synchronize()\n")
# Scenario 3's ladder: a memory fraction that leaves no KV cache (a real, fast start failure),
# then eager.
FAIL_FRACTION = 0.0001


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
