"""tune over the simulator: the ranking follows the simulator's throughput model, a failing
profile is survived, the winner is what `run` starts with next, and tune calls a start ready and
failed exactly as the daemon does (its ready gate, its failure ranker)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_supervisor.commands import tune
from sglang_supervisor.core import failover, wayback
from sglang_supervisor.shell.files import state
from sglang_supervisor.shell.files.configfile import load_config
from sglang_supervisor.shell.supervisor import policy_settings, prepare
from tiers import require

pytestmark = pytest.mark.integration

MODEL = "Qwen/Qwen3-1B"
DECODE_TPS = 400.0
SPEC = {
    "speculative-algorithm": "NEXTN",
    "speculative-num-steps": 3,
    "speculative-eagle-topk": 1,
    "speculative-num-draft-tokens": 4,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp_path: Path) -> Path:
    data = {
        "name": "tunetest",
        "engine": {
            "command": ["{python}", "-m", "sglang_supervisor.simulator"],
            "version": "0.5.23",
            "model_path": MODEL,
            "port": free_port(),
            "log_file": str(tmp_path / "engine.log"),
            "env": {"SGLANG_SIM_TIME_SCALE": "0.01", "SGLANG_SIM_DECODE_TPS": f"{DECODE_TPS:g}"},
        },
        "profiles": [
            {
                "name": "eager",
                "args": {"cuda-graph-backend-decode": "disabled", "cuda-graph-backend-prefill": "disabled"},
            },
            # Not an OOM: no derived profile follows it (test_tune_measures_the_derived_profile...).
            {"name": "broken", "env": {"SGLANG_SIM_FAULTS": "capture-fail:decode:error"}},
            {"name": "plain"},
            {"name": "spec", "args": SPEC},
        ],
        "probe": {"input_tokens": 16, "max_new_tokens": 24, "timeout_s": 30},
        "metrics": {"enabled": False},
        "timeouts": {"stall_s": 60, "start_s": 120, "drain_s": 5, "kill_s": 5},
        "state_dir": str(tmp_path / "state"),
    }
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def expected_order() -> list[str]:
    from sglang_supervisor.simulator import throughput

    gb = throughput.model_gb_from_path(MODEL)
    model = {
        "eager": throughput.Profile(gb, decode_graph=False, prefill_graph=False, base_tps=DECODE_TPS),
        "plain": throughput.Profile(gb, base_tps=DECODE_TPS),
        "spec": throughput.Profile(gb, spec_steps=3, spec_draft_tokens=4, spec_topk=1, base_tps=DECODE_TPS),
    }
    return sorted(model, key=lambda n: -throughput.single_stream_tps(model[n]))


def run_tune(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`sglang-supervisor tune --config PATH ARGS`, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "sglang_supervisor", "tune", "--config", str(path), *args],
                          capture_output=True, text=True, timeout=600, check=False)


def tune_report(path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`tune --json` that must succeed: the process (its stderr has the progress) and the report."""
    proc = run_tune(path, *args, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads(proc.stdout)


def tune_profiles(tmp_path: Path, data: dict[str, Any]) -> tuple[Path, subprocess.CompletedProcess[str],
                                                                  dict[str, Any], dict[str, Any]]:
    """One round of `tune --json` over `data` written as tune.yaml: its path, the process, the
    report and the report's rows by profile."""
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(data))
    proc, report = tune_report(path, "--rounds", "1")
    return path, proc, report, {r["profile"]: r for r in report["ranking"]}


def test_tune_ranks_by_the_simulators_model_and_survives_a_failure(tmp_path: Path) -> None:
    require(
        importlib.util.find_spec("sglang_supervisor.simulator.cli") is not None,
        "the SGLang simulator (sglang_supervisor.simulator.cli) is not available",
    )
    path = write_config(tmp_path)
    proc, report = tune_report(path, "--rounds", "2")
    ranking = report["ranking"]
    working = [r["profile"] for r in ranking if r["decode_tps_p50"] is not None]
    assert working == expected_order()
    broken = next(r for r in ranking if r["profile"] == "broken")
    assert broken["started"] is False and broken["failure"] and ranking[-1]["profile"] == "broken"
    assert "[4/4] spec: starting" in proc.stderr  # live progress, profile by profile
    # run: the same fingerprint, the winner first
    config = load_config(path)
    prepared = prepare(config, "0.5.23")
    store = state.StateStore(config.state_dir, config.name)
    fp = tune.deployment_fingerprint(prepared)
    assert store.ranking(fp) == working
    # The plan `run` makes from that state (Supervisor._settings): the winner goes first, no
    # probation for eager (ranked, slower) nor for broken (its failure here is remembered).
    fs = store.fingerprint_state(fp)
    assert set(fs.bad) == {"broken"}
    plan = wayback.start_plan(config.profile_names, store.last_good(fp), ranking=store.ranking(fp),
                              bad=fs.bad, now=time.time(), policy=wayback.Policy())
    assert plan.probation is None
    settings = policy_settings(config, last_good=plan.last_good, known_bad=plan.backoff,
                               probation=plan.probation, retry_known_bad=False)
    assert failover.ladder_order(settings)[0] == report["winner"] == working[0]


