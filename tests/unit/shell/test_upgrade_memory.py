"""The upgrade canary's memory (shell/upgrades.py, issue 24): an untrusted file read bounded and
typed (what cannot be used is dropped, a broken file moved aside), and which candidate a reload
puts on trial: a rolled-back one only once its venv changed or the operator asks to retry, a
promoted one without a new trial."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_supervisor.core.config import Config, parse_config
from sglang_supervisor.shell import upgrades
from sglang_supervisor.shell.files import state
from sglang_supervisor.shell.files.configfile import default_demo_config_path


def config(tmp_path: Path, candidate: str | None = None) -> Config:
    c = parse_config(default_demo_config_path().read_text())
    engine = c.engine.model_copy(update={"candidate": c.engine.candidate.model_copy(
        update={"python": candidate})})
    return c.model_copy(update={"state_dir": str(tmp_path / "state"), "engine": engine})


def venv(root: Path) -> str:
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (root / "bin").mkdir()
    python = root / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    return str(python)


class Metrics:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def set_upgrade(self, *args: Any) -> None:
        self.calls.append(args)


def parts(c: Config, version: str = "0.5.23") -> tuple[Any, Any, Any]:
    """Upgrades' collaborators: the served configuration, the lifecycle, the metrics."""
    return (SimpleNamespace(config=c, prep=SimpleNamespace(version=version)),
            SimpleNamespace(profile="tuned"), Metrics())


def test_a_missing_file_is_an_empty_memory(tmp_path: Path) -> None:
    assert upgrades.load(tmp_path / "none.json") == upgrades.empty()


def test_a_broken_file_is_moved_aside_and_the_memory_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "m.releases.json"
    path.write_text("{not json")
    assert upgrades.load(path) == upgrades.empty()
    assert not path.exists() and list(tmp_path.glob("m.releases.json.corrupt-*"))


def test_what_cannot_be_used_is_dropped_and_the_history_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "m.releases.json"
    path.write_text(json.dumps({
        "schema": 1,
        "references": {"0.5.22": {"tuned": {"tok_s": "fast", "ttft_s": -1, "at": 1.0}}},
        "releases": [{"version": "0.5.23", "verdict": "promoted", "tps_ratio": 1.1,
                      "python": ["not", "text"]}] * 100,
        "promoted": "yes"}))
    book = upgrades.load(path)
    assert book["references"]["0.5.22"]["tuned"] == {"tok_s": None, "ttft_s": None, "at": 1.0,
                                                     "old_release": False}
    assert len(book["releases"]) == upgrades.MAX_RELEASES
    assert book["releases"][0]["python"] is None and book["releases"][0]["tps_ratio"] == 1.1
    assert book["promoted"] is None


def test_a_file_of_another_schema_is_not_believed(tmp_path: Path) -> None:
    path = tmp_path / "m.releases.json"
    path.write_text(json.dumps({"schema": 99, "promoted": {"python": "/x"}}))
    assert upgrades.load(path)["promoted"] is None


def test_the_venv_identity_changes_with_an_install_there(tmp_path: Path) -> None:
    python = venv(tmp_path / "v")
    before = upgrades.venv_identity(python)
    site = tmp_path / "v" / "lib" / "python3.11" / "site-packages"
    os.utime(site, ns=(1, 10**18))
    assert upgrades.venv_identity(python) != before


def test_a_rolled_back_candidate_waits_for_its_venv_to_change_or_a_retry(tmp_path: Path) -> None:
    python = venv(tmp_path / "cand")
    c = config(tmp_path, python)
    u = upgrades.Upgrades(*parts(c))
    assert u.candidate(c) == (python, True)  # never tried: a canary
    u._record(python, "0.5.24", "rolled_back", "slower", None)
    assert u.candidate(c) == (None, False)  # same venv: not again
    upgrades.write_request(c, python, retry=True)
    assert u.candidate(c) == (python, True)  # the operator asked
    state.request_path(c).unlink()
    os.utime(tmp_path / "cand" / "lib" / "python3.11" / "site-packages", ns=(1, 10**18))
    assert u.candidate(c) == (python, True)  # a new install there


def test_a_promoted_candidate_runs_without_a_new_trial_also_after_a_restart(tmp_path: Path) -> None:
    python = venv(tmp_path / "cand")
    c = config(tmp_path, python)
    u = upgrades.Upgrades(*parts(c))
    u.book["promoted"] = {"python": python, "version": "0.5.24"}
    upgrades.save(u.path, u.book)
    assert u.candidate(c) == (python, False)
    assert upgrades.startup_config(c).engine.interpreter == python
    # a configuration without the candidate starts the configured release
    assert upgrades.startup_config(config(tmp_path)).engine.interpreter is None


def test_an_in_place_upgrade_is_seen_at_start_and_the_old_numbers_are_kept_marked(
        tmp_path: Path) -> None:
    c = config(tmp_path)
    first = upgrades.Upgrades(*parts(c, "0.5.22"))
    first.on_ready("tuned", 100.0, 0.2)
    again = upgrades.Upgrades(*parts(c, "0.5.23"))
    assert again.in_place is not None and not again.in_place.rollback_possible
    assert again.in_place.reference is not None and again.in_place.reference.tok_s == 100.0
    book = upgrades.load(state.releases_path(c))
    assert book["references"]["0.5.22"]["tuned"]["old_release"] is True
    assert book["in_place"]["from"] == "0.5.22" and book["in_place"]["to"] == "0.5.23"
    again.on_ready("tuned", 50.0, 0.2)
    assert upgrades.load(state.releases_path(c))["releases"][-1]["verdict"] == "in_place_worse"


def test_an_in_place_verdict_carries_the_ready_gates_fidelity_word(tmp_path: Path) -> None:
    c = config(tmp_path)
    upgrades.Upgrades(*parts(c, "0.5.22")).on_ready("tuned", 100.0, 0.2)
    again = upgrades.Upgrades(*parts(c, "0.5.23"))
    again.on_ready("tuned", 100.0, 0.2, fidelity="pass")
    last = upgrades.load(state.releases_path(c))["releases"][-1]
    assert last["verdict"] == "in_place_ok" and last["fidelity"] == "pass"
