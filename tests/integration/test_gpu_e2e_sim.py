"""scripts/gpu-e2e --engine sim: the GPU end-to-end driver's logic against the simulator.

The same scenarios that run on the H200 (READY gating, fallback, restart after a killed engine
process, clean stop, doctor, tune) run here in well under a minute. Throughput ratios are not
asserted: on a shared CPU they measure the neighbours, not the supervisor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_e2e_sim_mode_runs_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), GPU_E2E_PYTHON=sys.executable,
               GPU_E2E_WORKDIR=str(tmp_path / "work"))
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-e2e"), "--engine", "sim", "--budget-s", "280",
                           "--probe-runs", "2", "--only", "main,fallback,tune"],
                          check=False, env=env, capture_output=True, text=True, timeout=420)
    report = json.loads((out / "report.json").read_text())
    assert not report.get("errors"), report.get("errors")
    sc = report["scenarios"]

    def failed(name: str) -> list[str]:
        return [c["name"] for c in sc[name]["checks"] if not c["ok"]]

    for name in ("s1_ready_gate", "s3_fallback", "s4_restart_stop", "s5_doctor_metrics"):
        assert sc[name]["status"] == "pass", (name, failed(name), proc.stdout[-2000:])
    assert failed("s2_throughput") in ([], ["supervised / hand-launched >= 0.98"])
    assert sc["s2_throughput"]["numbers"]["hand"]["probe_series"]["median_tok_s"] > 0
    assert sc["s1_ready_gate"]["numbers"]["ready_line_to_READY_s"] > 0
    assert sc["s3_fallback"]["numbers"]["failure"]["failure_class"] == "kv_cache_oom"
    assert sc["s6_tune"]["status"] in ("pass", "not run")
    assert (out / "report.md").read_text().startswith("# GPU end-to-end report (sim engine)")
    assert (out / "logs.tar.xz").stat().st_size > 0


def test_seed_scenario_on_the_simulator_matches_the_real_capture_sequence(tmp_path: Path) -> None:
    """qwen.yaml's ladder on the simulated seed shape reaches READY on `tuned` (minus SBO, which real
    0.5.17 refuses on SM90) with the capture lines real SGLang logged for the tiny hybrid model
    (tests/fixtures/sglang-0.5.17-h200-seed/tuned-without-sbo.engine.log)."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), GPU_E2E_PYTHON=sys.executable,
               GPU_E2E_WORKDIR=str(tmp_path / "work"))
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-e2e"), "--engine", "sim", "--budget-s", "150",
                           "--probe-runs", "2", "--only", "seed",
                           "--seed-drop", "enable-single-batch-overlap"],
                          check=False, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads((out / "report.json").read_text())
    sc = report["scenarios"]["s7_seed_shape"]
    assert sc["status"] == "pass", (sc["checks"], proc.stdout[-2000:])
    n = sc["numbers"]
    assert n["ready"]["profile"] == "tuned"
    fixture = ROOT / "tests" / "fixtures" / "sglang-0.5.17-h200-seed" / "tuned-without-sbo.engine.log"
    real = fixture.read_text()
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    import seedshape

    assert n["capture_lines"] == seedshape.capture_sequence(real.splitlines()) == [
        "target prefill begin", "target prefill end", "target verify begin", "target verify end",
        "draft decode begin", "draft decode end", "draft extend begin", "draft extend end"]
    assert n["prefill_graph_disabled"] == ["some layers do not apply Standard GQA"]
    assert "profiles[0].args.enable-single-batch-overlap: True -> None" in n["adaptations"]
    assert "engine.args.tp-size: 2 -> 1" in n["adaptations"]


def test_warmcache_scenario_on_the_simulator(tmp_path: Path) -> None:
    """Scenario warmcache (issue 26) end to end on the simulator: four starts over one emulated
    CacheDirectory, the engine's cache variables all in its one key folder, nothing outside it.
    The <= 0.5 x cold checks run only on the GPU (the simulator has no JIT to cache)."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), GPU_E2E_PYTHON=sys.executable,
               GPU_E2E_WORKDIR=str(tmp_path / "work"))
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-e2e"), "--engine", "sim", "--budget-s", "200",
                           "--only", "warmcache"],
                          check=False, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads((out / "report.json").read_text())
    assert not report.get("errors"), report.get("errors")
    sc = report["scenarios"]["s13_warmcache"]
    assert sc["status"] == "pass", ([c for c in sc["checks"] if not c["ok"]], proc.stdout[-2000:])
    starts = sc["numbers"]["to_READY_s"]
    assert set(starts) == {"a_cold", "b_restart", "c_sigkill", "d_fallback_second_rung"}
    assert all(v and v > 0 for v in starts.values()), starts
    env_a = sc["numbers"]["a_cold"]["engine_cache_env"]
    assert env_a["TVM_FFI_CACHE_DIR"].startswith(str(tmp_path / "work" / "warmcache"))  # not /tmp/jit
    assert sc["numbers"]["d_fallback"]["ready_profile"] == "no-prefill-graph"


def test_gpu_e2e_fidelity_scenario_in_sim_mode(tmp_path: Path) -> None:
    """The `fidelity` scenario (issue 23) end to end over the simulator: reference under eager,
    CUDA-graph start and a repeat pass, the broken start (garbage-output here) fails."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), GPU_E2E_PYTHON=sys.executable,
               GPU_E2E_WORKDIR=str(tmp_path / "work"))
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-e2e"), "--engine", "sim", "--budget-s", "200",
                           "--only", "fidelity"], check=False, env=env, capture_output=True, text=True,
                          timeout=300)
    report = json.loads((out / "report.json").read_text())
    sc = report["scenarios"]["s16_fidelity"]
    assert sc["status"] == "pass", ([c for c in sc["checks"] if not c["ok"]], proc.stdout[-2000:])
    runs = sc["numbers"]["runs"]
    assert runs["graphs"]["checks"][0]["prefix_agreement"] == [32, 32, 32]
    assert runs["damaged"]["mismatch"][0]["reason"] == "prefix"


@pytest.mark.parametrize("short", [False, True], ids=["whole", "rollback-only"])
def test_gpu_e2e_canary_scenario_in_sim_mode(tmp_path: Path, short: bool) -> None:
    """The `canary` scenario (issue 24) over the simulator: 0.5.16 serves, 0.5.17 promoted, then
    0.5.16 on trial under the (emulated) foreign load rolled back; `--canary-rollback-only` starts
    on 0.5.17 and runs the rollback alone, with the checks that do not need the promotion."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), GPU_E2E_PYTHON=sys.executable,
               GPU_E2E_WORKDIR=str(tmp_path / "work"))
    extra = ["--canary-rollback-only"] if short else []
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-e2e"), "--engine", "sim", "--budget-s", "240",
                           "--only", "canary", *extra], check=False, env=env, capture_output=True,
                          text=True, timeout=360)
    report = json.loads((out / "report.json").read_text())
    sc = report["scenarios"]["s14_canary"]
    assert sc["status"] == "pass", ([c for c in sc["checks"] if not c["ok"]], proc.stdout[-2000:])
    names = [c["name"] for c in sc["checks"]]
    assert any(n.startswith("step 4: ") and "rolled back" in n for n in names)
    assert any(n.startswith("step 3: ") for n in names) is not short
    assert sc["numbers"]["rollback_only"] is short
    assert sc["numbers"]["step4b_rollback"]["verdict"]["verdict"] == "rolled_back"
