"""The seed's deployment (etc/sglang-supervisor/qwen.yaml) adapted to one lent H200: pure helpers.

`scripts/gpu/e2e.py --only seed` runs it. Only what the device forces is changed: one GPU (tp-size
1), the model path (a tiny random model of the seed's architecture, scripts/gpu/make_tiny_qwen36.py),
the memory fractions (scaled by the same factor, so the ladder keeps its order), the pruned SGLang
install's backends (no FlashAttention-3, no xgrammar), `--load-format dummy` (random weights for the
target and its MTP draft), and the machine-local paths and ports. The profiles, remediation rules,
timeouts, restart and probe settings are qwen.yaml's own.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SEED_YAML = ROOT / "etc" / "sglang-supervisor" / "qwen.yaml"
# The pruned 0.5.17 install on the device lacks FlashAttention-3 (the Hopper default) and xgrammar.
DEVICE_ARGS: dict[str, Any] = {
    "attention-backend": "triton",
    "sampling-backend": "pytorch",
    "grammar-backend": "none",
    "load-format": "dummy",
}
# qwen.yaml's 0.88 (and 0.80 for the memory-saving rungs) are for a 27B model on two 96 GB cards;
# the tiny model on one H200 needs a fraction of that, and the same ratio keeps low-mem below tuned.
MEM_SCALE = 0.3 / 0.88
# The simulator decides "hybrid Qwen3.5/3.6" from the model name, as a stand-in for the config.
SIM_MODEL = "Qwen/Qwen3.5-0.8B"  # a real hybrid checkpoint with an MTP layer, small enough for TP 1

ACCEPT_LEN = re.compile(r"accept len: (?P<len>[\d.]+)")
CAPTURE_ANY = re.compile(
    r"Capture (?:(?P<owner>target|draft) (?P<graph>[\w-]+) CUDA graph|(?P<legacy>[\w ]*?cuda graph)) "
    r"(?P<state>begin|end)", re.IGNORECASE)


def seed_config(*, engine: str, python: str, model: str, port: int, metrics_port: int, workdir: Path,
                sim_env: dict[str, str] | None = None, source: Path = SEED_YAML,
                drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """qwen.yaml with the device's adaptations (see the module docstring); plain YAML data.
    `drop`: flags taken out of every profile (an experiment, recorded in `adaptations`)."""
    doc = yaml.safe_load(source.read_text())
    cfg = copy.deepcopy(doc)
    for prof in cfg["profiles"]:
        for flag in drop:
            (prof.get("args") or {}).pop(flag, None)
    eng = cfg["engine"]
    if engine == "real":
        eng["command"] = [python, "-m", "sglang.launch_server"]
    else:
        eng["command"] = ["{python}", "-m", "sglang_supervisor.simulator"]
        eng["env"] = {**(eng.get("env") or {}), **(sim_env or {})}
    eng["version"] = "0.5.17"
    eng["model_path"] = model
    eng["port"] = port
    args = dict(eng["args"])
    args["tp-size"] = 1
    args["mem-fraction-static"] = round(float(args["mem-fraction-static"]) * MEM_SCALE, 3)
    args.update(DEVICE_ARGS)
    eng["args"] = args
    eng["log_file"] = str(workdir / "engine.log")
    for key in ("api_key_file", "api_key_credential"):
        eng.pop(key, None)
    for prof in cfg["profiles"]:
        pargs = prof.get("args") or {}
        if "mem-fraction-static" in pargs:
            pargs["mem-fraction-static"] = round(float(pargs["mem-fraction-static"]) * MEM_SCALE, 3)
    cfg["metrics"] = {"enabled": True, "address": f"127.0.0.1:{metrics_port}"}
    cfg["logging"] = {"format": "json", "forward_engine_output": True}
    cfg["state_dir"] = str(workdir / "state")
    cfg["runtime_dir"] = str(workdir / "run")
    return cfg


def adaptations(cfg: dict[str, Any], source: Path = SEED_YAML) -> list[str]:
    """Every value that differs from qwen.yaml, as `key: seed -> here` (for the report)."""
    seed = yaml.safe_load(source.read_text())
    out: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                walk(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and path == "profiles":
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}[{i}]")
        elif a != b:
            out.append(f"{path}: {a!r} -> {b!r}")

    walk(seed, cfg, "")
    return out


def capture_sequence(lines: list[str]) -> list[str]:
    """`owner graph state` of every capture line, in log order (legacy lines as `legacy ...`)."""
    seq = []
    for text in lines:
        for m in CAPTURE_ANY.finditer(text):
            what = f"{m['owner']} {m['graph']}" if m["owner"] else f"legacy {m['legacy'].strip().lower()}"
            seq.append(f"{what} {m['state'].lower()}")
    return seq


def accept_lengths(lines: list[str]) -> list[float]:
    """NEXTN/EAGLE `accept len:` of every `Decode batch` line (SGLang 0.5.17 metrics_reporter)."""
    return [float(m["len"]) for text in lines if "Decode batch" in text and (m := ACCEPT_LEN.search(text))]


def listening_ports(proc_net: list[str]) -> set[int]:
    """TCP ports in LISTEN state (0A) from /proc/net/tcp{,6} lines."""
    ports = set()
    for line in proc_net:
        parts = line.split()
        if len(parts) > 3 and parts[3] == "0A" and ":" in parts[1]:
            ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def unit_config(*, python: str, model: str, metrics_port: int, source: Path = SEED_YAML,
                drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """The seed config as the shipped unit runs it: the unit's own directories, journald logging."""
    cfg = seed_config(engine="real", python=python, model=model, port=30000, metrics_port=metrics_port,
                      workdir=Path("/var/log/sglang-supervisor"), source=source, drop=drop)
    cfg["engine"]["log_file"] = "/var/log/sglang-supervisor/seed-engine.log"
    cfg["logging"] = {"format": "auto", "forward_engine_output": True}
    cfg["state_dir"] = "/var/lib/sglang-supervisor"
    cfg.pop("runtime_dir", None)
    return cfg
