"""Output fidelity over the simulator (issue 23): the reference taken once and reused, a start
whose outputs disagree never sends READY and the ladder moves on, late divergence passes, an
acceptance collapse on a speculative profile fails, `fidelity --reset` re-takes, a fidelity
sample the engine cannot answer in time is not a mismatch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervised import Daemon, base_config, fault_first_profile, start, stop_cleanly

pytestmark = pytest.mark.integration


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def references(workdir: Path) -> list[Path]:
    return sorted((workdir / "state" / "fidelity").glob("*.json"))


def ref_files(workdir: Path) -> list[Path]:
    return [p for p in references(workdir) if p.name != "last-mismatch.json"]


def with_reference_on(data: dict[str, Any], profile: str) -> dict[str, Any]:
    data["fidelity"] = {"reference_profile": profile, "interval_s": 0}
    return data


def take_reference(daemons: list[Daemon], workdir: Path) -> dict[str, Any]:
    """A first run whose top rung is the reference profile: READY takes the reference."""
    d = start(daemons, workdir, with_reference_on(base_config(workdir), "tuned"))
    d.notified("READY=1")
    taken = d.event("fidelity.reference_taken")
    stop_cleanly(d)
    daemons.remove(d)
    return taken


def test_reference_taken_once_then_reused(daemons, workdir) -> None:
    taken = take_reference(daemons, workdir)
    assert taken["profile"] == "tuned"
    [ref] = ref_files(workdir)
    doc = json.loads(ref.read_text())
    assert doc["sglang_version"] and doc["command_hash"] and doc["taken_at_utc"] and doc["profile"] == "tuned"
    before = ref.read_bytes()
    d = start(daemons, workdir, with_reference_on(base_config(workdir), "tuned"))
    d.notified("READY=1")
    check = d.event("fidelity.check")
    assert check["result"] == "pass" and check["min_prefix"] == 32
    assert not d.named("fidelity.reference_taken")
    stop_cleanly(d)
    assert ref_files(workdir) == [ref]  # one reference, reused: not re-taken
    assert json.loads(ref.read_bytes())["taken_at"] == json.loads(before)["taken_at"]


def test_garbage_output_never_ready_and_ladder_moves_on(daemons, workdir) -> None:
    take_reference(daemons, workdir)
    data = fault_first_profile(with_reference_on(base_config(workdir), "tuned"), "garbage-output")
    d = start(daemons, workdir, data)
    mismatch = d.event("fidelity.mismatch")
    assert mismatch["profile"] == "tuned" and mismatch["reason"] == "prefix" and mismatch["gate"] == "ready"
    assert mismatch["prompt"] and mismatch["expected"] and mismatch["received"]
    assert mismatch["expected"] != mismatch["received"]
    fb = d.event("profile.fallback")
    assert (fb["from_profile"], fb["failure_class"]) == ("tuned", "output_mismatch")
    d.notified("READY=1")
    ready = d.event("supervisor.ready")
    assert ready["profile"] == fb["to_profile"] != "tuned"
    # no READY=1 came before the mismatched attempt ended
    assert not [e for e in d.events[:d.events.index(mismatch)] if e.get("event") == "supervisor.ready"]
    stop_cleanly(d)
    state = json.loads((workdir / "state" / "demo.state.json").read_text())
    assert "output_mismatch" in json.dumps(state)  # the way-back back-off remembers the class
    last = json.loads((workdir / "state" / "fidelity" / "last-mismatch.json").read_text())
    assert last["profile"] == "tuned" and last["prompt"] == mismatch["prompt"]


def test_late_divergence_passes(daemons, workdir) -> None:
    take_reference(daemons, workdir)
    data = fault_first_profile(with_reference_on(base_config(workdir), "tuned"), "late-divergence")
    d = start(daemons, workdir, data)
    d.notified("READY=1")
    check = d.event("fidelity.check")
    assert check["result"] == "pass"
    assert 16 <= check["min_prefix"] < 32  # it did diverge, late
    assert d.event("supervisor.ready")["profile"] == "tuned"
    stop_cleanly(d)


def test_accept_collapse_on_speculative_profile_fails(daemons, workdir) -> None:
    take_reference(daemons, workdir)
    # a second run passes on tuned (speculative): its accept length is remembered for the weights
    d = start(daemons, workdir, with_reference_on(base_config(workdir), "tuned"))
    d.notified("READY=1")
    d.event("fidelity.check", result="pass")
    stop_cleanly(d)
    daemons.remove(d)
    [ref] = ref_files(workdir)
    assert json.loads(ref.read_text())["accept"]["tuned"] > 1.5
    data = fault_first_profile(with_reference_on(base_config(workdir), "tuned"), "accept-collapse")
    d = start(daemons, workdir, data)
    mismatch = d.event("fidelity.mismatch")
    assert mismatch["reason"] == "accept_collapse" and mismatch["profile"] == "tuned"
    assert d.event("profile.fallback")["failure_class"] == "output_mismatch"
    d.notified("READY=1")
    stop_cleanly(d)


def test_fidelity_timeout_is_not_a_mismatch(daemons, workdir) -> None:
    """The engine answers the tok/s probe but not the fidelity sample in time: a probe failure
    (the supervisor's trouble), never output_mismatch."""
    take_reference(daemons, workdir)
    data = with_reference_on(base_config(workdir), "tuned")
    data["fidelity"]["timeout_s"] = 0.001
    d = start(daemons, workdir, data)
    d.event("fidelity.unavailable")
    failed = d.event("engine.failed", profile="tuned")
    assert failed["failure_class"] != "output_mismatch"
    assert not d.named("fidelity.mismatch")
    stop_cleanly(d)


def test_fidelity_command_shows_and_reset_retakes(daemons, workdir) -> None:
    take_reference(daemons, workdir)
    cfg = workdir / "config.yaml"
    run = [sys.executable, "-m", "sglang_supervisor", "fidelity", "--config", str(cfg), "--json"]
    shown = subprocess.run(run, check=False, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["reference"]["profile"] == "tuned" and doc["reference"]["prompts"]
    old = doc["reference"]["taken_at"]
    reset = subprocess.run([*run, "--reset"], check=False, capture_output=True, text=True, timeout=120)
    assert reset.returncode == 0, reset.stderr
    new = json.loads(reset.stdout)
    assert new["reference"]["taken_at"] > old and new["retaken"] is True


def test_periodic_check_while_idle_catches_a_mismatch_and_moves_on(daemons, workdir) -> None:
    take_reference(daemons, workdir)
    # healthy for the ready gate's sample, broken from the next (a count, not a clock)
    data = fault_first_profile(with_reference_on(base_config(workdir), "tuned"), "garbage-output:1")
    data["fidelity"]["interval_s"] = 0.5
    d = start(daemons, workdir, data)
    d.notified("READY=1")
    assert d.event("fidelity.check", result="pass")["profile"] == "tuned"  # the ready gate's
    mismatch = d.event("fidelity.mismatch")
    assert mismatch["gate"] == "serving" and mismatch["profile"] == "tuned"
    fb = d.event("profile.fallback")
    assert (fb["from_profile"], fb["failure_class"]) == ("tuned", "output_mismatch")
    assert not d.named("profile.retry_same")  # deterministic: never the same command again
    d.notified("READY=1", count=2)
    stop_cleanly(d)


def test_tune_never_ranks_a_profile_that_fails_fidelity(daemons, workdir) -> None:
    take_reference(daemons, workdir)
    data = with_reference_on(base_config(workdir), "tuned")
    fault_first_profile(data, "garbage-output")
    cfg = workdir / "tune.yaml"
    cfg.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, "-m", "sglang_supervisor", "tune", "--config", str(cfg),
                           "--rounds", "1", "--profiles", "tuned,no-prefill-graph", "--json"],
                          check=False, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranking = json.loads(proc.stdout)["ranking"]
    tuned = next(r for r in ranking if r["profile"] == "tuned")
    assert tuned["failure"] == "output_mismatch" and tuned["decode_tps_p50"] is None
    assert "expected" in tuned["detail"]
    assert json.loads(proc.stdout)["winner"] == ranking[0]["profile"] != "tuned"
