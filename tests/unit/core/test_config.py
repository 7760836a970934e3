"""Configuration loading: every problem names its key path, what is wrong and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_supervisor.core.config import Config, ConfigError, ConfigProblem, effective_overlay, parse_config
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.shell.files.configfile import default_demo_config_path, load_config, parse_checked

REPO = Path(__file__).resolve().parents[3]
QWEN = REPO / "etc" / "sglang-supervisor" / "qwen.yaml"
DEMO_LINK = REPO / "etc" / "sglang-supervisor" / "demo.yaml"

MINIMAL = """\
engine:
  command: [python3, -m, sglang.launch_server]
  model_path: org/m
  args:
    tp-size: 2
    mem-fraction-static: 0.88
  env:
    A: "1"
profiles:
  - name: first
  - name: second
    remove: [mem-fraction-static]
"""


def problems_of(text: str) -> list[ConfigProblem]:
    """Every problem, the files the text names included (what `load_config` reports)."""
    with pytest.raises(ConfigError) as info:
        parse_checked(text, "test.yaml")
    return info.value.problems


def only_problem(text: str) -> ConfigProblem:
    problems = problems_of(text)
    assert len(problems) == 1, problems
    return problems[0]


def with_minimal(**patch: object) -> str:
    data = yaml.safe_load(MINIMAL)
    for key, value in patch.items():
        node = data
        parts = key.split("__")
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[parts[-1]] = value
    return yaml.safe_dump(data, sort_keys=False)


def test_minimal_config_loads_with_defaults() -> None:
    config = parse_config(MINIMAL, "test.yaml")
    assert config.profile_names == ["first", "second"]
    assert config.engine.version == "auto"
    assert config.remediation == {"default": "next"}
    assert config.timeouts.stall_s == 600.0


def test_shipped_configs_load() -> None:
    qwen = load_config(QWEN)
    assert qwen.engine.model_path == "Qwen/Qwen3.6-27B"
    assert qwen.engine.port == 30000
    assert qwen.engine.host == "127.0.0.1"
    assert qwen.engine.args["tp-size"] == 2
    assert qwen.profile_names == ["tuned", "no-prefill-graph", "low-mem", "no-spec", "eager"]
    assert qwen.remediation == {
        "prefill_graph_failed": "no-prefill-graph", "capture_oom": "low-mem",
        "draft_capture_failed": "no-spec", "unknown_flag": "stop", "hang": "next", "default": "next",
    }
    demo = load_config(default_demo_config_path())
    assert demo.engine.command == ["{python}", "-m", "sglang_supervisor.simulator"]
    assert demo.engine.version == "0.5.23"
    assert demo.profile_names == qwen.profile_names
    assert demo.remediation == qwen.remediation


def test_demo_yaml_in_etc_is_a_relative_link_to_the_packaged_file() -> None:
    assert DEMO_LINK.is_symlink()
    target = os.readlink(DEMO_LINK)
    assert not os.path.isabs(target)
    assert DEMO_LINK.resolve() == default_demo_config_path().resolve()


def test_unknown_key_suggests_the_close_name() -> None:
    p = only_problem(MINIMAL.replace("  model_path:", "  verison: auto\n  model_path:"))
    assert p.path == "engine.verison"
    assert "unknown key" in p.problem
    assert "'version'" in p.fix


def test_unknown_key_at_the_wrong_level_says_where_it_belongs() -> None:
    p = only_problem(MINIMAL + "stall_s: 10\n")
    assert p.path == "stall_s"
    assert "timeouts" in p.fix


def test_unknown_key_in_a_profile_names_the_index() -> None:
    p = only_problem(MINIMAL.replace("  - name: second\n", "  - name: second\n    arg: {x: 1}\n"))
    assert p.path == "profiles[1].arg"
    assert "'args'" in p.fix


def test_bad_flag_names_are_each_reported_with_their_key_path() -> None:
    text = MINIMAL.replace("    tp-size: 2\n", "    tp_size: 2\n    --port: 3\n    port: 4\n")
    text = text.replace("  - name: second\n", "  - name: second\n    args:\n      tp_size: 2\n")
    problems = {p.path: p for p in problems_of(text)}
    assert set(problems) == {"engine.args.tp_size", "engine.args.--port", "engine.args.port",
                             "profiles[1].args.tp_size"}
    assert "'tp-size'" in problems["engine.args.tp_size"].fix
    assert "'port'" in problems["engine.args.--port"].fix
    assert "engine.port" in problems["engine.args.port"].fix
    assert "profiles[1].args.tp_size" in str(ConfigError(list(problems.values()), "x"))


def test_api_key_flag_is_refused_with_the_file_fix() -> None:
    p = only_problem(MINIMAL.replace("    tp-size: 2\n", "    tp-size: 2\n    api-key: hunter2\n"))
    assert p.path == "engine.args.api-key"
    assert "api_key_file" in p.fix


def test_flag_value_that_cannot_be_argv() -> None:
    p = only_problem(MINIMAL.replace("    tp-size: 2\n", "    tp-size: {a: 1}\n"))
    assert p.path == "engine.args.tp-size"
    assert "true (bare flag)" in p.fix


def test_env_numbers_become_strings_and_booleans_are_refused() -> None:
    config = parse_config(MINIMAL.replace('A: "1"', "A: 1"), "t")
    assert config.engine.env == {"A": "1"}
    p = only_problem(MINIMAL.replace('A: "1"', "A: true"))
    assert p.path == "engine.env.A"
    assert "quote" in p.fix


def test_type_errors_name_the_path_and_the_expected_type() -> None:
    p = only_problem(MINIMAL + "timeouts:\n  stall_s: soon\n")
    assert p.path == "timeouts.stall_s"
    assert "number" in p.fix
    p = only_problem(MINIMAL + "timeouts:\n  drain_s: -1\n")
    assert p.path == "timeouts.drain_s"
    assert "greater than or equal to 0" in p.problem


def test_missing_required_key() -> None:
    p = only_problem(MINIMAL.replace("  model_path: org/m\n", ""))
    assert p.path == "engine.model_path"
    assert "missing" in p.problem
    assert "model_path" in p.fix


def test_yaml_syntax_error_reports_file_line_and_column() -> None:
    p = only_problem("engine:\n  command: [a, b\n  model_path: x\n")
    assert p.path == ""
    assert "test.yaml:3:" in p.problem
    assert p.fix


def test_duplicate_keys_are_reported() -> None:
    text = MINIMAL.replace("    tp-size: 2\n", "    tp-size: 2\n    tp-size: 4\n")
    p = only_problem(text)
    assert "twice" in p.problem
    assert "line 6" in p.problem


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- a\n- b\n", "just a string\n"])
def test_empty_or_non_mapping_files(text: str) -> None:
    p = only_problem(text)
    assert p.path == ""
    assert p.fix


def test_remediation_keys_must_be_failure_classes() -> None:
    p = only_problem(MINIMAL + "remediation:\n  capture_om: next\n")
    assert p.path == "remediation.capture_om"
    assert "'capture_oom'" in p.fix


def test_remediation_values_must_be_profiles_next_or_stop() -> None:
    p = only_problem(MINIMAL + "remediation:\n  capture_oom: secnd\n")
    assert p.path == "remediation.capture_oom"
    assert "'second'" in p.fix
    p = only_problem(MINIMAL + "remediation:\n  capture_oom: sideways\n")
    assert "next" in p.fix and "stop" in p.fix and "first" in p.fix


def test_every_failure_class_and_default_are_accepted_remediation_keys() -> None:
    rules = "".join(f"  {fc.value}: next\n" for fc in FailureClass) + "  default: stop\n"
    config = parse_config(MINIMAL + "remediation:\n" + rules, "t")
    assert len(config.remediation) == len(FailureClass) + 1


def test_remove_must_name_an_existing_flag() -> None:
    p = only_problem(MINIMAL.replace("remove: [mem-fraction-static]", "remove: [mem-fraction-statc]"))
    assert p.path == "profiles[1].remove[0]"
    assert "'mem-fraction-static'" in p.fix


def test_env_remove_must_name_an_existing_variable() -> None:
    p = only_problem(MINIMAL.replace("remove: [mem-fraction-static]", "env_remove: [B]"))
    assert p.path == "profiles[1].env_remove[0]"
    assert "A" in p.fix


def test_removed_and_set_in_the_same_profile() -> None:
    text = MINIMAL.replace("remove: [mem-fraction-static]",
                           "remove: [mem-fraction-static]\n    args: {mem-fraction-static: 0.7}")
    p = only_problem(text)
    assert p.path == "profiles[1].remove[0]"
    assert "keep one" in p.fix


def test_duplicate_profile_names() -> None:
    p = only_problem(MINIMAL.replace("name: second", "name: first"))
    assert p.path == "profiles[1].name"
    assert "unique" in p.fix


def test_bad_profile_name() -> None:
    p = only_problem(MINIMAL.replace("name: second", "name: Second Try"))
    assert p.path == "profiles[1].name"
    assert "a-z" in p.fix


@pytest.mark.parametrize("action", ["next", "stop"])
def test_profile_names_that_are_remediation_actions_are_refused(action: str) -> None:
    # `remediation.capture_oom: stop` would silently mean the action, never this profile.
    p = only_problem(MINIMAL.replace("name: second", f"name: {action}"))
    assert p.path == "profiles[1].name"
    assert "remediation action" in p.problem and f"'{action}-profile'" in p.fix


def test_every_remediation_action_is_reserved() -> None:
    from sglang_supervisor.core.failover import RemediationAction

    for action in RemediationAction:
        assert problems_of(MINIMAL.replace("name: first", f"name: {action.value}"))
    parse_config(MINIMAL.replace("name: second", "name: stop-profile"), "t")  # only the bare word


def test_check_exits_78_for_a_profile_named_stop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_supervisor.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(MINIMAL.replace("name: second", "name: stop") + "remediation:\n  capture_oom: stop\n")
    assert main(["check", "-c", str(cfg), "--sglang-version", "0.5.23"]) == 78
    err = capsys.readouterr().err
    assert "profiles[1].name" in err and "remediation action" in err and "Traceback" not in err


def test_extends_chain_overlays_in_order() -> None:
    text = MINIMAL + """\
  - name: third
    extends: second
    args: {cuda-graph-max-bs-decode: 8}
    env: {B: "2"}
  - name: fourth
    extends: third
    remove: [cuda-graph-max-bs-decode]
    env_remove: [A]
