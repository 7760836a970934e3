"""One SGLang release's command line as data: every option, whether it takes a value, its choices,
its nargs, its value type (int, float), its deprecation; and the check of an argv against it that
argparse would make.

The catalogues (`catalog/sglang-<V>.json`) are extracted from the PyPI wheels by
`scripts/gen-flag-catalog`; an unlisted version uses the nearest older catalogue.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

from sglang_supervisor.engine.versions import _CATALOG_PACKAGE, nearest_known_version

Severity = Literal["error", "warning"]
ValueType = Literal["int", "float"]
# argparse calls the option's `type=` on each value string: the same converters, the same verdict.
_CONVERTERS = {"int": int, "float": float}



@dataclass(frozen=True)
class FlagSpec:
    takes_value: bool
    choices: tuple[str, ...] | None  # None: not a fixed list (or only known at runtime)
    nargs: str | None  # argparse nargs ("+", "*", "?", "2"); None: exactly one value or a switch
    deprecated_to: str | None  # what SGLang's deprecation warning says to use instead
    deprecated: bool = False  # accepted with a warning (some have no replacement)
    value_type: ValueType | None = None  # argparse's int/float converter; None: str or custom


@dataclass(frozen=True)
class FlagProblem:
    flag: str
    severity: Severity
    message: str
    fix: str


@dataclass(frozen=True)
class FlagCatalog:
    version: str
    options: Mapping[str, FlagSpec]
    allow_abbrev: bool

    def resolve(self, option: str) -> str | None:
        """The option argparse would pick for `option` (exact, or a unique `--` prefix)."""
        name = option.split("=", 1)[0]
        if name in self.options:
            return name
        matches = self.prefix_matches(name)
        return matches[0] if len(matches) == 1 else None

    def prefix_matches(self, name: str) -> list[str]:
        if not self.allow_abbrev or not name.startswith("--") or len(name) < 3:
            return []
        return sorted(o for o in self.options if o.startswith(name))

    def validate(self, argv: Sequence[str]) -> list[FlagProblem]:
        """What argparse of this version would reject (errors) or accept silently but risky
        (warnings: abbreviations hide typos, deprecated aliases go away)."""
        problems: list[FlagProblem] = []
        i = 0
        while i < len(argv):
            arg = argv[i]
            i += 1
            if not arg.startswith("-") or arg == "-" or _looks_negative_number(arg):
                problems.append(
                    FlagProblem(
                        arg,
                        "error",
                        f"sglang {self.version}: unrecognized argument {arg!r} (no option takes it)",
                        "remove it, or put it after the option it belongs to",
                    )
                )
                continue
            name, eq, inline = arg.partition("=")
            canonical = self._canonical(name, problems)
            if canonical is None:
                # Skip what looks like its values so one bad flag is reported once.
                while i < len(argv) and not is_option(argv[i]):
                    i += 1
                continue
            spec = self.options[canonical]
            if spec.deprecated:
                use = f"use {spec.deprecated_to}" if spec.deprecated_to else "remove it"
                problems.append(
                    FlagProblem(
                        canonical,
                        "warning",
                        f"sglang {self.version}: {canonical} is deprecated",
                        use,
                    )
                )
            if not spec.takes_value:
                if eq:
                    problems.append(
                        FlagProblem(
                            canonical,
                            "error",
                            f"{canonical} is a switch; it takes no value (got {inline!r})",
                            f"write {canonical} alone",
                        )
                    )
                continue
            values: list[str]
            if eq:
                values = [inline]
            else:
                values = []
                limit = max_values(spec.nargs)
                while i < len(argv) and len(values) < limit and not is_option(argv[i]):
                    values.append(argv[i])
                    i += 1
            problems += self._value_problems(canonical, spec, values)
        return problems

    def _value_problems(self, canonical: str, spec: FlagSpec, values: Sequence[str]) -> list[FlagProblem]:
        """An option's values against its nargs and its choices."""
        if len(values) < _min_values(spec.nargs):
            return [
                FlagProblem(
                    canonical,
                    "error",
                    f"{canonical} expects {_describe_nargs(spec.nargs)}",
                    f"give {canonical} a value" + _choices_hint(spec),
                )
            ]
        if spec.value_type is not None:
            convert = _CONVERTERS[spec.value_type]
            bad: list[FlagProblem] = []
            for value in values:
                try:
                    convert(value)
                except ValueError:
                    bad.append(FlagProblem(
                        canonical,
                        "error",
                        f"{canonical}: invalid {spec.value_type} value {value!r} on sglang "
                        f"{self.version} (SGLang exits with rc 2)",
                        f"give {canonical} {'an integer' if spec.value_type == 'int' else 'a number'}"
                        + (f" (one of {', '.join(spec.choices)})" if spec.choices else ""),
                    ))
            if bad:  # argparse converts before it compares with the choices
                return bad
        if spec.choices is None:
            return []
        return [
            FlagProblem(
                canonical,
                "error",
                f"{canonical}: invalid choice {value!r} on sglang {self.version}",
                "choose one of " + ", ".join(spec.choices),
            )
            for value in values
            if _as_choice(value, spec) not in spec.choices
        ]

    def _canonical(self, name: str, problems: list[FlagProblem]) -> str | None:
        if name in self.options:
            return name
        matches = self.prefix_matches(name)
        if len(matches) == 1:
            problems.append(
                FlagProblem(
                    name,
                    "warning",
                    f"{name} is an abbreviation that argparse expands to {matches[0]}",
                    f"write {matches[0]} in full (an abbreviation hides typos)",
                )
            )
            return matches[0]
        if len(matches) > 1:
            shown = ", ".join(matches[:6]) + (", ..." if len(matches) > 6 else "")
            problems.append(
                FlagProblem(
                    name,
                    "error",
                    f"sglang {self.version}: ambiguous option {name} could match {shown}",
                    "write the full option name",
                )
            )
            return None
        close = difflib.get_close_matches(name, list(self.options), n=3, cutoff=0.75)
        fix = f"did you mean {' or '.join(close)}?" if close else "remove it (sglang would exit with rc 2)"
        problems.append(
            FlagProblem(name, "error", f"sglang {self.version} does not accept {name}", fix)
        )
        return None


