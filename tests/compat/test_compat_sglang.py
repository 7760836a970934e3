"""The real SGLang argument parser (`ServerArgs.add_cli_args` + `parse_known_args`) against what the
supervisor renders and what ENGINE's version knowledge claims. Runs `sglang_argcheck.py`, the same
script `doctor` ships, in venvs with the real wheels (see conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor import profiles
from sglang_supervisor.commands.doctor import run_argcheck
from sglang_supervisor.config import load_config
from sglang_supervisor.engine import sglang as engine
from sglang_supervisor.engineinfo import is_simulator

pytestmark = pytest.mark.compat

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "etc" / "sglang-supervisor").glob("*.yaml"))
MODEL = ["--model-path", "/models/m"]
ARGPARSE_OWN = {"-h", "--help"}


def check(python: str, argvs: dict[str, list[str]], *, list_options: bool = False) -> dict:  # type: ignore[type-arg]
    answer, why = run_argcheck(python, argvs, list_options=list_options, timeout_s=300)
    assert answer is not None, why
    return answer


def rendered_engine_args(version: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in CONFIGS:
        config = load_config(path, on_warning=lambda p: None)
        if is_simulator(config):
            continue  # the demo config starts the simulator, whose extra flags SGLang does not have
        base = len(profiles.base_command(config, "python"))
        for rc in profiles.render_all(config, version, api_key=profiles.REDACTED):
            assert not rc.errors, (path.name, rc.profile, rc.errors)
            out[f"{path.name}:{rc.profile}"] = rc.argv[base:]
    assert out, "no SGLang profile found in etc/"
    return out


def test_every_rendered_profile_is_accepted_by_sglang_0523(real_sglang_0523: str) -> None:
    answer = check(real_sglang_0523, rendered_engine_args("0.5.23"))
    assert answer["version"] == "0.5.23"
    for name, result in answer["results"].items():
        assert result["error"] is None, (name, result["error"])
        assert result["unknown"] == [], (name, result["unknown"])
        assert result["abbreviations"] == {}, (name, result["abbreviations"])


def test_an_unknown_rendered_flag_fails(real_sglang_0523: str) -> None:
    """The negative control: the check above would catch a flag SGLang does not have."""
    args = rendered_engine_args("0.5.23")
    name, argv = next(iter(args.items()))
    answer = check(real_sglang_0523, {name: [*argv, "--enforce-piecewise-cuda-graph", "--not-a-flag", "1"]})
    assert answer["results"][name]["unknown"] == ["--enforce-piecewise-cuda-graph", "--not-a-flag", "1"]


def _sample_value(flag: str, catalog: engine.FlagCatalog) -> list[str]:
    spec = catalog.options.get(flag)
    if spec is None or not spec.takes_value:
        return []
    return [spec.choices[0]] if spec.choices else ["8"]


def test_every_rename_is_confirmed_by_sglang_0523(real_sglang_0523: str) -> None:
    """Old flag rejected, the flag ENGINE migrates it to accepted, by the real 0.5.23 parser."""
    old_catalog = engine.flag_catalog("0.5.13")
    target = engine.flag_catalog("0.5.23")
    argvs: dict[str, list[str]] = {}
    for rule in engine._FORWARD:
        old = (
            [rule.old, rule.old_value]
            if rule.old_value
            else [rule.old, *_sample_value(rule.old, old_catalog)]
        )
        if len(old) == 1 and rule.new_value is None:
            old += _sample_value(rule.new, target)  # an old switch/valued flag the catalogue lacks
        migrated = engine.migrate_args(old, "0.5.23")
        assert migrated.migrations, rule
        argvs[f"old {rule.old}"] = [*MODEL, *old]
        argvs[f"new {rule.old}"] = [*MODEL, *migrated.args]
    answer = check(real_sglang_0523, argvs)["results"]
    for rule in engine._FORWARD:
        rejected = answer[f"old {rule.old}"]
        # Unknown, or an ambiguous prefix of the new per-phase names (argparse rc 2 either way).
        assert rule.old in rejected["unknown"] or rule.old in (rejected["error"] or ""), (rule, rejected)
        new = answer[f"new {rule.old}"]
        assert new["error"] is None and new["unknown"] == [], (rule, new)


def test_flag_catalogue_0523_equals_the_real_parser(real_sglang_0523: str) -> None:
    real = set(check(real_sglang_0523, {}, list_options=True)["options"])
    ours = set(engine.flag_catalog("0.5.23").options) - ARGPARSE_OWN
    assert ours - real == set(), "in our catalogue, not in sglang 0.5.23"
    assert real - ours == set(), "in sglang 0.5.23, missing from our catalogue"