"""
    config = parse_config(text, "t")
    args, env = effective_overlay(config, "fourth")
    assert args == {"tp-size": 2}
    assert env == {"B": "2"}
    args, env = effective_overlay(config, "third")
    assert list(args) == ["tp-size", "cuda-graph-max-bs-decode"]


def test_extends_unknown_self_and_cycles() -> None:
    p = only_problem(MINIMAL.replace("  - name: second\n", "  - name: second\n    extends: frist\n"))
    assert p.path == "profiles[1].extends"
    assert "'first'" in p.fix
    p = only_problem(MINIMAL.replace("  - name: second\n", "  - name: second\n    extends: second\n"))
    assert p.path == "profiles[1].extends"
    cyc = MINIMAL.replace("  - name: first\n", "  - name: first\n    extends: second\n").replace(
        "  - name: second\n", "  - name: second\n    extends: first\n")
    problems = problems_of(cyc)
    assert {p.path for p in problems} == {"profiles[0].extends", "profiles[1].extends"}
    assert all("cycle" in p.problem for p in problems)


def test_version_must_be_auto_or_a_release() -> None:
    p = only_problem(MINIMAL.replace("  model_path:", "  version: latest\n  model_path:"))
    assert p.path == "engine.version"
    assert "0.5.23" in p.fix


def test_metrics_address_shape() -> None:
    p = only_problem(MINIMAL + "metrics:\n  address: '9400'\n")
    assert p.path == "metrics.address"
    assert "127.0.0.1:9400" in p.fix


def test_both_key_sources_is_an_error(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("k\n")
    key.chmod(0o600)
    text = MINIMAL.replace("  model_path:", f"  api_key_file: {key}\n  api_key_credential: k\n  model_path:")
    p = only_problem(text)
    assert p.path == "engine"
    assert "keep one" in p.fix


def test_world_readable_key_file_is_an_error_with_the_chmod_fix(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("secret\n")
    key.chmod(0o644)
    p = only_problem(MINIMAL.replace("  model_path:", f"  api_key_file: {key}\n  model_path:"))
    assert p.path == "engine.api_key_file"
    assert "every user" in p.problem
    assert f"chmod 600 {key}" in p.fix
    key.chmod(0o640)
    assert parse_config(MINIMAL.replace("  model_path:", f"  api_key_file: {key}\n  model_path:"), "t")


def test_missing_or_relative_key_file(tmp_path: Path) -> None:
    p = only_problem(MINIMAL.replace("  model_path:", f"  api_key_file: {tmp_path}/nope\n  model_path:"))
    assert p.path == "engine.api_key_file"
    assert "No such file" in p.problem
    p = only_problem(MINIMAL.replace("  model_path:", "  api_key_file: key.txt\n  model_path:"))
    assert "absolute" in p.fix


def test_parse_config_is_pure_the_files_are_the_shells(tmp_path: Path) -> None:
    """core.config.parse_config reads no file: a world-readable key file and a missing local
    model pass it; shell.files.configfile adds what the filesystem says, in the same report."""
    key = tmp_path / "key"
    key.write_text("secret\n")
    key.chmod(0o644)
    text = MINIMAL.replace("  model_path: org/m", f"  api_key_file: {key}\n  model_path: {tmp_path}/nope")
    assert parse_config(text, "t").engine.api_key_file == str(key)
    assert {p.path for p in problems_of(text)} == {"engine.api_key_file", "engine.model_path"}
    # what the text alone says is still core's: a relative key path
    with pytest.raises(ConfigError) as info:
        parse_config(MINIMAL.replace("  model_path:", "  api_key_file: key.txt\n  model_path:"), "t")
    assert "absolute" in info.value.problems[0].fix


def test_credential_name_is_not_a_path() -> None:
    p = only_problem(MINIMAL.replace("  model_path:", "  api_key_credential: /etc/key\n  model_path:"))
    assert p.path == "engine.api_key_credential"
    assert "LoadCredential" in p.fix


def test_a_world_writable_config_is_refused_with_the_chmod_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL)
    path.chmod(0o666)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (p,) = info.value.problems
    assert str(path) in p.problem and "0666" in p.problem and p.fix == f"chmod o-w {path}"
    assert path.read_text() == MINIMAL and path.stat().st_mode & 0o777 == 0o666  # untouched
    path.chmod(0o644)
    assert isinstance(load_config(path), Config)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")
    assert "--config" in info.value.problems[0].fix
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert "UTF-8" in info.value.problems[0].fix


def test_report_lists_path_problem_and_fix_per_problem() -> None:
    text = MINIMAL.replace("  model_path:", "  verison: auto\n  model_path:") + "remediation:\n  hang: nxt\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "my.yaml")
    report = str(info.value)
    assert report.startswith("my.yaml: 1 configuration problem")
    assert "engine.verison" in report and "fix: did you mean 'version'?" in report
    assert "Traceback" not in report


# ---- property: arbitrary input never raises anything but ConfigError --------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                     st.text(max_size=12))
_keys = st.one_of(
    st.sampled_from(["engine", "profiles", "command", "model_path", "args", "env", "name", "remove",
                     "extends", "remediation", "timeouts", "stall_s", "metrics", "address", "version",
                     "api_key_file", "tp-size", "default", "capture_oom", "env_remove", "probe"]),
    st.text(max_size=8),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=5)), max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_any_yaml_document_gives_a_config_or_a_config_error(doc: object) -> None:
    text = yaml.safe_dump(doc)
    try:
        parse_config(text, "prop.yaml")
    except ConfigError as exc:
        assert exc.problems
        assert all(p.fix for p in exc.problems)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_gives_a_config_or_a_config_error(text: str) -> None:
    try:
        parse_config(text, "prop.yaml")
    except ConfigError as exc:
        assert exc.problems


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["engine:", "  command: [a]", "  model_path: m", "profiles:",
                                 "  - name: a", "    args: {x: 1}", "  - name: b", "    extends: a",
                                 "remediation:", "  hang: b", "  - &x [*x]", "  args: !!binary aGk=",
                                 "  {a: 1}: 2", "- 1", "x: &y {z: *y}", "\t", "'"]), max_size=12))
def test_any_mix_of_config_lines_gives_a_config_or_a_config_error(lines: list[str]) -> None:
    try:
        parse_config("\n".join(lines), "prop.yaml")
    except ConfigError as exc:
        assert exc.problems