def is_option(arg: str) -> bool:
    return arg.startswith("-") and arg != "-" and not _looks_negative_number(arg)


def _looks_negative_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True


def _min_values(nargs: str | None) -> int:
    if nargs in ("*", "?"):
        return 0
    if nargs == "+" or nargs is None:
        return 1
    return int(nargs)


def max_values(nargs: str | None) -> int:
    if nargs is None or nargs == "?":
        return 1
    if nargs in ("+", "*"):
        return 1 << 30
    return int(nargs)


def _describe_nargs(nargs: str | None) -> str:
    if nargs is None or nargs == "?":
        return "a value"
    if nargs == "+":
        return "one or more values"
    if nargs == "*":
        return "values"
    return f"{nargs} values"


def _choices_hint(spec: FlagSpec) -> str:
    return f" (one of {', '.join(spec.choices)})" if spec.choices else ""


def _as_choice(value: str, spec: FlagSpec) -> str:
    """The value as argparse compares it with the choices: converted first (`02` is choice 2)."""
    if spec.value_type is None:
        return value
    return str(_CONVERTERS[spec.value_type](value))


def _value_type(raw: object) -> ValueType | None:
    if raw == "int":
        return "int"
    if raw == "float":
        return "float"
    return None


@cache
def flag_catalog(version: str) -> FlagCatalog:
    """The flag catalogue of `version` (or of the nearest older known version)."""
    use = nearest_known_version(version)
    raw = json.loads(
        resources.files(_CATALOG_PACKAGE).joinpath(f"sglang-{use}.json").read_text(encoding="utf-8")
    )
    options = {
        name: FlagSpec(
            takes_value=bool(spec["takes_value"]),
            choices=tuple(spec["choices"]) if spec["choices"] is not None else None,
            nargs=spec["nargs"],
            deprecated_to=spec["deprecated_to"],
            deprecated=bool(spec.get("deprecated", False)),
            value_type=_value_type(spec.get("type")),
        )
        for name, spec in raw["options"].items()
    }
    return FlagCatalog(version=use, options=options, allow_abbrev=bool(raw["allow_abbrev"]))
