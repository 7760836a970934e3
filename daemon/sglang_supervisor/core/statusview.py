"""`sglang-supervisor status`: one row per model from its unit state and its `/status` document,
readable at a glance in a terminal and stable as JSON.

The document is another process's answer: every field is read defensively (a missing or odd
field shows as unknown, never a traceback)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COLUMNS = ("model", "unit", "state", "profile", "tok/s", "vs baseline", "below best", "last failure",
           "gateway", "GPUs", "code")
ROW_KEYS = ("model", "unit", "unit_state", "reachable", "problem", "phase", "profile", "best_profile",
            "on_best", "tok_s", "baseline_tok_s", "tok_s_ratio", "below_best_seconds", "last_failure",
            "way_back", "gateway_registered", "gpus", "code_stale")
GIB = 1 << 30


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
    row: dict[str, Any] = dict.fromkeys(ROW_KEYS)
    row.update(model=name, unit=unit, unit_state=unit_state, reachable=doc is not None, problem=problem,
               best_profile=best)
    if doc is None:
        return row
    throughput = doc.get("throughput")
    if isinstance(throughput, dict):
        row.update(baseline_tok_s=_num(throughput, "baseline_tps"), tok_s_ratio=_num(throughput, "ratio"))
    row["way_back"] = _way_back(doc.get("way_back"))
    row["gpus"] = _gpus(doc.get("gpus"))
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
            row["last_failure"] = {"profile": _text(last, "profile"), "failure_class": last["failure_class"],
                                   "line": _text(last, "failure_line")}
    gateway = doc.get("gateway")
    if isinstance(gateway, dict) and isinstance(gateway.get("registered"), bool):
        row["gateway_registered"] = gateway["registered"]
    return row


def _way_back(plan: Any) -> dict[str, Any] | None:
    """/status's way back: the profile on probation and when each profile in back-off returns."""
    if not isinstance(plan, dict):
        return None
    retry = plan.get("retry_at")
    return {"last_good": _text(plan, "last_good"), "probation": _text(plan, "probation"),
            "retry_at": {str(k): float(v) for k, v in retry.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if isinstance(retry, dict) else {}}


def _gpus(gpus: Any) -> list[dict[str, Any]] | None:
    if not isinstance(gpus, list):
        return None
    return [{"index": g["index"], "engine_bytes": _num(g, "engine_bytes"),
             "memory_used_bytes": _num(g, "memory_used_bytes"),
             "memory_total_bytes": _num(g, "memory_total_bytes")}
            for g in gpus if isinstance(g, dict) and isinstance(g.get("index"), int)]


def _gpu_cell(gpus: list[dict[str, Any]] | None) -> str:
    if not gpus:
        return "-"
    def one(g: Mapping[str, Any]) -> str:
        used, total = g["memory_used_bytes"], g["memory_total_bytes"]
        mem = f"{used / GIB:.0f}/{total / GIB:.0f} GiB" if used is not None and total is not None else "?"
        return f"{g['index']}:{mem}"
    return " ".join(one(g) for g in gpus)


def _notes(row: Mapping[str, Any], now: float) -> list[str]:
    """Under the table: what does not fit a cell (the failing line, the way back, a problem)."""
    notes = [f"  {row['model']}: {row['problem']}"] if row["problem"] else []
    failure = row["last_failure"]
    if failure and failure["line"]:
        notes.append(f"  {row['model']}: {failure['failure_class']}: {failure['line']}")
    plan = row["way_back"]
    if plan and row["on_best"] is False:
        waits = ", ".join(f"{p} in {duration(at - now)}" if at > now else f"{p} now"
                          for p, at in sorted(plan["retry_at"].items(), key=lambda kv: kv[1]))
        back = (f"probation of {plan['probation']} on this start" if plan["probation"]
                else f"next tries: {waits}" if waits else "the best profile is tried at the next start")
        notes.append(f"  {row['model']}: way back: {back}")
    return notes


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
        f"{row['tok_s_ratio']:.0%} of {row['baseline_tok_s']:.1f}"
        if row["tok_s_ratio"] is not None and row["baseline_tok_s"] is not None else "-",
        duration(row["below_best_seconds"]),
        f"{failure['failure_class']} ({failure['profile']})" if failure else "-",
        {True: "registered", False: "not registered", None: "-"}[row["gateway_registered"]],
        _gpu_cell(row["gpus"]),
        {True: "STALE: restart to run the installed code", False: "current", None: "-"}[stale],
    ]


def table(rows: Sequence[Mapping[str, Any]], now: float) -> str:
    grid = [list(COLUMNS), *(_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in grid) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in grid]
    notes = [n for r in rows for n in _notes(r, now)]
    return "\n".join(lines + notes)
