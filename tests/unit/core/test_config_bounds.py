"""Everything `check` accepts, `run` can execute (issue 12 item 2): numbers are numbers, finite
and in range; names, paths and commands hold no control characters and are not empty; a local
model exists; hostile YAML (alias bombs, huge files, thousands of problems) has a bounded cost."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sglang_supervisor.core.config import (
    MAX_CONFIG_BYTES,
    MAX_PROBLEM_CHARS,
    MAX_PROBLEMS,
    ConfigError,
    ConfigProblem,
    parse_config,
)
from sglang_supervisor.shell.files.configfile import load_config, model_path_problems

BASE = {
    "engine": {"command": ["python3", "-m", "sglang.launch_server"], "model_path": "org/m"},
    "profiles": [{"name": "first"}],
}


def problems(**patch: object) -> list[ConfigProblem]:
    data = yaml.safe_load(yaml.safe_dump(BASE))
    for key, value in patch.items():
        node = data
        *parents, last = key.split("__")
        for part in parents:
            node = node.setdefault(part, {}) if not part.isdigit() else node[int(part)]
        node[last] = value
    with pytest.raises(ConfigError) as info:
        parse_config(yaml.safe_dump(data), "test.yaml")
    return info.value.problems


def one(**patch: object) -> ConfigProblem:
    found = problems(**patch)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(("key", "value", "path", "says"), [
    # the case that once reached `run`: an infinite timeout overflowed EXTEND_TIMEOUT_USEC
    ("timeouts__stall_s", float("inf"), "timeouts.stall_s", "not a finite number"),
    ("timeouts__drain_s", float("nan"), "timeouts.drain_s", "not a finite number"),
    ("probe__regression_delta", float("nan"), "probe.regression_delta", "not a finite number"),
    ("timeouts__start_s", 1e30, "timeouts.start_s", "less than or equal"),
    ("restart__known_bad_ttl_s", 1e12, "restart.known_bad_ttl_s", "less than or equal"),
    ("restart__transient_retry_s", -1, "restart.transient_retry_s", "greater than or equal"),
    ("probe__max_new_tokens", 10**12, "probe.max_new_tokens", "less than or equal"),
    # YAML booleans and strings are not numbers
    ("timeouts__health_failures", True, "timeouts.health_failures", "valid integer"),
    ("timeouts__stall_s", True, "timeouts.stall_s", "valid number"),
    ("engine__port", "30000", "engine.port", "valid integer"),
    ("probe__input_tokens", 2.5, "probe.input_tokens", "valid integer"),
    ("probe__enabled", "yes", "probe.enabled", "valid boolean"),
    # control characters and empty values
    ("name", "qwen\n", "name", "not allowed"),
    ("profiles__0__name", "first\n", "profiles[0].name", "not allowed"),
    ("engine__model_path", "", "engine.model_path", "is empty"),
    ("engine__model_path", "org/m\x00", "engine.model_path", "control characters"),
    ("engine__log_file", "   ", "engine.log_file", "is empty"),
    ("engine__log_file", "/var/log/x\x1b[2J.log", "engine.log_file", "control characters"),
    ("engine__host", "", "engine.host", "is empty"),
    ("engine__command", ["python3", ""], "engine.command", "is empty"),
    ("engine__command", ["python3\x1b-c"], "engine.command", "control characters"),
    ("engine__command", ["sh", "-c", "echo a\x00b"], "engine.command", "control characters"),
    ("engine__interpreter", "", "engine.interpreter", "is empty"),
    ("engine__api_key_file", "", "engine.api_key_file", "is empty"),
    ("state_dir", "", "state_dir", "is empty"),
    ("runtime_dir", "/run/x\n", "runtime_dir", "control characters"),
    ("engine__args", {"tp-size\n": 2}, "engine.args.tp-size\n", "not a command-line flag name"),
    ("engine__args", {"served-model-name": "a\x00b"}, "engine.args.served-model-name", "NUL"),
    ("engine__env", {"A": "x\x00"}, "engine.env.A", "NUL"),
    ("engine__env", {"A\n": "x"}, "engine.env.A\n", "not an environment variable name"),
])
def test_values_run_could_not_use_are_refused_by_check(key: str, value: object, path: str,
                                                      says: str) -> None:
    p = one(**{key: value})
    assert p.path.startswith(path), p
    assert says in p.problem, p
    assert p.fix


def test_a_command_word_may_be_a_multi_line_shell_script() -> None:
    # `sh -c` with a script: newlines and tabs are what the script is made of.
    parse_config(yaml.safe_dump({**BASE, "engine": {**BASE["engine"],
                                 "command": ["sh", "-c", "echo start\n\texec sglang-sim \"$@\"", "sh"]}}))


def test_every_default_and_the_documented_ranges_still_load() -> None:
    parse_config(yaml.safe_dump({**BASE, "timeouts": {"stall_s": 7 * 86400, "drain_s": 0},
                                 "restart": {"known_bad_ttl_s": 0, "transient_retry_s": 0}}))


# ------------------------------------------------------------------------------ the model path

@pytest.mark.parametrize("model", ["Qwen/Qwen3-8B", "gpt2", "meta-llama/Llama-3.1-8B-Instruct",
                                   "org/name.v2_final"])
def test_a_hugging_face_id_is_allowed(model: str) -> None:
    assert model_path_problems(model) == []


def test_an_existing_local_model_is_allowed(tmp_path: Path) -> None:
    assert model_path_problems(str(tmp_path)) == []


@pytest.mark.parametrize(("model", "says"), [
    ("/nonexistent/models/Qwen3", "does not exist"),
    ("./models/Qwen3", "does not exist"),
    ("~/models/Qwen3-none", "does not exist"),
    ("models/qwen/Qwen3", "neither a local path nor a Hugging Face id"),
    ("org/../etc", "neither a local path nor a Hugging Face id"),
])
def test_a_missing_local_model_is_a_configuration_error(model: str, says: str) -> None:
    [p] = model_path_problems(model)
    assert p.path == "engine.model_path" and says in p.problem and "Hugging Face id" in p.fix


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_an_unreachable_model_says_permission_denied(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    (hidden / "model").mkdir(parents=True)
    hidden.chmod(0)
    try:
        [p] = model_path_problems(str(hidden / "model"))
    finally:
        hidden.chmod(0o755)
    assert "permission denied" in p.problem


def test_check_and_run_refuse_a_missing_model_with_78(tmp_path: Path) -> None:
    from sglang_supervisor.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "engine": {**BASE["engine"], "version": "0.5.23",
                                                       "model_path": str(tmp_path / "none")},
                                   "state_dir": str(tmp_path / "state")}))
    assert main(["check", "--config", str(cfg)]) == 78
    assert main(["run", "--config", str(cfg), "--log-format", "json"]) == 78
    assert not (tmp_path / "state").exists() or not list((tmp_path / "state").glob("*.json"))


# ------------------------------------------------------------------------------ hostile YAML

def test_an_alias_bomb_is_refused_without_expanding_it() -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 10):  # 10**10 values once expanded ("billion laughs")
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    p = one_of("\n".join(lines) + "\n")
    assert "aliases expand the document" in p.problem


def test_a_few_shared_blocks_are_fine() -> None:
    text = yaml.safe_dump(BASE) + "timeouts: &t {stall_s: 60}\n"
    parse_config(text)


def test_a_huge_file_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (MAX_CONFIG_BYTES + 10) + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(big)
    [p] = info.value.problems
    assert "limit" in p.problem


def test_the_error_report_is_bounded() -> None:
    data = yaml.safe_load(yaml.safe_dump(BASE))
    data["engine"]["args"] = {f"--flag{i}" + "x" * 600: 1 for i in range(60)}
    found = one_of(yaml.safe_dump(data), many=True)
    assert len(found) == MAX_PROBLEMS + 1 and "more problems not shown" in found[-1].problem
    assert all(len(x.problem) <= MAX_PROBLEM_CHARS and len(x.path) <= MAX_PROBLEM_CHARS
               for x in found)
    with pytest.raises(ConfigError) as info:
        parse_config(yaml.safe_dump(data))
    assert len(str(info.value)) < 50_000


def one_of(text: str, many: bool = False):  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        parse_config(text, "test.yaml")
    if many:
        return info.value.problems
    assert len(info.value.problems) == 1, info.value.problems
    return info.value.problems[0]
