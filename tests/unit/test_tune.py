"""tune: ranking, the table, and what it persists for `run` (pure parts; the simulator run is in
tests/integration/test_tune_sim.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from sglang_supervisor.commands import tune
from sglang_supervisor.commands.tune import TuneResult, format_table, rank
from sglang_supervisor.core import failover
from sglang_supervisor.shell import state
from sglang_supervisor.shell.configfile import load_config
from sglang_supervisor.shell.supervisor import policy_settings, prepare

RESULTS = [
    TuneResult("tuned", False, None, 3.0, failure="capture_oom", detail="CUDA out of memory"),
    TuneResult("no-spec", True, 40.0, 5.0, 0.020, 25.0, 0.04, 50 * 2**30),
    TuneResult("spec", True, 45.0, 7.0, 0.025, 55.0, 0.10, 52 * 2**30),
    TuneResult("eager", True, 20.0, None, 0.030, 15.0, 0.02, None),
    TuneResult("probe-broke", True, 30.0, 4.0, failure="probe_failed"),
]


def test_rank_fastest_working_first_failures_last_in_order() -> None:
    assert [r.profile for r in rank(RESULTS)] == ["spec", "no-spec", "eager", "tuned", "probe-broke"]


def test_ttft_breaks_ties() -> None:
    a = TuneResult("a", True, decode_tps_p50=50.0, ttft_p50_s=0.2)
    b = TuneResult("b", True, decode_tps_p50=50.0, ttft_p50_s=0.1)
    assert [r.profile for r in rank([a, b])] == ["b", "a"]


def test_table_columns() -> None:
    lines = format_table(rank(RESULTS)).splitlines()
    assert lines[0].split() == [
        "#",
        "profile",
        "started",
        "startup",
        "capture",
        "TTFT",
        "p50",
        "decode",
        "p50",
        "spread",
        "peak",
        "GPU",
        "failure",
    ]
    assert (
        lines[1].split()[:3] == ["1", "spec", "yes"] and "55.0 tok/s" in lines[1] and "52.0 GiB" in lines[1]
    )
    assert lines[4].startswith("-") and "capture_oom" in lines[4]


def test_persist_makes_the_winner_run_first(tmp_path: Path) -> None:
    data = {
        "engine": {
            "command": ["{python}", "-m", "sglang_supervisor.simulator"],
            "version": "0.5.23",
            "model_path": "Qwen/Qwen3-1B",
            "log_file": str(tmp_path / "e.log"),
        },
        "profiles": [{"name": n} for n in ("tuned", "no-spec", "spec", "eager", "probe-broke")],
        "state_dir": str(tmp_path / "state"),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    prepared = prepare(config, "0.5.23")
    assert tune.persist(prepared, rank(RESULTS)) == "spec"
    store = state.StateStore(config.state_dir, config.name)
    fp = tune.deployment_fingerprint(prepared)
    assert store.ranking(fp) == ["spec", "no-spec", "eager"]
    # `run` builds its policy from the store the same way: the winner is tried first.
    settings = policy_settings(config, last_good=store.last_good(fp), known_bad={}, retry_known_bad=False)
    assert failover.ladder_order(settings)[0] == "spec"


def test_nothing_persisted_when_nothing_served(tmp_path: Path) -> None:
    data = {
        "engine": {
            "command": ["x"],
            "version": "0.5.23",
            "model_path": "m",
            "log_file": str(tmp_path / "e.log"),
        },
        "profiles": [{"name": "a"}],
        "state_dir": str(tmp_path / "state"),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    prepared = prepare(load_config(path), "0.5.23")
    assert tune.persist(prepared, [TuneResult("a", False, failure="hang")]) is None
    assert not list((tmp_path / "state").glob("*.json"))
