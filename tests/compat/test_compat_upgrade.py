"""The upgrade canary's check before any GPU time (issue 24) against real SGLang releases: each
real venv taken as the candidate of another release, its version asked from its own interpreter,
every etc/ profile migrated for it and accepted by its own argument parser (a refusal there would
block the upgrade), the tuned profile expressible both ways (0.5.13 <-> 0.5.23, 0.5.17 -> 0.5.23).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.core.upgradeplan import plan_upgrade
from sglang_supervisor.engine.detect import is_simulator
from sglang_supervisor.shell import reloadcheck
from sglang_supervisor.shell.files.configfile import load_config
from sglang_supervisor.shell.upgradecheck import check_candidate

pytestmark = pytest.mark.compat

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "etc" / "sglang-supervisor" / "qwen.yaml"


@pytest.mark.parametrize(("current", "fixture", "candidate", "renames"), [
    ("0.5.13", "real_sglang_0523", "0.5.23", True),  # across 0.5.14's per-phase graph flags
    ("0.5.17", "real_sglang_0523", "0.5.23", False),
    ("0.5.23", "real_sglang_0513", "0.5.13", True),
    ("0.5.23", "real_sglang_0517", "0.5.17", False),
])
def test_every_profile_migrates_onto_a_real_candidate(current: str, fixture: str, candidate: str,
                                                      renames: bool,
                                                      request: pytest.FixtureRequest,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    python = request.getfixturevalue(fixture)
    asked: list[object] = []
    real = reloadcheck.real_parser_problems

    def spy(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        asked.append(out)
        return out

    monkeypatch.setattr(reloadcheck, "real_parser_problems", spy)
    config = load_config(QWEN, on_warning=lambda p: None)
    assert not is_simulator(config)
    plan = check_candidate(config, current, python)
    assert plan.candidate == candidate  # asked from the candidate's own interpreter
    assert not plan.blocked, plan.to_json()
    assert all(p.expressible for p in plan.profiles), plan.to_json()
    # across 0.5.14 the graph flags are renamed: the plan says so for the tuned profile
    assert bool(plan.tuned.renamed) is renames, plan.to_json()
    # the candidate's parser was asked and refused nothing the catalogue let through
    assert asked == [([], None)]
    assert plan == plan_upgrade(config, current, candidate)
