"""`sglang-supervisor status`: one row per model from its unit state and its `/status` document,
readable at a glance in a terminal and stable as JSON.

The document is another process's answer: every field is read defensively (a missing or odd
field shows as unknown, never a traceback)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COLUMNS = ("model", "unit", "state", "profile", "tok/s", "below best", "last failure", "gateway", "code")


def _num(doc: Mapping[str, Any], key: str) -> float | None:
    value = doc.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    return value if isinstance(value, str) else None


def duration(seconds: float | None) -> str:
    if seconds is None or seconds <= 0:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def model_row(name: str, unit: str, unit_state: str, doc: Mapping[str, Any] | None, *,
              problem: str | None, best: str | None) -> dict[str, Any]:
    """The stable JSON shape of one model (the table prints the same fields)."""
    row: dict[str, Any] = {"model": name, "unit": unit, "unit_state": unit_state,
                           "reachable": doc is not None,
                           "problem": problem, "phase": None, "profile": None, "best_profile": best,
                           "on_best": None, "tok_s": None, "below_best_seconds": None,
                           "last_failure": None, "gateway_registered": None, "code_stale": None}
    if doc is None:
        return row
    profile = _text(doc, "profile")
    row.update(phase=_text(doc, "phase"), profile=profile, tok_s=_num(doc, "tok_s"),
               below_best_seconds=_num(doc, "below_best_profile_seconds"),
               on_best=None if profile is None or best is None else profile == best)
    stale = doc.get("code_stale")
    row["code_stale"] = stale if isinstance(stale, bool) else None
    attempts = doc.get("attempts")
    if isinstance(attempts, list):
        failed = [a for a in attempts if isinstance(a, dict) and isinstance(a.get("failure_class"), str)]
        if failed:
            last = failed[-1]
            row["last_failure"] = {"profile": last.get("profile") if isinstance(last.get("profile"), str)
                                   else None, "failure_class": last["failure_class"]}
    gateway = doc.get("gateway")
    if isinstance(gateway, dict) and isinstance(gateway.get("registered"), bool):
        row["gateway_registered"] = gateway["registered"]
    return row


def _cells(row: Mapping[str, Any]) -> list[str]:
    profile = row["profile"] or "-"
    if row["on_best"] is False:
        profile += f" (best: {row['best_profile']})"
    failure = row["last_failure"]
    stale = row["code_stale"]
    state = row["phase"] or ("unreachable" if row["unit_state"] == "active" else "-")
    return [
        row["model"], f"{row['unit']} {row['unit_state']}", state, profile,
        f"{row['tok_s']:.1f}" if row["tok_s"] is not None else "-",
        duration(row["below_best_seconds"]),
        f"{failure['failure_class']} ({failure['profile']})" if failure else "-",
        {True: "registered", False: "not registered", None: "-"}[row["gateway_registered"]],
        {True: "STALE: restart to run the installed code", False: "current", None: "-"}[stale],
    ]


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    grid = [list(COLUMNS), *(_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in grid) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in grid]
    notes = [f"  {r['model']}: {r['problem']}" for r in rows if r["problem"]]
    return "\n".join(lines + notes)
