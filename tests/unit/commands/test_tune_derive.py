"""tune's choice of the derived profile to measure after a failed written rung (issue 25 C):
the same decision `run` makes (restart.derive per class, the bound, remediation `stop`, groups)."""

from __future__ import annotations

from pathlib import Path

import yaml

from sglang_supervisor.commands.tune_derive import TrialFacts, next_derivation, oom_in
from sglang_supervisor.core.config import Config
from sglang_supervisor.shell.files.configfile import load_config

OOM = "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 32.00 MiB."
SBO = ("ValueError: SBO (single batch overlap) is not supported on SM90 GPUs with latest "
       "sgl-deep-gemm wheel. Please try removing --enable-single-batch-overlap argument.")


def config(tmp_path: Path, **restart: object) -> Config:
    data = {
        "engine": {"command": ["{python}", "-m", "sglang_supervisor.simulator"], "version": "0.5.23",
                   "model_path": "Qwen/Qwen3-1B", "log_file": str(tmp_path / "e.log"),
                   "args": {"tp-size": 1}},
        "profiles": [{"name": "tuned", "args": {"enable-single-batch-overlap": True}}, {"name": "eager"}],
        "state_dir": str(tmp_path / "state"),
        "restart": restart,
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_a_capture_oom_derives_from_sglangs_resolved_value_then_stops_at_the_bound(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    facts = TrialFacts(resolved={"decode": 256, "prefill": 8192})
    d = next_derivation(cfg, "tuned", "capture_oom", OOM, facts=facts, parent=None)
    assert d is not None and d.name == "tuned-graph-bs-128" and d.base == "tuned"
    again = next_derivation(cfg, d.name, "capture_oom", OOM, facts=facts, parent=d)
    assert again is not None and again.name == "tuned-graph-bs-64" and again.steps == 2
    assert next_derivation(cfg, again.name, "capture_oom", OOM, facts=facts, parent=again) is None


def test_the_refused_flag_is_read_from_the_failure_line(tmp_path: Path) -> None:
    d = next_derivation(config(tmp_path), "tuned", "flag_refused", SBO, facts=TrialFacts(), parent=None)
    assert d is not None and d.name == "tuned-no-sbo" and d.remove == ("enable-single-batch-overlap",)


def test_what_run_would_not_derive_tune_does_not_either(tmp_path: Path) -> None:
    facts = TrialFacts(resolved={"decode": 256})
    off = config(tmp_path, derive=[])
    assert next_derivation(off, "tuned", "capture_oom", OOM, facts=facts, parent=None) is None
    assert next_derivation(config(tmp_path), "tuned", "probe_failed", None, facts=facts, parent=None) is None
    assert next_derivation(config(tmp_path), "tuned", "capture_failed", OOM, facts=facts, parent=None) is None
    # A prefill graph failure derives only when a failure line said out of memory.
    no_oom = TrialFacts(resolved={"prefill": 8192}, oom=False)
    assert next_derivation(config(tmp_path), "tuned", "prefill_graph_failed", "x", facts=no_oom,
                           parent=None) is None
    assert oom_in(["Fail when using backend: breakable", "torch.OutOfMemoryError: CUDA out of memory."])
    assert not oom_in(["Fail when using backend: breakable"])
