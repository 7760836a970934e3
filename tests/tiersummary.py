"""The test run's last lines: per tier, whether it ran, skipped, failed or was not selected, each
skip reason with its fix, then one verdict. A green run with a skipped tier must not read as a
full one, and the reasons must not hide among two thousand lines of output.

Pure: conftest.py turns pytest's reports into `Result`s; `summarize` returns the lines. A skip
whose reason carries a fix (tiers.require's `fix`, after FIX_SEP) is a missing prerequisite and
makes its tier PARTIAL or SKIPPED; a skip without one is by design (e.g. "root reads everything")
and is listed without changing the tier's status.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from tiers import FIX_SEP

# the README's table, in its order; a test without a tier marker is a unit test
TIERS = ("unit", "integration", "system", "compat", "fleet")
Outcome = Literal["passed", "xfailed", "failed", "skipped", "deselected", "collected"]
# how bad one phase's outcome is for the test: a failure in any phase wins, then a skip
_RANK: dict[Outcome, int] = {"collected": 0, "deselected": 0, "passed": 1, "xfailed": 1, "skipped": 2,
                             "failed": 3}
REASONS_SHOWN = 4  # per tier; pytest's short summary (-ra) above lists every one
REASON_WIDTH = 160


@dataclass(frozen=True)
class Result:
    """One test's outcome; `reason` is a skip's reason, its fix (if any) after FIX_SEP."""

    tier: str
    outcome: Outcome
    reason: str = ""


@dataclass(frozen=True)
class Summary:
    lines: list[str]
    full: bool  # every tier ran, nothing failed, no prerequisite missing


def tier_of(markers: Iterable[str]) -> str:
    names = set(markers)
    return next((t for t in TIERS[1:] if t in names), "unit")


def merge(previous: Result | None, phase: Result) -> Result:
    """A test's phases (setup, call, teardown) -> its one result."""
    if previous is None or _RANK[phase.outcome] > _RANK[previous.outcome]:
        return phase
    return previous


def skip_reason(text: str) -> str:
    """pytest's "Skipped: why" -> "why"."""
    return text.removeprefix("Skipped: ").strip()


def split_fix(reason: str) -> tuple[str, str]:
    why, _, fix = reason.partition(FIX_SEP)
    return why.strip(), fix.strip()


def _one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else "(no reason given)"
    return first if len(first) <= REASON_WIDTH else first[: REASON_WIDTH - 3] + "..."


def _status(counts: Counter[str], prerequisite_skips: int, collect_only: bool) -> str:
    ran = counts["passed"] + counts["xfailed"] + counts["failed"] + counts["skipped"]
    if collect_only:
        return "collected" if counts["collected"] else ("not selected" if counts["deselected"] else "none")
    if counts["failed"]:
        return "FAILED"
    if ran == 0:
        return "not selected" if counts["deselected"] else "not collected"
    if counts["passed"] + counts["xfailed"] == 0:
        return "SKIPPED"
    return "PARTIAL" if prerequisite_skips else "ran"


def _counts_text(counts: Counter[str], collect_only: bool) -> str:
    order = ("collected", "deselected") if collect_only else (
        "passed", "xfailed", "failed", "skipped", "deselected")
    return ", ".join(f"{counts[k]} {k}" for k in order if counts[k])


def summarize(results: Iterable[Result], *, require_all: bool = False, collect_only: bool = False,
              collect_errors: int = 0) -> Summary:
    by_tier: dict[str, list[Result]] = {t: [] for t in TIERS}
    for r in results:
        by_tier.setdefault(r.tier, []).append(r)
    head = "tiers" + (" (SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS=1: a missing prerequisite fails)"
                      if require_all else "")
    lines = [head]
    statuses: dict[str, str] = {}
    for tier, rs in by_tier.items():
        counts = Counter(r.outcome for r in rs)
        reasons = Counter(split_fix(r.reason) for r in rs if r.outcome == "skipped")
        prerequisite_skips = sum(n for (_, fix), n in reasons.items() if fix)
        status = _status(counts, prerequisite_skips, collect_only)
        statuses[tier] = status
        lines.append(f"{tier:<12} {status:<13} {_counts_text(counts, collect_only)}".rstrip())
        # prerequisites first: those are what the reader can fix
        ranked = sorted(reasons.items(), key=lambda kv: (not kv[0][1], -kv[1]))
        for (why, fix), n in ranked[:REASONS_SHOWN]:
            lines.append(f"    {n} skipped: {_one_line(why)}")
            if fix:
                lines.append(f"      fix: {_one_line(fix)}")
        if len(ranked) > REASONS_SHOWN:
            rest = sum(n for _, n in ranked[REASONS_SHOWN:])
            lines.append(f"    {rest} skipped for {len(ranked) - REASONS_SHOWN} other reasons "
                         "(pytest's short summary above lists each)")
    if collect_errors:
        lines.append(f"{collect_errors} collection error(s): the tests of those files did not run")
    if collect_only:
        lines.append("collect only: no test ran")
        return Summary(lines, full=False)
    short = [f"{tier} {status}" for tier, status in statuses.items() if status != "ran"]
    if collect_errors:
        short.append("collection errors")
    if short:
        lines.append("NOT A FULL RUN: " + ", ".join(short)
                     + " (a full run has every tier 'ran'; the fixes are above)")
        return Summary(lines, full=False)
    lines.append("full run: every tier ran")
    return Summary(lines, full=True)