def test_tune_measures_the_derived_profile_run_would_start_after_a_failure(tmp_path: Path) -> None:
    """Issue 25 C: `graphs` runs out of memory capturing its decode graphs until the command caps
    their batch size (the simulator's `unless=`). tune tries what `run` would start next, the
    same profile with half of SGLang's resolved max batch (256), ranks it with its base and
    change, and, as it serves fastest, persists it as the winner `run` starts with."""
    data = yaml.safe_load(write_config(tmp_path).read_text())
    data["profiles"] = [
        {"name": "graphs",
         "env": {"SGLANG_SIM_FAULTS": "capture-fail:decode:oom+unless=--cuda-graph-max-bs-decode"}},
        {"name": "eager",
         "args": {"cuda-graph-backend-decode": "disabled", "cuda-graph-backend-prefill": "disabled"}},
    ]
    path, proc, report, by_name = tune_profiles(tmp_path, data)
    assert by_name["graphs"]["started"] is False and by_name["graphs"]["failure"] == "capture_oom"
    derived = by_name["graphs-graph-bs-128"]
    assert derived["started"] is True and derived["decode_tps_p50"] is not None, derived
    assert (derived["base"], derived["change"]) == ("graphs", "--cuda-graph-max-bs-decode 256 -> 128")
    assert report["winner"] == "graphs-graph-bs-128"  # decode graphs beat eager
    assert "trying the derived graphs-graph-bs-128" in proc.stderr
    # run starts with it: remembered with its change, on the ladder right after its base.
    config = load_config(path)
    prepared = prepare(config, "0.5.23")
    store = state.StateStore(config.state_dir, config.name)
    fp = tune.deployment_fingerprint(prepared)
    fs = store.fingerprint_state(fp)
    assert store.last_good(fp) == "graphs-graph-bs-128"
    assert fs.derived["graphs-graph-bs-128"].args == {"cuda-graph-max-bs-decode": 128}
    assert set(fs.bad) == {"graphs"}
    table = run_tune(path, "--rounds", "1", "--profiles", "graphs")
    assert "derived: graphs-graph-bs-128 = graphs with --cuda-graph-max-bs-decode 256 -> 128" in table.stdout


# The simulator behind a filter: drops the lines that contain $SIM_WRAP_DROP and writes
# $SIM_WRAP_FIRST first, so that one profile's log lacks a line SGLang prints (or has one more).
WRAPPER = """
import os, signal, subprocess, sys
drop = os.environ.get("SIM_WRAP_DROP", "").encode()
first = os.environ.get("SIM_WRAP_FIRST", "")
child = subprocess.Popen([sys.executable, "-m", "sglang_supervisor.simulator", *sys.argv[1:]],
                         stderr=subprocess.PIPE)
signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
if first:
    sys.stderr.write(first + "\\n")
    sys.stderr.flush()
for raw in child.stderr:
    if not (drop and drop in raw):
        sys.stderr.buffer.write(raw)
        sys.stderr.buffer.flush()
sys.exit(child.wait())
"""


def test_tune_decides_ready_and_failure_as_the_daemon(tmp_path: Path) -> None:
    """A profile whose prefill capture never ends (its end line never comes) but which prints the
    ready line and serves is not working (the daemon's ready gate: capture_failed); a start whose
    log has a CUDA error line and then SGLang's KV-cache OOM is a kv_cache_oom (the failure
    ranker), not the first line's cuda_error."""
    wrapper = tmp_path / "wrap.py"
    wrapper.write_text(WRAPPER)
    data = yaml.safe_load(write_config(tmp_path).read_text())
    data["engine"]["command"] = ["{python}", str(wrapper)]
    data["profiles"] = [
        {"name": "no-prefill-end", "env": {"SIM_WRAP_DROP": "Capture target prefill CUDA graph end"}},
        {"name": "kv-oom", "env": {
            "SGLANG_SIM_FAULTS": "kv-oom",
            "SIM_WRAP_FIRST": "[2026-12-01 10:00:00 TP1] RuntimeError: CUDA error: an illegal memory "
                              "access was encountered"}},
        {"name": "plain"},
    ]
    _, _, report, by_name = tune_profiles(tmp_path, data)
    assert report["winner"] == "plain"
    assert [r["profile"] for r in report["ranking"] if r["decode_tps_p50"] is not None] == ["plain"]
    missing = by_name["no-prefill-end"]
    assert missing["started"] is False and missing["failure"] == "capture_failed", missing
    assert "target prefill@main" in (missing["detail"] or ""), missing
    oom = by_name["kv-oom"]
    assert oom["started"] is False and oom["failure"] == "kv_cache_oom", oom
    assert "mem-fraction-static" in (oom["detail"] or ""), oom
