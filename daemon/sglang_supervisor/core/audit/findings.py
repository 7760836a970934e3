"""A doctor finding: what, why, the fix, a stable code, the profile it belongs to; their order and
the folding of findings every profile shares into one config-wide finding."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info", "ok"]
Area = Literal["host", "engine", "audit", "live"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info", "ok")
AREAS: tuple[Area, ...] = ("host", "engine", "audit", "live")



@dataclass(frozen=True, slots=True)
class Finding:
    severity: Severity
    area: Area
    what: str
    why: str
    fix: str = ""
    code: str = ""  # stable identifier, e.g. "graph.prefill.off" (tests, JSON consumers)
    profile: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {
            "severity": self.severity,
            "area": self.area,
            "code": self.code,
            "profile": self.profile,
            "what": self.what,
            "why": self.why,
            "fix": self.fix,
        }


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Stable order: area; config-wide findings before per-profile ones, profiles in the order
    they first appear (the config's ladder order); worst severity first; rule order kept within."""
    items = list(findings)
    first: dict[str | None, int] = {None: -1}
    for f in items:
        first.setdefault(f.profile, len(first))
    return sorted(items, key=lambda f: (AREAS.index(f.area), first[f.profile], SEVERITIES.index(f.severity)))


def collapse_common(findings: Iterable[Finding], profiles: Sequence[str]) -> list[Finding]:
    """A per-profile finding that every profile has, once, as a config-wide finding."""
    items = list(findings)
    if len(profiles) < 2:
        return items
    wanted = set(profiles)
    seen: dict[tuple[str, ...], set[str]] = {}
    for f in items:
        if f.profile is not None:
            seen.setdefault((f.severity, f.area, f.what, f.why, f.fix, f.code), set()).add(f.profile)
    common = {k for k, names in seen.items() if names >= wanted}
    out: list[Finding] = []
    emitted: set[tuple[str, ...]] = set()
    for f in items:
        key = (f.severity, f.area, f.what, f.why, f.fix, f.code)
        if f.profile is None or key not in common:
            out.append(f)
        elif key not in emitted:
            emitted.add(key)
            out.append(Finding(f.severity, f.area, f"{f.what} (every profile)", f.why, f.fix, f.code, None))
    return out


