"""The running supervisor's /status: whether the live server runs below the best profile of the
ladder, and the failures that put it there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sglang_supervisor.core.audit.findings import Finding


def fallback_findings(status: Any, profile_names: Sequence[str]) -> list[Finding]:
    """The supervisor's /status -> whether the live server runs below its best profile, and why."""
    if not isinstance(status, dict) or not profile_names:
        return []
    profile = status.get("profile")
    if not isinstance(profile, str) or not profile:
        return []
    best = profile_names[0]
    if profile == best:
        return [Finding("ok", "live", f"the supervisor serves the best profile ({best})", "", "",
                        "live.profile")]
    level = profile_names.index(profile) if profile in profile_names else None
    why: list[str] = []
    for a in status.get("attempts") or []:
        if isinstance(a, dict) and a.get("failure_class") and a.get("profile") != profile:
            why.append(f"{a.get('profile')} failed ({a.get('failure_class')})")
    skipped = status.get("skipped_known_bad")
    if isinstance(skipped, dict) and skipped:
        why.append("skipped as known bad: " + ", ".join(str(k) for k in skipped))
    return [Finding(
        "warning", "live",
        f"the live server runs the fallback profile {profile}"
        + (f" (level {level} of the ladder)" if level is not None else "") + f", not {best}",
        "; ".join(why) or "an earlier start fell back (see journalctl -u the unit, EVENT=profile.fallback)",
        "find the cause (journalctl ... FAILURE_CLASS), fix it, then restart the unit to try the "
        "better profile again (sglang-supervisor run --retry-known-bad ignores remembered failures)",
        "live.fallback")]
