"""The real SGLang argument parser (`ServerArgs.add_cli_args` + `parse_known_args`) against what the
supervisor renders and what ENGINE's version knowledge claims. Runs `sglang_argcheck.py`, the same
script `doctor` ships, in venvs with the real wheels (see conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor.commands.doctor import run_argcheck
from sglang_supervisor.core import profiles
from sglang_supervisor.engine import migrate
from sglang_supervisor.engine import sglang as engine
from sglang_supervisor.engine.argv import ALIASES
from sglang_supervisor.engine.detect import is_simulator
from sglang_supervisor.shell.files.configfile import load_config

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
        for rc in profiles.render_all(config, version, api_key=profiles.REDACTED,
                                          secret_config_path="/run/x/engine-secrets.yaml"):
            assert not rc.errors, (path.name, rc.profile, rc.errors)
            out[f"{path.name}:{rc.profile}"] = rc.argv[base:]
    assert out, "no SGLang profile found in etc/"
    return out


def test_every_rendered_profile_is_accepted_by_each_release(real_sglang: tuple[str, str]) -> None:
    """Every etc/ profile, rendered for 0.5.13 (legacy flags), 0.5.17 and 0.5.23, parses with
    that release's own parser: no unknown flag, no abbreviation, no argparse error."""
    version, python = real_sglang
    answer = check(python, rendered_engine_args(version))
    assert answer["version"] == version
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
    for rule in migrate._FORWARD:
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
    for rule in migrate._FORWARD:
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


def test_every_backward_rename_is_confirmed_by_sglang_0513(real_sglang_0513: str) -> None:
    """New per-phase flag rejected by 0.5.13, the legacy flag ENGINE migrates it to accepted."""
    new_catalog = engine.flag_catalog("0.5.23")
    argvs: dict[str, list[str]] = {}
    for i, rule in enumerate(migrate._BACKWARD):
        value = [rule.old_value] if rule.old_value else _sample_value(rule.old, new_catalog)
        new = [rule.old, *value]
        migrated = engine.migrate_args(new, "0.5.13")
        assert migrated.migrations, rule
        argvs[f"new {i}"] = [*MODEL, *new]
        argvs[f"old {i}"] = [*MODEL, *migrated.args]
    answer = check(real_sglang_0513, argvs)["results"]
    for i, rule in enumerate(migrate._BACKWARD):
        rejected = answer[f"new {i}"]
        assert rule.old in rejected["unknown"] or rule.old in (rejected["error"] or ""), (rule, rejected)
        old = answer[f"old {i}"]
        assert old["error"] is None and old["unknown"] == [] and old["abbreviations"] == {}, (rule, old)


def test_forward_renames_are_accepted_by_sglang_0517(real_sglang_0517: str) -> None:
    """What ENGINE migrates legacy flags to on the H200's release is what 0.5.17 parses."""
    old_catalog = engine.flag_catalog("0.5.13")
    target = engine.flag_catalog("0.5.17")
    argvs: dict[str, list[str]] = {}
    for i, rule in enumerate(migrate._FORWARD):
        value = [rule.old_value] if rule.old_value else _sample_value(rule.old, old_catalog)
        old = [rule.old, *value]
        if len(old) == 1 and rule.new_value is None:
            old += _sample_value(rule.new, target)
        argvs[f"new {i}"] = [*MODEL, *engine.migrate_args(old, "0.5.17").args]
    for name, result in check(real_sglang_0517, argvs)["results"].items():
        assert result["error"] is None and result["unknown"] == [], (name, argvs[name], result)


@pytest.mark.parametrize("version", ["0.5.13", "0.5.17"])
def test_flag_catalogue_equals_the_real_parser(version: str, request: pytest.FixtureRequest) -> None:
    python = request.getfixturevalue("real_sglang_" + version.replace(".", ""))
    real = set(check(python, {}, list_options=True)["options"])
    ours = set(engine.flag_catalog(version).options) - ARGPARSE_OWN
    assert ours - real == set(), f"in our catalogue, not in sglang {version}"
    assert real - ours == set(), f"in sglang {version}, missing from our catalogue"


def test_every_alias_the_real_parser_declares_reads_as_one_option(real_sglang: tuple[str, str]) -> None:
    """engine/argv.ALIASES against each release: an alias it does not know would be read as a
    different option (`--decode-context-parallel-size 2` as no DCP at all, and the READY gate would
    wait for a prefill capture SGLang never runs)."""
    version, python = real_sglang
    groups = check(python, {}, list_options=True)["option_groups"]
    def negation(name: str, group: list[str]) -> bool:  # BooleanOptionalAction's --no-x: not an alias
        return name.startswith("--no-") and "--" + name[5:] in group

    aliases = [[n for n in g if n.startswith("--") and not negation(n, g)] for g in groups]
    aliases = [g for g in aliases if len(g) > 1]
    assert aliases, f"sglang {version} declares no alias at all: is option_groups still read?"
    for group in aliases:
        assert len({ALIASES.get(n, n) for n in group}) == 1, (version, group)
    # Two options of their own in this release must not be read as one (an alias that was an option
    # before, `--grpc-http-sidecar-port` in 0.5.13, is that option under its later name: fine).
    options = engine.flag_catalog(version).options
    declared = {n for g in aliases for n in g}
    assert [a for a, b in ALIASES.items() if a in options and b in options and a not in declared] == [], (
        f"ALIASES reads two options of sglang {version} as one")
