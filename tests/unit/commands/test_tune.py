"""tune: ranking, the table, and what it persists for `run` (pure parts; the simulator run is in
tests/integration/test_tune_sim.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import yaml

from sglang_supervisor.commands import tune
from sglang_supervisor.commands.tune import TuneResult, format_table, rank
from sglang_supervisor.core import failover, wayback
from sglang_supervisor.core.trial import TrialStart
from sglang_supervisor.shell.files import state
from sglang_supervisor.shell.files.configfile import load_config
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
    # What failed here is remembered like a failed start of `run`, with its class.
    fs = store.fingerprint_state(fp)
    assert {p: r.failure_class for p, r in fs.bad.items()} == {
        "tuned": "capture_oom", "probe-broke": "probe_failed"}
    # `run` plans its start from the store (Supervisor._settings): the winner first, no probation
    # for tuned (failed here) nor for no-spec (served, slower).
    plan = wayback.start_plan(config.profile_names, store.last_good(fp), ranking=store.ranking(fp),
                              bad=fs.bad, now=time.time(), policy=wayback.Policy())
    assert plan.last_good == "spec" and plan.probation is None
    settings = policy_settings(config, last_good=plan.last_good, known_bad=plan.backoff,
                               probation=plan.probation, retry_known_bad=False)
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


class _ExitedEngine:
    """An engine that already exited with 1; tune stops what is left of it."""

    returncode = 1

    def __init__(self) -> None:
        self.stopped = False

    async def stop(self, drain_s: float, kill_s: float) -> None:
        self.stopped = True


def test_a_start_is_classified_by_the_ranker_after_the_engines_last_lines(tmp_path: Path) -> None:
    """[cuda_error, kv_cache_oom] is a kv_cache_oom (core/failures), and the OOM line that comes
    through the pipe after the exit was seen still counts: tune waits for the end of the log and
    closes the open traceback block there (the daemon's pump does both)."""
    data = {
        "engine": {"command": ["x"], "version": "0.5.23", "model_path": "m",
                   "log_file": str(tmp_path / "e.log")},
        "profiles": [{"name": "a"}],
        "state_dir": str(tmp_path / "state"),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    watch = tune._Watch("0.5.23", [], TrialStart(frozenset(), began=0.0))
    engine = _ExitedEngine()

    async def main() -> tuple[str, str | None] | None:
        watch.feed(b"[2026-12-01 10:00:00] Load weight begin. avail mem=78.00 GB\n"
                   b"[2026-12-01 10:00:01 TP1] RuntimeError: CUDA error: an illegal memory access "
                   b"was encountered\n"
                   b"[2026-12-01 10:00:01 TP0] Memory pool end. avail mem=10.00 GB\n")

        async def last_lines() -> None:
            await asyncio.sleep(0.05)  # after tune saw the exit
            watch.feed(b"[2026-12-01 10:00:02 TP0] RuntimeError: Not enough memory. Please try to "
                       b"increase --mem-fraction-static. Current value: mem_fraction_static=0.9\n")
            watch.finish()  # EOF: the traceback block is classified now

        pump = asyncio.create_task(last_lines())
        return await tune._wait_ready(engine, watch, config, pump)  # type: ignore[arg-type]

    failure = asyncio.run(main())
    assert [f.failure.value for f in watch.trial.failures] == ["cuda_error", "kv_cache_oom"]
    assert failure is not None and failure[0] == "kv_cache_oom"
    assert "mem-fraction-static" in (failure[1] or "")
    assert engine.stopped
