"""Checks that need the whole configuration: unique profile names, `extends` chains that end,
removals of what the base sets, remediation rules that name a failure class and a profile or
action, absolute key file paths, a fidelity reference that is a profile. Also each profile's
effective flags and environment (`effective_overlay`), which the chains define.

Pure: the files the configuration names are `shell.configfile`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sglang_supervisor.core.config_report import ConfigProblem, guess_or
from sglang_supervisor.core.config_schema import Config, Profile
from sglang_supervisor.core.config_values import ArgValue
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.failover import REMEDIATION_ACTIONS

REMEDIATION_KEYS = (*(fc.value for fc in FailureClass), "default")


def effective_overlay(config: Config, name: str) -> tuple[dict[str, ArgValue], dict[str, str]]:
    """A profile's flags and environment: engine.args/env overlaid by its `extends` chain and itself."""
    chain: list[Profile] = []
    current: str | None = name
    while current is not None:
        profile = config.profile(current)
        if profile in chain:
            raise ValueError(f"profile {name!r}: 'extends' forms a cycle")
        chain.append(profile)
        current = profile.extends
    args: dict[str, ArgValue] = dict(config.engine.args)
    env: dict[str, str] = dict(config.engine.env)
    for profile in reversed(chain):
        for flag in profile.remove:
            args.pop(flag, None)
        args.update(profile.args)
        for var in profile.env_remove:
            env.pop(var, None)
        env.update(profile.env)
    return args, env


def _unknown_profile(path: str, name: str, names: Sequence[str]) -> ConfigProblem:
    return ConfigProblem(path, f"no profile is named {name!r}",
                         guess_or(name, names, f"use one of: {', '.join(names)}"))


def _fidelity_problems(config: Config) -> list[ConfigProblem]:
    ref = config.fidelity.reference_profile
    if ref is None or ref in config.profile_names:
        return []
    return [_unknown_profile("fidelity.reference_profile", ref, config.profile_names)]


def _duplicate_names(config: Config) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    seen: set[str] = set()
    for i, p in enumerate(config.profiles):
        if p.name in seen:
            problems.append(ConfigProblem(f"profiles[{i}].name", f"profile name {p.name!r} is used twice",
                                          "give every profile a unique name"))
        seen.add(p.name)
    return problems


def _extends_problems(config: Config) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for i, p in enumerate(config.profiles):
        if p.extends is None:
            continue
        if p.extends == p.name:
            problems.append(ConfigProblem(f"profiles[{i}].extends", "a profile cannot extend itself",
                                          "name another profile, or remove 'extends'"))
        elif p.extends not in config.profile_names:
            problems.append(_unknown_profile(f"profiles[{i}].extends", p.extends, config.profile_names))
    return problems


def _cycle_problems(config: Config) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for i, p in enumerate(config.profiles):
        try:
            effective_overlay(config, p.name)
        except ValueError:
            problems.append(ConfigProblem(
                f"profiles[{i}].extends", f"profile {p.name!r}: 'extends' forms a cycle",
                "break the cycle: one profile of the chain must not extend another"))
    return problems


@dataclass(frozen=True)
class _Removal:
    """How a profile's removal list (flags or environment variables) is spoken of."""

    key: str  # the list's key in the profile
    block: str  # the profile's mapping of the same names
    not_in: str
    items: str
    both_fix: str


_FLAG_REMOVAL = _Removal("remove", "args", "is not a flag of", "flags",
                         "keep one: set it in args to change its value, or remove it")
_ENV_REMOVAL = _Removal("env_remove", "env", "is not in the environment of", "variables", "keep one of them")


def _removed(at: str, removal: _Removal, removed: Sequence[str], own: Mapping[str, object], *,
             base: Mapping[str, object], base_name: str) -> list[ConfigProblem]:
    """A removal list's names that the profile also sets, or that its base does not set."""
    problems: list[ConfigProblem] = []
    for j, name in enumerate(removed):
        path = f"{at}.{removal.key}[{j}]"
        if name in own:
            problems.append(ConfigProblem(
                path, f"{name!r} is both removed and set in this profile's {removal.block}",
                removal.both_fix))
        elif name not in base:
            listed = ", ".join(base) or "(none)"
            problems.append(ConfigProblem(
                path, f"{name!r} {removal.not_in} {base_name}, nothing to remove",
                guess_or(name, base, f"remove only {removal.items} that {base_name} sets: {listed}")))
    return problems


def _removal_problems(config: Config) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for i, p in enumerate(config.profiles):
        if p.extends is None:
            base_args, base_env = dict(config.engine.args), dict(config.engine.env)
            base_name = "engine"
        else:
            base_args, base_env = effective_overlay(config, p.extends)
            base_name = f"profile {p.extends!r}"
        at = f"profiles[{i}]"
        problems += _removed(at, _FLAG_REMOVAL, p.remove, p.args, base=base_args, base_name=base_name)
        problems += _removed(at, _ENV_REMOVAL, p.env_remove, p.env, base=base_env, base_name=base_name)
    return problems


# In order, each assuming the ones before found nothing: a chain is followed only between
# unique, known names, and a removal is judged only against a chain that ends.
_PROFILE_CHECKS: tuple[Callable[[Config], list[ConfigProblem]], ...] = (
    _duplicate_names, _extends_problems, _cycle_problems, _removal_problems)


def _profile_problems(config: Config) -> list[ConfigProblem]:
    for check in _PROFILE_CHECKS:
        problems = check(config)
        if problems:
            return problems
    return []


def _remediation_problems(config: Config) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    names = config.profile_names
    for key, target in config.remediation.items():
        path = f"remediation.{key}"
        if key not in REMEDIATION_KEYS:
            problems.append(ConfigProblem(
                path, f"{key!r} is not a failure class",
                guess_or(key, REMEDIATION_KEYS, f"use one of: {', '.join(REMEDIATION_KEYS)}")))
        if target not in names and target not in REMEDIATION_ACTIONS:
            problems.append(ConfigProblem(
                path, f"{target!r} is neither a profile name nor 'next' or 'stop'",
                guess_or(target, [*names, *REMEDIATION_ACTIONS],
                         f"use 'next', 'stop' or one of the profiles: {', '.join(names)}")))
    return problems


def _secret_problems(config: Config) -> list[ConfigProblem]:
    return [*_key_file_problems(config.engine.api_key_file, "engine.api_key_file"),
            *_key_file_problems(config.gateway.api_key_file, "gateway.api_key_file")]


def _key_file_problems(key_file: str | None, path: str) -> list[ConfigProblem]:
    """What the text says; the file itself (mode, owner, existence) is `shell.configfile`'s."""
    if key_file is not None and not key_file.startswith("/"):
        return [ConfigProblem(path, f"{key_file!r} is a relative path (systemd runs us in /)",
                              "write the absolute path of the key file")]
    return []


def semantic_problems(config: Config) -> list[ConfigProblem]:
    """Checks that need the whole configuration (the files it names are `shell.configfile`'s)."""
    return [*_profile_problems(config), *_remediation_problems(config), *_secret_problems(config),
            *_fidelity_problems(config)]
