"""doctor's report: its findings and the facts behind them (host, engine, live server), as JSON
(`--json`) or as the text a person reads, grouped by area and profile."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sglang_supervisor.core import audit
from sglang_supervisor.core.audit import Finding

_MARK = {"error": "ERROR", "warning": "WARN ", "info": "info ", "ok": "ok   "}
_AREA_TITLE = {"host": "Host", "engine": "Engine", "audit": "Audit", "live": "Live server"}


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    host: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    live: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "findings": [f.to_dict() for f in audit.sort_findings(self.findings)],
            "host": self.host,
            "engine": self.engine,
        }
        if self.live is not None:
            out["live"] = self.live
        out["errors"] = sum(1 for f in self.findings if f.severity == "error")
        return out


def format_human(report: Report) -> str:
    lines: list[str] = []
    findings = audit.sort_findings(report.findings)
    for area in audit.AREAS:
        group = [f for f in findings if f.area == area]
        if not group:
            continue
        lines.append(f"== {_AREA_TITLE[area]}")
        profile: str | None = None
        for f in group:
            if f.profile != profile and f.profile is not None:
                lines.append(f"  -- profile {f.profile}")
            profile = f.profile
            indent = "    " if f.profile else "  "
            lines.append(f"{indent}{_MARK[f.severity]} {f.what}")
            if f.why:
                lines.append(f"{indent}      why: {f.why}")
            if f.fix:
                lines.append(f"{indent}      fix: {f.fix}")
        lines.append("")
    counts = {s: sum(1 for f in findings if f.severity == s) for s in audit.SEVERITIES}
    lines.append(
        f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} note(s), "
        f"{counts['ok']} ok"
    )
    return "\n".join(lines)
