"""Supervisor configuration: YAML -> validated, frozen model (`parse_config`), or a ConfigError
listing every problem with its key path and fix.

Assembled from parts that each hold one side of the contract: config_yaml (the text read at a
bounded cost, duplicate keys, each key's line), config_values (what one value may be: name
shapes, managed flags, the longest durations, the flag and environment checks), config_schema
(the typed sections and `Config`), config_semantics (checks across keys, `effective_overlay`),
config_report (the readable problem list: pydantic's errors turned into the key, the problem and
the fix, bounded). The names other modules use are importable from here.

Pure: reading the file and checking the files it names (API key files, a local model) is
`shell.configfile.load_config`'s.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError

from sglang_supervisor.core.config_report import (
    MAX_PROBLEM_CHARS,
    MAX_PROBLEMS,
    ConfigError,
    ConfigProblem,
    FixableValueError,
    did_you_mean,
    validation_problems,
)
from sglang_supervisor.core.config_schema import Config, EngineSettings, GatewaySettings, Profile
from sglang_supervisor.core.config_semantics import effective_overlay, semantic_problems
from sglang_supervisor.core.config_values import PROFILE_NAME, VERSION, ArgValue, is_local_model, raw_problems
from sglang_supervisor.core.config_yaml import MAX_CONFIG_BYTES, add_lines, read_yaml

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_PROBLEMS",
    "MAX_PROBLEM_CHARS",
    "PROFILE_NAME",
    "VERSION",
    "ArgValue",
    "Config",
    "ConfigError",
    "ConfigProblem",
    "EngineSettings",
    "FixableValueError",
    "GatewaySettings",
    "Profile",
    "did_you_mean",
    "effective_overlay",
    "is_local_model",
    "parse_config",
]


def parse_config(text: str, source: str = "<config>", *,
                 more_checks: Callable[[Config], list[ConfigProblem]] | None = None) -> Config:
    """Validate YAML text; raise ConfigError (only) listing every problem found.

    Pure: the files the configuration names (API key files, a local model) are not looked at
    here; `more_checks` adds such findings to the same report (`shell.configfile.load_config`
    passes its file checks)."""
    data, problems = read_yaml(text, source)
    if data is None:
        raise ConfigError([ConfigProblem("", "the file is empty",
                                         "start from etc/sglang-supervisor/qwen.yaml")], source)
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem("", f"the top level is a {type(data).__name__}, not a mapping",
                                         "write 'key: value' lines at the top level (engine:, profiles:)")],
                          source)
    raw = raw_problems(data)
    problems += raw
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        # A raw problem names the exact key; pydantic's error for its mapping would repeat it.
        problems += [p for p in validation_problems(Config, exc, data)
                     if not any(r.path.startswith(p.path + ".") or r.path.startswith(p.path + "[")
                                for r in raw)]
        add_lines(problems, text)
        raise ConfigError(problems, source) from None
    except RecursionError:
        raise ConfigError([ConfigProblem("", "an alias refers to itself", "remove the recursive alias")],
                          source) from None
    problems += semantic_problems(config)
    if more_checks is not None:
        problems += more_checks(config)
    if problems:
        add_lines(problems, text)
        raise ConfigError(problems, source)
    return config

