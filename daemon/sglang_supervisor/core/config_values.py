"""What one configuration value may be: the shapes of names and versions, the flags the supervisor
manages, the longest durations, and the checks of a flag, an environment variable or a path.

The schema (config_schema.py) applies them field by field; `raw_problems` applies the flag and
environment checks to the raw YAML, so that every bad key of a mapping is named. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from sglang_supervisor.core.config_report import ConfigProblem, FixableValueError
from sglang_supervisor.engine.argv import MANAGED_FLAGS

ArgScalar = str | int | float | bool
# A flag's value: true = bare flag, false/null = left out, a list = several values (nargs).
ArgValue = ArgScalar | list[str | int | float] | None

# The deployment's and every profile's name: it names files and labels metrics.
PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}\Z")  # \Z: `$` lets "name\n" in
PROFILE_NAME_FIX = "use 1-63 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit"
FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.+-]?[A-Za-z0-9.+-]*)?\Z")

# Flags the supervisor sets itself: written in args they would fight with the typed settings.
# Which SGLang flags those are is engine knowledge (engine/argv.MANAGED_FLAGS); what to write
# instead is the configuration's.
_MANAGED_FIX: dict[str, str] = {
    "model": "set engine.model_path instead",
    "host": "set engine.host instead",
    "port": "set engine.port instead",
    "api_key": "put the key in a file and set engine.api_key_file (or engine.api_key_credential); "
    "a key on the command line is visible to every user in the process table",
    "admin_api_key": "keep secrets off the command line; the supervisor does not pass admin keys",
    "config_file": "the supervisor passes its own --config file (for the API key); remove this flag",
}
RESERVED_FLAGS: dict[str, str] = {flag: _MANAGED_FIX[role] for flag, role in MANAGED_FLAGS.items()}


# Upper bounds: every value `check` accepts must be one `run` can use (timers, EXTEND_TIMEOUT_USEC).
WEEK_S = 7 * 24 * 3600.0
YEAR_S = 365 * 24 * 3600.0
# A Hugging Face model id: `name` or `org/name` (letters, digits, '-', '_', '.'; no '..').
HF_ID = re.compile(r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?\Z")


def is_local_model(model: str) -> bool:
    """A path to weights on this machine, not a Hugging Face id (`org/name`, downloaded by SGLang)."""
    return model.startswith(("/", "./", "../", "~")) or not HF_ID.match(model)


def _control_chars(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def path_text(v: str, what: str) -> str:
    """A path, host or command word: empty or with control characters (a NUL ends `run` at
    exec time; a newline hides in logs) is refused at `check` time."""
    if not v.strip():
        raise FixableValueError(f"{what} is empty", f"write the {what} or remove the key for its default")
    if _control_chars(v):
        raise FixableValueError(f"{what} {v[:60]!r} contains control characters",
                                "remove them (an escape like \\n in a double-quoted YAML string?)")
    return v


def _dashes_error(key: str) -> FixableValueError | None:
    if key.startswith("-"):
        return FixableValueError(f"flag {key!r} starts with dashes", f"write {key.lstrip('-')!r}")
    return None


def _flag_name_error(key: str) -> FixableValueError | None:
    dashes = _dashes_error(key)
    if dashes is not None:
        return dashes
    if "_" in key:
        return FixableValueError(f"flag {key!r} has underscores; SGLang's flags use dashes",
                                 f"write {key.replace('_', '-')!r}")
    if not FLAG_NAME.match(key):
        return FixableValueError(f"{key!r} is not a command-line flag name",
                                 "use the long flag without dashes, e.g. tp-size")
    if key in RESERVED_FLAGS:
        return FixableValueError(f"flag {key!r} is managed by the supervisor", RESERVED_FLAGS[key])
    return None


def _arg_value_error(key: object, value: object) -> FixableValueError | None:
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, str) and "\0" in item:
            return FixableValueError(f"flag {key!s}: the value contains a NUL character",
                                     "no command-line argument can hold one; remove it")
        in_list = isinstance(value, list)
        if isinstance(item, dict | list) or (in_list and (item is None or isinstance(item, bool))):
            return FixableValueError(
                f"flag {key!s}: {item!r} cannot be written on a command line",
                "use a string or number, true (bare flag), false/null (left out), "
                "or a list of strings/numbers (several values)")
        if not isinstance(item, str | int | float | bool | None):
            return FixableValueError(f"flag {key!s}: {type(item).__name__} value {item!r}",
                                     "quote it to make it a string")
    return None


def _env_value_error(key: object, value: object) -> FixableValueError | None:
    if isinstance(value, bool):
        return FixableValueError(f"env {key!s}: {value!r} is a YAML boolean, not a string",
                                 'quote the value you mean, e.g. "1" or "true"')
    if isinstance(value, str) and "\0" in value:
        return FixableValueError(f"env {key!s}: the value contains a NUL character",
                                 "no environment variable can hold one; remove it")
    return None


def _env_name_error(key: str) -> FixableValueError | None:
    if not ENV_NAME.match(key):
        return FixableValueError(f"{key!r} is not an environment variable name",
                                 "use letters, digits and '_', not starting with a digit")
    return None


def _raise_first(errors: Iterable[FixableValueError | None]) -> None:
    for err in errors:
        if err is not None:
            raise err


def check_flag_names(args: Mapping[str, object]) -> None:
    _raise_first(_flag_name_error(k) for k in args)


def check_arg_values(v: object) -> object:
    """Say which flag holds a value that cannot become argv (instead of pydantic's union noise)."""
    if isinstance(v, dict):
        _raise_first(_arg_value_error(k, x) for k, x in v.items())
    return v


def check_flag_list(names: Sequence[str]) -> None:
    _raise_first(_dashes_error(k) for k in names)


def coerce_env(v: object) -> object:
    """YAML reads `SGLANG_X: 1` as an int; the environment only holds strings."""
    if not isinstance(v, dict):
        return v
    _raise_first(_env_value_error(k, x) for k, x in v.items())
    return {k: str(x) if isinstance(x, int | float) else x for k, x in v.items()}


def check_env_names(env: Mapping[str, str]) -> None:
    _raise_first(_env_name_error(k) for k in env)


def _arg_error(key: str, value: object) -> FixableValueError | None:
    return _flag_name_error(key) or _arg_value_error(key, value)


def _env_error(key: str, value: object) -> FixableValueError | None:
    return _env_name_error(key) or _env_value_error(key, value)


# The mappings of a block checked entry by entry, in the order they are reported.
_ENTRY_CHECKS: dict[str, Callable[[str, object], FixableValueError | None]] = {
    "args": _arg_error,
    "env": _env_error,
}


def _block_problems(block: object, prefix: str) -> list[ConfigProblem]:
    """The flags, environment and removed flags of the engine section or of one profile."""
    if not isinstance(block, dict):
        return []
    found: list[tuple[str, FixableValueError | None]] = []
    for key, check in _ENTRY_CHECKS.items():
        entries = block.get(key)
        if isinstance(entries, dict):
            found += [(f"{prefix}.{key}.{k}", check(k, v)) for k, v in entries.items() if isinstance(k, str)]
    remove = block.get("remove")
    if isinstance(remove, list):
        found += [(f"{prefix}.remove[{i}]", _dashes_error(k))
                  for i, k in enumerate(remove) if isinstance(k, str)]
    return [ConfigProblem(path, err.problem, err.fix) for path, err in found if err is not None]


def raw_problems(data: Mapping[object, object]) -> list[ConfigProblem]:
    """Per-key checks of flags and environment on the raw YAML, so that every bad key is named
    (a pydantic validator stops at the first one of a mapping)."""
    blocks: list[tuple[object, str]] = [(data.get("engine"), "engine")]
    profiles = data.get("profiles")
    if isinstance(profiles, list):
        blocks += [(profile, f"profiles[{i}]") for i, profile in enumerate(profiles)]
    return [problem for block, prefix in blocks for problem in _block_problems(block, prefix)]
