"""doctor's view of the upgrade canary's memory (`state_dir/NAME.releases.json`, issue 24): the
releases remembered with their verdicts, an in-place upgrade (no way back), a promoted candidate
the configuration still names only as `engine.candidate.python`, a rolled-back candidate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_supervisor.core.audit.findings import Finding


def _s(v: object) -> str:
    return v if isinstance(v, str) else "?"


_FIX = ("fix the cause (upgrade --check shows the profiles), then sglang-supervisor upgrade "
        "--config FILE --retry; a changed venv is tried again by the next reload")
_FIDELITY_FIX = {
    "fail": "the candidate's outputs differ from the model's fidelity reference (taken on the "
            "current release): check the candidate's kernels and dtype before another trial; "
            "only if the reference itself is wrong, re-take it with sglang-supervisor fidelity "
            "--config FILE --reset, then sglang-supervisor upgrade --config FILE --retry",
    "unavailable": "the candidate could not answer the fidelity sample (twice): check its "
                   "journal and fidelity.timeout_s, then sglang-supervisor upgrade --config FILE "
                   "--retry",
}


def release_findings(book: Mapping[str, Any], candidate_python: str | None) -> list[Finding]:
    """The release memory as findings; `book` is the file's cleaned content (shell/upgrades)."""
    out: list[Finding] = []
    releases = [r for r in book.get("releases") or [] if isinstance(r, Mapping)]
    in_place = book.get("in_place")
    if isinstance(in_place, Mapping):
        out.append(Finding(
            "warning", "engine",
            f"SGLang was upgraded in place ({_s(in_place.get('from'))} -> "
            f"{_s(in_place.get('to'))}) in {_s(in_place.get('python'))}: verdict "
            f"{_s(in_place.get('verdict'))}",
            "an in-place pip install -U leaves no old release to roll back to; the old release's "
            "numbers stay in the release memory, marked old_release",
            "install the next release into a second venv and run sglang-supervisor upgrade "
            "--config FILE --to /opt/sglang-NEW/bin/python --check",
            "upgrade.in_place"))
    promoted = book.get("promoted")
    if isinstance(promoted, Mapping) and promoted.get("python") == candidate_python:
        out.append(Finding(
            "info", "engine",
            f"the promoted candidate SGLang {_s(promoted.get('version'))} "
            f"({_s(promoted.get('python'))}) serves",
            "the configuration still names it only as engine.candidate.python",
            "move engine.command to that venv and remove engine.candidate, then reload",
            "upgrade.promoted"))
    for r in releases[-10:]:
        numbers = ""
        if isinstance(r.get("tps_ratio"), float):
            numbers = f", tok/s ratio {r['tps_ratio']:.3f}"
        out.append(Finding(
            "info", "engine",
            f"release {_s(r.get('version'))} ({_s(r.get('python'))}) from {_s(r.get('from'))}: "
            f"{_s(r.get('verdict'))}{numbers}, fidelity {_s(r.get('fidelity'))}",
            _s(r.get("reason"))[:300], "", "upgrade.release"))
    last = releases[-1] if releases else None
    if last is not None and last.get("verdict") in ("rolled_back", "refused", "in_place_worse"):
        out.append(Finding(
            "warning", "engine",
            f"the last upgrade candidate SGLang {_s(last.get('version'))} was "
            f"{_s(last.get('verdict')).replace('_', ' ')}",
            _s(last.get("reason"))[:300],
            _FIDELITY_FIX.get(_s(last.get("fidelity")), _FIX),
            "upgrade.last_verdict"))
    return out
