"""The configuration's readable problem list: one line per problem naming its key path, what is
wrong and the fix; pydantic's validation errors translated into it.

A validator that knows the fix raises `FixableValueError`; `validation_problems` keeps its two
halves apart in the report. The report is bounded (a hostile file must not flood the journal).
Pure, and independent of the schema: the root model to explain against is an argument.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

KEY_SOURCE_ERROR_HINT = "see docs/CONFIG.md"


@dataclass(frozen=True)
class ConfigProblem:
    path: str  # key path, e.g. "profiles[2].args.tp-size"; "" for the whole file
    problem: str
    fix: str

    def __str__(self) -> str:
        where = self.path or "(file)"
        return f"{where}: {self.problem}\n    fix: {self.fix}"


# A hostile file must not produce an unbounded report (journal, terminal, --json).
MAX_PROBLEMS = 50
MAX_PROBLEM_CHARS = 300


def _clip(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM_CHARS else text[:MAX_PROBLEM_CHARS - 3] + "..."


def _bounded(problems: list[ConfigProblem]) -> list[ConfigProblem]:
    out = [ConfigProblem(_clip(p.path), _clip(p.problem), _clip(p.fix)) for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        out.append(ConfigProblem("", f"{len(problems) - MAX_PROBLEMS} more problems not shown",
                                 "fix the ones above first"))
    return out


class ConfigError(Exception):
    """An invalid configuration. `str()` is the report for humans; `problems` the data for --json."""

    def __init__(self, problems: list[ConfigProblem], source: str = "configuration") -> None:
        self.problems = _bounded(problems)
        self.source = _clip(source)
        super().__init__(self.report())

    def report(self) -> str:
        n = len(self.problems)
        head = f"{self.source}: {n} configuration problem{'s' if n != 1 else ''}"
        return "\n".join([head, *(f"  - {p!s}" for p in self.problems)])

    def __str__(self) -> str:
        return self.report()


class FixableValueError(ValueError):
    """A validator's verdict with the fix kept apart, so the report can print both."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} ({fix})")


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def guess_or(word: str, choices: Iterable[str], otherwise: str) -> str:
    """The fix for a name that matches none of `choices`: the close one, else `otherwise`."""
    guess = did_you_mean(word, choices)
    return f"did you mean {guess!r}?" if guess else otherwise


# ---- pydantic errors -> problems -------------------------------------------------------------


def format_path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _unwrap(tp: Any) -> Any:
    """Optional[X] / X | None -> X."""
    args = [a for a in get_args(tp) if a is not type(None)]
    if get_origin(tp) in (None, list, dict) or len(args) != 1:
        return tp
    return args[0]


def _type_at(root: type[BaseModel], loc: Sequence[str | int]) -> Any:
    """The declared type at a key path (None when the path leaves the schema)."""
    tp: Any = root
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None:
                return None
            tp = field.annotation
        elif get_origin(tp) is list and isinstance(part, int):
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            return None
    return _unwrap(tp)


def _all_fields(root: type[BaseModel]) -> dict[str, list[str]]:
    """field name -> the key paths where it is valid (for 'belongs under ...' hints)."""
    where: dict[str, list[str]] = {}

    def visit(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            path = f"{prefix}.{name}" if prefix else name
            where.setdefault(name, []).append(path)
            tp = _unwrap(field.annotation)
            if get_origin(tp) is list:
                tp = get_args(tp)[0]
                path += "[]"
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                visit(tp, path)

    visit(root, "")
    return where


def _unknown_key_problem(root: type[BaseModel], loc: Sequence[str | int]) -> ConfigProblem:
    key = str(loc[-1])
    parent = _type_at(root, loc[:-1])
    valid = sorted(parent.model_fields) if isinstance(parent, type) and issubclass(parent, BaseModel) else []
    guess = did_you_mean(key, valid)
    if guess:
        fix = f"did you mean {guess!r}?"
    else:
        elsewhere = [p for p in _all_fields(root).get(key, []) if "." in p or "[" in p]
        where = format_path(loc[:-1]) or "the top level"
        if elsewhere:
            fix = f"{key!r} belongs under {elsewhere[0].rsplit('.', 1)[0]}, not {where}"
        else:
            fix = f"remove it; valid keys here: {', '.join(valid)}"
    return ConfigProblem(format_path(loc), f"unknown key {key!r}", fix)


_TYPE_FIXES = {
    "int": "write a whole number",
    "float": "write a number",
    "bool": "write true or false",
    "string": "write a string (quote it if YAML reads it as something else)",
    "list": "write a YAML list ([a, b] or '- a' lines)",
    "dict": "write a mapping ('key: value' lines)",
    "model": "write a mapping ('key: value' lines)",
}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _error_problem(root: type[BaseModel], err: ErrorDetails, loc: tuple[str | int, ...]) -> ConfigProblem:
    kind = err["type"]
    path = format_path(loc)
    msg = err["msg"]
    if kind == "extra_forbidden":
        return _unknown_key_problem(root, loc)
    if kind == "missing":
        parent = format_path(loc[:-1]) or "the top level"
        return ConfigProblem(path, f"required key {loc[-1]!s} is missing",
                             f"add '{loc[-1]!s}:' under {parent} ({KEY_SOURCE_ERROR_HINT})")
    if kind == "value_error":
        exc = (err.get("ctx") or {}).get("error")
        if isinstance(exc, FixableValueError):
            return ConfigProblem(path, exc.problem, exc.fix)
        text = str(exc) if exc is not None else msg.removeprefix("Value error, ")
        return ConfigProblem(path, text, "change the value as the message says")
    if kind in ("literal_error", "enum"):
        return ConfigProblem(path, f"{msg}; got {_short(err.get('input'))}", "use one of the listed values")
    if kind in ("too_short", "too_long"):
        return ConfigProblem(path, msg, "add or remove entries as the message says")
    for prefix, fix in _TYPE_FIXES.items():
        if kind.startswith(prefix):
            return ConfigProblem(path, f"{msg}; got {_short(err.get('input'))}", fix)
    if kind == "finite_number":
        return ConfigProblem(path, f"{_short(err.get('input'))} is not a finite number",
                             "write a number (.inf and .nan cannot be used as a duration or count)")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return ConfigProblem(path, f"{msg}; got {_short(err.get('input'))}",
                             "set a value in the allowed range")
    return ConfigProblem(path, f"{msg}; got {_short(err.get('input'))}", KEY_SOURCE_ERROR_HINT)


def _data_loc(data: object, loc: tuple[str | int, ...], kind: str) -> tuple[str | int, ...]:
    """Cut pydantic's loc back to keys that exist in the input (drops union branch names)."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        if part == "[key]":
            break
        present = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node))
        if present:
            node = node[part]  # type: ignore[index]
        else:
            if (kind in ("missing", "extra_forbidden") or not out) and i == len(loc) - 1:
                out.append(part)
            break
        out.append(part)
    return tuple(out)


def validation_problems(root: type[BaseModel], exc: ValidationError, data: object) -> list[ConfigProblem]:
    """`root.model_validate(data)`'s errors as problems at key paths of `data`, one per path."""
    problems: dict[str, ConfigProblem] = {}
    for err in exc.errors():
        loc = _data_loc(data, tuple(err["loc"]), err["type"])
        problem = _error_problem(root, err, loc)
        if problem.path in problems:  # one value that failed every branch of a union
            continue
        problems[problem.path] = problem
    return list(problems.values())

