"""Flags and environment variables renamed or removed between SGLang releases, in both directions:
a profile written for one release is rewritten for the release at hand (`migrate_args`,
`migrate_env`), with a `Migration` for each rewrite and a `FlagProblem` for what cannot be.

Long because: the rename tables of both directions and the removal advice belong with the passes
that apply them (argv and environment) and with the per-flag checks of the target release made on
the way (renamed, removed, unknown, given twice, the --log-requests warning); all of them read the
same argv items and tables.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_supervisor.engine.flagcatalog import (
    FlagCatalog,
    FlagProblem,
    FlagSpec,
    flag_catalog,
    is_option,
    max_values,
)
from sglang_supervisor.engine.patterns import UNKNOWN_SPEC_ALGORITHM
from sglang_supervisor.engine.versions import (
    PER_PHASE_GRAPHS,
    SPEC_V2_IGNORED,
    TC_PIECEWISE_REMOVED,
    at_least,
    known_versions,
    parse_version,
)


@dataclass(frozen=True)
class Migration:
    old: str  # what the profile said ("--cuda-graph-max-bs 16")
    new: str  # what the target version gets ("" when dropped)
    since: str  # the SGLang version the change happened in
    note: str


@dataclass(frozen=True)
class ArgMigration:
    args: list[str]
    migrations: list[Migration]
    problems: list[FlagProblem]


@dataclass(frozen=True)
class EnvMigration:
    env: dict[str, str]
    warnings: list[FlagProblem]


@dataclass(frozen=True)
class _Rename:
    """`old [old_value]` → `new [new_value]`; a None value slot means "carry the values over"."""

    old: str
    new: str
    since: str
    note: str
    old_value: str | None = None  # match only this value (for value → switch mappings)
    new_value: str | None = None  # emit this value (for switch → value mappings)
    new_is_switch: bool = False


# Applied when the target is >= 0.5.14 (aliases there, gone from 0.5.20).
_FORWARD: tuple[_Rename, ...] = (
    _Rename("--enforce-piecewise-cuda-graph", "--cuda-graph-backend-prefill", PER_PHASE_GRAPHS,
            "the piecewise prefill graph became the per-phase prefill graph; breakable is its "
            "successor (the alias meant tc_piecewise, removed in 0.5.22)", new_value="breakable"),
    _Rename("--disable-piecewise-cuda-graph", "--cuda-graph-backend-prefill", PER_PHASE_GRAPHS,
            "prefill graphs are configured per phase", new_value="disabled"),
    _Rename("--enable-breakable-cuda-graph", "--cuda-graph-backend-prefill", PER_PHASE_GRAPHS,
            "prefill graphs are configured per phase", new_value="breakable"),
    _Rename("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy", PER_PHASE_GRAPHS,
            "renamed; same choices"),
    _Rename("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", PER_PHASE_GRAPHS,
            "graph batch sizes are per phase"),
    _Rename("--cuda-graph-bs", "--cuda-graph-bs-decode", PER_PHASE_GRAPHS,
            "graph batch sizes are per phase"),
    _Rename("--piecewise-cuda-graph-max-tokens", "--cuda-graph-max-bs-prefill", PER_PHASE_GRAPHS,
            "graph sizes are per phase"),
    _Rename("--piecewise-cuda-graph-tokens", "--cuda-graph-bs-prefill", PER_PHASE_GRAPHS,
            "graph sizes are per phase"),
)

# Applied when the target is <= 0.5.13 (a profile written for a newer release).
_BACKWARD: tuple[_Rename, ...] = (
    _Rename("--cuda-graph-backend-prefill", "--disable-piecewise-cuda-graph", PER_PHASE_GRAPHS,
            "before 0.5.14 the prefill graph was the piecewise graph", old_value="disabled",
            new_is_switch=True),
    _Rename("--cuda-graph-backend-prefill", "--enforce-piecewise-cuda-graph", PER_PHASE_GRAPHS,
            "before 0.5.14 the prefill graph was the piecewise graph", old_value="breakable",
            new_is_switch=True),
    _Rename("--cuda-graph-backend-prefill", "--enforce-piecewise-cuda-graph", PER_PHASE_GRAPHS,
            "before 0.5.14 the prefill graph was the piecewise graph", old_value="full",
            new_is_switch=True),
    _Rename("--cuda-graph-backend-prefill", "--enforce-piecewise-cuda-graph", PER_PHASE_GRAPHS,
            "before 0.5.14 the prefill graph was the piecewise graph", old_value="tc_piecewise",
            new_is_switch=True),
    _Rename("--disable-prefill-cuda-graph", "--disable-piecewise-cuda-graph", PER_PHASE_GRAPHS,
            "before 0.5.14 the prefill graph was the piecewise graph", new_is_switch=True),
    _Rename("--cuda-graph-backend-decode", "--disable-cuda-graph", PER_PHASE_GRAPHS,
            "before 0.5.14 --disable-cuda-graph turned the decode graph off", old_value="disabled",
            new_is_switch=True),
    _Rename("--disable-decode-cuda-graph", "--disable-cuda-graph", PER_PHASE_GRAPHS,
            "before 0.5.14 --disable-cuda-graph turned the decode graph off", new_is_switch=True),
    _Rename("--cuda-graph-backend-decode", "", PER_PHASE_GRAPHS,
            "the only decode graph before 0.5.14 is the full one (the default)", old_value="full"),
    _Rename("--mamba-radix-cache-strategy", "--mamba-scheduler-strategy", PER_PHASE_GRAPHS,
            "the old name; same choices"),
    _Rename("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs", PER_PHASE_GRAPHS,
            "one graph batch size before 0.5.14"),
    _Rename("--cuda-graph-bs-decode", "--cuda-graph-bs", PER_PHASE_GRAPHS,
            "one graph batch size list before 0.5.14"),
    _Rename("--cuda-graph-max-bs-prefill", "--piecewise-cuda-graph-max-tokens", PER_PHASE_GRAPHS,
            "the piecewise graph's size before 0.5.14"),
    _Rename("--cuda-graph-bs-prefill", "--piecewise-cuda-graph-tokens", PER_PHASE_GRAPHS,
            "the piecewise graph's sizes before 0.5.14"),
)

# Flags that went away with no equivalent: what to do instead.
_REMOVED_ADVICE: Mapping[str, str] = {
    "--collect-tokens-histogram": "remove it: token histograms are collected with --enable-metrics",
    "--enable-expert-distribution-metrics": "remove it (expert distribution metrics were dropped)",
    "--prefill-round-robin-balance": "remove it (it had no effect since it was deprecated)",
    "--piecewise-cuda-graph-compiler": "remove it: the torch.compile prefill backend is gone; "
    "use --cuda-graph-backend-prefill breakable",
    "--cuda-graph-tc-compiler": "remove it: the tc_piecewise prefill backend is gone; "
    "use --cuda-graph-backend-prefill breakable",
}

_UNKNOWN_SPEC_ALGORITHMS: Mapping[str, str] = {
    "MTP": "use --speculative-algorithm NEXTN (an alias of EAGLE) for a model's built-in MTP "
    "head, or EAGLE with a draft model",
}


@dataclass(frozen=True)
class _Item:
    flag: str  # "" for a stray positional
    values: tuple[str, ...]
    inline: bool  # written as --flag=value

    def render(self) -> list[str]:
        if not self.flag:
            return list(self.values)
        if self.inline and len(self.values) == 1:
            return [f"{self.flag}={self.values[0]}"]
        return [self.flag, *self.values]

    def text(self) -> str:
        return " ".join(self.render())


def _spec_anywhere(flag: str, target: FlagCatalog) -> FlagSpec | None:
    """How `flag` parses: per the target catalogue, else per the newest catalogue that has it."""
    if flag in target.options:
        return target.options[flag]
    for version in reversed(known_versions()):
        spec = flag_catalog(version).options.get(flag)
        if spec is not None:
            return spec
    return None


def _split_items(args: Sequence[str], target: FlagCatalog) -> list[_Item]:
    items: list[_Item] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not is_option(arg):
            items.append(_Item("", (arg,), False))
            continue
        name, eq, inline = arg.partition("=")
        if eq:
            items.append(_Item(name, (inline,), True))
            continue
        spec = _spec_anywhere(target.resolve(name) or name, target)
        if spec is not None and not spec.takes_value:
            items.append(_Item(name, (), False))
            continue
        limit = max_values(spec.nargs) if spec is not None else 1 << 30
        values: list[str] = []
        while i < len(args) and len(values) < limit and not is_option(args[i]):
            values.append(args[i])
            i += 1
        items.append(_Item(name, tuple(values), False))
    return items


def _apply(rule: _Rename, item: _Item) -> _Item | None:
    if not rule.new:
        return None
    if rule.new_is_switch:
        return _Item(rule.new, (), False)
    if rule.new_value is not None:
        return _Item(rule.new, (rule.new_value,), False)
    return _Item(rule.new, item.values, item.inline)


def _find_rule(rules: Sequence[_Rename], flag: str, item: _Item) -> _Rename | None:
    for rule in rules:
        if rule.old == flag and (rule.old_value is None or item.values == (rule.old_value,)):
            return rule
    return None


def _last_version_with(flag: str) -> str | None:
    found = [v for v in known_versions() if flag in flag_catalog(v).options]
    return found[-1] if found else None


def migrate_args(args: Sequence[str], version: str) -> ArgMigration:
    """Rewrite argv written for any SGLang release so that `version` accepts it.

    Renamed flags are rewritten (each one reported as a Migration); flags with no equivalent,
    removed choices and names that fail at runtime are error problems with a fix; the result is
    validated against the target's catalogue (abbreviations and deprecations are warnings), and
    abbreviations are written in full.
    """
    target = flag_catalog(version)
    modern = at_least(version, PER_PHASE_GRAPHS)
    rules = _FORWARD if modern else _BACKWARD
    out: list[_Item] = []
    migrations: list[Migration] = []
    problems: list[FlagProblem] = []
    explained: set[str] = set()
    for item in _split_items(args, target):
        rule = _find_rule(rules, item.flag, item)
        flag = (target.resolve(item.flag) or item.flag) if item.flag else ""
        if rule is None and flag != item.flag:
            rule = _find_rule(rules, flag, item)
        if rule is not None:
            new_item = _apply(rule, item)
            migrations.append(
                Migration(item.text(), new_item.text() if new_item else "", rule.since, rule.note)
            )
            if new_item is not None:
                out.append(new_item)
            continue
        generic = _generic_rename(flag, item, target)
        if generic is not None:
            new_item, migration = generic
            migrations.append(migration)
            out.append(new_item)
            continue
        problem = _version_problem(flag, item, version, target)
        if problem is not None:
            problems.append(problem)
            explained.add(item.flag)
        out.append(item)
    written = [tok for item in out for tok in item.render()]
    problems.extend(p for p in target.validate(written) if p.flag not in explained)
    problems.extend(_duplicates(out, target))
    problems.extend(_forgeable_request_log(out, target))
    argv = [tok for item in out for tok in _in_full(item, target).render()]
    return ArgMigration(argv, migrations, problems)


def _in_full(item: _Item, target: FlagCatalog) -> _Item:
    """An abbreviation as the option argparse expands it to (still a warning above): every reader
    of the command (the READY gate's graph model, the TP size, doctor) then sees that option."""
    if not item.flag or item.flag in target.options:
        return item
    full = target.resolve(item.flag)
    return _Item(full, item.values, item.inline) if full else item


def _generic_rename(flag: str, item: _Item, target: FlagCatalog) -> tuple[_Item, Migration] | None:
    """A deprecated alias that some catalogue maps to a plain `--new` flag the target accepts."""
    if not flag or (flag in target.options and not target.options[flag].deprecated):
        return None
    for version in known_versions():  # oldest first: "since" is where the alias appeared
        spec = flag_catalog(version).options.get(flag)
        new = (spec.deprecated_to if spec is not None else None) or ""
        plain = new.startswith("--") and not any(c in new for c in "={ ")
        if plain and new in target.options:
            moved = _Item(new, item.values, item.inline)
            note = f"deprecated alias of {new} (sglang {version} says so)"
            return moved, Migration(item.text(), moved.text(), version, note)
    return None


def _version_problem(flag: str, item: _Item, version: str, target: FlagCatalog) -> FlagProblem | None:
    if flag == "--speculative-algorithm" and item.values:
        algo = item.values[0].upper()
        if algo in _UNKNOWN_SPEC_ALGORITHMS:
            return FlagProblem(
                flag,
                "error",
                f"--speculative-algorithm {item.values[0]} passes argparse but SGLang fails at "
                f"startup: '{UNKNOWN_SPEC_ALGORITHM}: {item.values[0]}'",
                _UNKNOWN_SPEC_ALGORITHMS[algo],
            )
    if (
        flag == "--cuda-graph-backend-prefill"
        and item.values == ("tc_piecewise",)
        and at_least(version, TC_PIECEWISE_REMOVED)
    ):
        return FlagProblem(
                flag,
                "error",
                f"sglang {version}: tc_piecewise was removed in {TC_PIECEWISE_REMOVED}",
                "use --cuda-graph-backend-prefill breakable (or full, or disabled)",
            )
    if (
        flag == "--cuda-graph-backend-decode"
        and item.values == ("breakable",)
        and not at_least(version, PER_PHASE_GRAPHS)
    ):
        return FlagProblem(
                flag,
                "error",
                f"sglang {version} has no breakable decode graph (per-phase backends start in "
                f"{PER_PHASE_GRAPHS})",
                "remove it (the full decode graph is the default) or run sglang >= 0.5.14",
            )
    if flag and flag not in target.options and not target.prefix_matches(flag):
        last = _last_version_with(flag)
        if last is None:
            return None  # never existed: the catalogue check suggests close names
        spec = _spec_anywhere(flag, target)
        removed_advice = _REMOVED_ADVICE.get(flag)
        if removed_advice is None and spec is not None and spec.deprecated_to:
            removed_advice = f"use {spec.deprecated_to}"
        if parse_version(last) < parse_version(version):
            what = f"was removed after sglang {last}"
        else:
            what = f"exists only from a later release than {version} (first seen after it)"
        return FlagProblem(
            flag,
            "error",
            f"sglang {version}: {flag} {what}; this version exits with rc 2 on it",
            removed_advice or f"remove it, or run an sglang release that has it ({last})",
        )
    return None


def _duplicates(items: Sequence[_Item], target: FlagCatalog) -> list[FlagProblem]:
    seen: dict[str, str] = {}
    problems: list[FlagProblem] = []
    for item in items:
        if not item.flag:
            continue
        name = target.resolve(item.flag) or item.flag
        if name in seen and seen[name] != item.text():
            problems.append(
                FlagProblem(
                    name,
                    "warning",
                    f"{name} is given twice ({seen[name]!r} and {item.text()!r}); argparse keeps the last",
                    f"keep one {name} in the profile",
                )
            )
        seen[name] = item.text()
    return problems


def _forgeable_request_log(items: Sequence[_Item], target: FlagCatalog) -> list[FlagProblem]:
    """`--log-requests` in SGLang's text form (the default) prints the keys of a request's dicts
    unescaped (`'{k}': repr(v)` in request_logger.py, 0.5.17 and 0.5.23), and users choose the
    keys of `sampling_params` (logged from level 1 up): a key with a newline writes whole lines
    into the engine's output. The supervisor parses only stderr, and these records are on stdout
    (0.5.8+), but the engine log file holds both: `logscan` and people reading it cannot tell the
    forged lines apart. The json form escapes keys; a directory target keeps the records out of
    that output (docs/FAULTS.md, "Residual risk")."""
    given: dict[str, tuple[str, ...]] = {}
    for item in items:
        if item.flag:
            given[target.resolve(item.flag) or item.flag] = item.values
    if "--log-requests" not in given:
        return []
    fmt = given.get("--log-requests-format", ("text",))
    level = given.get("--log-requests-level", ("2",))
    targets = [t.lower() for t in given.get("--log-requests-target", ("stdout",))]
    if fmt[-1:] == ("json",) or level[-1:] == ("0",) or "stdout" not in targets:
        return []
    return [FlagProblem(
        "--log-requests", "warning",
        "--log-requests in the text form prints the keys of request dicts (sampling_params, "
        "chat_template_kwargs) unescaped: an API user can write whole lines into the engine log; "
        "the supervisor reads them apart (stdout) and is not misled, but logscan and anyone "
        "reading the saved log cannot tell them from the engine's own",
        "add --log-requests-format json, or --log-requests-target DIRECTORY to log requests to files",
    )]


def migrate_env(env: Mapping[str, str], version: str) -> EnvMigration:
    """Drop environment variables that the target version ignores, with a warning each."""
    out = dict(env)
    warnings: list[FlagProblem] = []
    if "SGLANG_ENABLE_SPEC_V2" in out and at_least(version, SPEC_V2_IGNORED):
        del out["SGLANG_ENABLE_SPEC_V2"]
        warnings.append(
            FlagProblem(
                "SGLANG_ENABLE_SPEC_V2",
                "warning",
                f"sglang {version} ignores SGLANG_ENABLE_SPEC_V2 (no-op since {SPEC_V2_IGNORED}; "
                "speculative decoding always runs the V2 worker)",
                "remove it from the profile; use --disable-overlap-schedule for the synchronous path",
            )
        )
    if "SGLANG_LOGGING_CONFIG_PATH" in out:
        # SGLang then configures its loggers from that file instead of basicConfig (stderr). The
        # supervisor takes the engine's own voice from stderr only: stdout carries the request
        # records API users write into (docs/FAULTS.md), so a handler there would hide start-up
        # progress, failures and the ready line, and no start would ever be seen to complete.
        warnings.append(
            FlagProblem(
                "SGLANG_LOGGING_CONFIG_PATH",
                "warning",
                "SGLANG_LOGGING_CONFIG_PATH replaces SGLang's logging setup; the supervisor reads "
                "SGLang's own log from the engine's stderr only (stdout holds request records, "
                "which API users write into), so a handler on stdout hides the ready line and "
                "every failure from it",
                "keep SGLang's handlers on ext://sys.stderr in that file, or remove the variable",
            )
        )
    return EnvMigration(out, warnings)


def stdout_log_handlers(text: str) -> list[str] | None:
    """Handlers of an `SGLANG_LOGGING_CONFIG_PATH` file (SGLang reads it as JSON and gives it to
    `logging.config.dictConfig`) that write to stdout, where the supervisor never reads SGLang's
    log; None when the text is not such a JSON object (SGLang would fail on it itself)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    handlers = data.get("handlers") if isinstance(data, dict) else None
    if not isinstance(handlers, dict):
        return None if not isinstance(data, dict) else []
    return sorted(str(name) for name, spec in handlers.items()
                  if isinstance(spec, dict) and "sys.stdout" in str(spec.get("stream", "")))
