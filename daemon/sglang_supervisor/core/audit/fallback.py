"""The running supervisor's /status: whether the live server runs below the best profile of the
ladder, and the failures that put it there; its last output-fidelity check and speculative
acceptance against the baseline."""

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


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def fidelity_findings(status: Any) -> list[Finding]:
    """The supervisor's /status -> the last output-fidelity check, and the speculative accept
    length of the live probes against this start's baseline (a collapse names the draft path)."""
    if not isinstance(status, dict):
        return []
    out: list[Finding] = []
    fid = status.get("fidelity")
    last = fid.get("last_check") if isinstance(fid, dict) else None
    if isinstance(last, dict) and last.get("result") == "mismatch":
        out.append(Finding(
            "error", "live",
            f"profile {last.get('profile')} failed output fidelity ({last.get('reason')}): "
            f"{str(last.get('detail'))[:200]}",
            f"prompt {last.get('prompt')!r}: expected {last.get('expected')!r}, got {last.get('received')!r}"
            if last.get("prompt") else "against the model's reference (sglang-supervisor fidelity)",
            "docs/OPERATIONS.md 'Output fidelity': one profile failing is its kernels, every profile "
            "failing is the weights on disk (or a new model: fidelity --reset)",
            "live.fidelity"))
    elif isinstance(last, dict) and last.get("result") == "pass":
        raw = last.get("stats")
        stats: dict[str, Any] = raw if isinstance(raw, dict) else {}
        out.append(Finding("ok", "live", f"outputs agree with the model's reference (profile "
                           f"{last.get('profile')}, {stats.get('min_prefix')} greedy tokens, "
                           f"log-prob difference {stats.get('logprob_mean_abs_diff')})", "", "",
                           "live.fidelity"))
    thr = status.get("throughput")
    if isinstance(thr, dict):
        now, base = _number(thr.get("spec_accept_length")), _number(thr.get("baseline_spec_accept_length"))
        if now is not None and base is not None and base > 1.0 and (now - 1.0) < 0.5 * (base - 1.0):
            out.append(Finding(
                "warning", "live",
                f"speculative acceptance collapsed: accept length {now:.2f} against {base:.2f} at "
                "this start's baseline",
                "the draft path accepts far fewer tokens on the same probe: a slowdown from it is "
                "the draft model or its kernels, not the GPU",
                "restart the unit (the ready gate's fidelity check compares the accept length with "
                "the same weights' own); if it persists, use a profile without speculative decoding",
                "live.accept_collapse"))
    return out
