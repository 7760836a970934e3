"""A profile's flags against our catalogue, its renamed flags, and the real parser's verdict."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sglang_supervisor.core.audit.findings import Finding
from sglang_supervisor.engine.sglang import (
    FlagProblem,
    Migration,
)


def catalog_findings(profile: str, version: str, problems: Sequence[FlagProblem]) -> list[Finding]:
    """Our catalogue's verdict on the rendered argv (`profiles.render(...).problems`).

    The speculative-algorithm name and SGLANG_ENABLE_SPEC_V2 are left to the audit rules, which
    say more about them.
    """
    out: list[Finding] = []
    for p in problems:
        if p.flag in ("--speculative-algorithm", "SGLANG_ENABLE_SPEC_V2"):
            continue
        code = (
            "flag.abbreviation"
            if "abbreviation" in p.message
            else "flag.deprecated"
            if "deprecated" in p.message
            else "flag.removed"
            if "removed" in p.message
            else "flag.invalid"
        )
        why = (
            f"argparse of sglang {version} exits with rc 2 on it (unrecognized argument / invalid choice)"
            if p.severity == "error"
            else f"sglang {version} accepts it, but it can hide a typo or go away in a later release"
        )
        out.append(Finding(p.severity, "engine", p.message, why, p.fix, code, profile))
    if not any(f.severity == "error" for f in out):
        out.append(
            Finding(
                "ok",
                "engine",
                f"every rendered flag is known to sglang {version} (our catalogue)",
                "no unknown, removed or ambiguous flags",
                "",
                "flag.catalog_ok",
                profile,
            )
        )
    return out


def migration_findings(profile: str, version: str, migrations: Iterable[Migration]) -> list[Finding]:
    """Flags the config still writes the old way; `render` rewrites them for `version`."""
    out: list[Finding] = []
    for m in migrations:
        old_flag = m.old.split()[0]
        if m.new:
            what = f"{old_flag} is not a flag of sglang {version}: replaced by {m.new}"
            fix = f"write `{m.new}` in the config instead of `{m.old}`"
        else:
            what = f"{old_flag} does nothing on sglang {version}: dropped"
            fix = f"remove `{m.old}` from the config"
        out.append(
            Finding(
                "warning",
                "engine",
                what,
                f"{m.note} (changed in sglang {m.since}). Started as written, sglang would exit with rc 2 "
                "('unrecognized arguments'); the supervisor renders the replacement for you",
                fix,
                "flag.renamed",
                profile,
            )
        )
    return out


def parser_findings(profile: str, result: Mapping[str, Any] | None, version: str | None) -> list[Finding]:
    """One profile's verdict from `engine/argcheck.py` (the real parser in the engine's interpreter)."""
    if result is None:
        return []
    out: list[Finding] = []
    if result.get("error"):
        out.append(
            Finding(
                "error",
                "engine",
                f"the real sglang {version or ''} parser rejects this profile",
                str(result["error"]),
                "fix the flag it names",
                "parser.error",
                profile,
            )
        )
    unknown = [t for t in result.get("unknown") or [] if isinstance(t, str)]
    if unknown:
        out.append(
            Finding(
                "error",
                "engine",
                "the real sglang parser does not know: " + " ".join(unknown),
                "sglang would exit with rc 2: 'unrecognized arguments'",
                "remove or rename those flags (see the catalogue findings for replacements)",
                "parser.unknown",
                profile,
            )
        )
    for short, full in (result.get("abbreviations") or {}).items():
        out.append(
            Finding(
                "warning",
                "engine",
                f"{short} is accepted only as an abbreviation" + (f" of {full}" if full else ""),
                "argparse expands unique prefixes silently; a typo can hide the same way",
                f"write {full or 'the full option'}",
                "parser.abbreviation",
                profile,
            )
        )
    if not out:
        out.append(
            Finding(
                "ok",
                "engine",
                f"the real sglang {version or ''} parser accepts this profile",
                "ServerArgs.add_cli_args + parse_known_args found no unknown flag",
                "",
                "parser.ok",
                profile,
            )
        )
    return out



