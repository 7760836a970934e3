"""The upgrade canary's verdict (issue 24): a candidate SGLang release, started with the current
release's last-good profile, is promoted only when its READY probe measures within tolerance of
the current release's remembered reference on the same prompts; otherwise the lifecycle rolls back
to the current release (the reload rollback of `core/lifecycle_change.py`).

Fidelity is the fidelity check's (core/fidelity.py, shell/checks/fidelitycheck.py): the candidate's
answers against the model's reference (keyed by model, tokenizer and dtype, not by release, so the
reference taken on the current release judges the candidate). A verdict carries `fidelity`:
"pass", "fail" (rejected, even when faster), "not_checked" (fidelity disabled, or no reference for
these weights: judged on speed alone) or "unavailable" (the sample could not be taken, even on a
second try: rejected too, since a candidate that cannot show its answers cannot prove itself).
"""

from __future__ import annotations

from dataclasses import dataclass

FIDELITY_NOT_CHECKED = "not_checked"
FIDELITY_PASSED = "pass"
FIDELITY_FAIL = "fail"
FIDELITY_UNAVAILABLE = "unavailable"
FIDELITY_WORDS = (FIDELITY_PASSED, FIDELITY_FAIL, FIDELITY_NOT_CHECKED, FIDELITY_UNAVAILABLE)
MAX_FIDELITY_DETAIL = 300  # the mismatch's prompt, expected and received texts, in the reason


@dataclass(frozen=True)
class Reference:
    """What the current release measured at its last READY probe for `profile`."""

    version: str
    profile: str
    tok_s: float | None
    ttft_s: float | None = None


@dataclass(frozen=True)
class CanaryPlan:
    current: str  # the serving release
    candidate: str  # the release on trial
    python: str  # the candidate's interpreter
    reference: Reference | None
    min_tps_ratio: float = 0.98
    max_ttft_ratio: float = 1.10
    rollback_possible: bool = True  # False: an in-place upgrade, the old release is gone


@dataclass(frozen=True)
class Verdict:
    promote: bool
    reason: str
    tok_s: float | None
    ttft_s: float | None
    reference_tok_s: float | None
    reference_ttft_s: float | None
    tps_ratio: float | None
    ttft_ratio: float | None
    fidelity: str = FIDELITY_NOT_CHECKED

    @property
    def word(self) -> str:
        return "promoted" if self.promote else "rolled_back"

    def to_json(self) -> dict[str, object]:
        return {"verdict": self.word, "reason": self.reason, "tok_s": _r(self.tok_s),
                "ttft_s": _r(self.ttft_s, 4), "reference_tok_s": _r(self.reference_tok_s),
                "reference_ttft_s": _r(self.reference_ttft_s, 4),
                "tps_ratio": _r(self.tps_ratio, 4), "ttft_ratio": _r(self.ttft_ratio, 4),
                "fidelity": self.fidelity}


def mismatch_detail(reason: str, detail: str, prompt: str | None, expected: str | None,
                    received: str | None) -> str:
    """What a fidelity mismatch names in a canary's reason: the statistic that failed, and the
    prompt with the expected and received texts (already bounded and redacted by
    core/fidelity.judge), cut to MAX_FIDELITY_DETAIL."""
    text = f"{reason}: {detail}" if detail else reason
    if prompt:
        text += f"; prompt {prompt[:80]!r}: expected {(expected or '')[:80]!r}, " \
                f"received {(received or '')[:80]!r}"
    return text[:MAX_FIDELITY_DETAIL]


def _r(v: float | None, digits: int = 2) -> float | None:
    return None if v is None else round(v, digits)


def _ratio(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old <= 0:
        return None
    return new / old


def judge(plan: CanaryPlan, tok_s: float | None, ttft_s: float | None,
          fidelity: str = FIDELITY_NOT_CHECKED, fidelity_detail: str = "") -> Verdict:
    """Promote when fidelity passed or was not checked, decode tok/s is at least `min_tps_ratio`
    of the reference, and TTFT (when both sides measured it) at most `max_ttft_ratio` of it.
    Fidelity comes first: wrong answers are not redeemed by speed. `fidelity_detail` (what
    differed, or why no sample) goes into the reason, bounded."""
    if fidelity not in FIDELITY_WORDS:
        fidelity = FIDELITY_UNAVAILABLE  # a word this judge does not know proves nothing
    detail = fidelity_detail[:MAX_FIDELITY_DETAIL]
    ref = plan.reference
    ref_tps = ref.tok_s if ref is not None else None
    ref_ttft = ref.ttft_s if ref is not None else None
    tps_ratio, ttft_ratio = _ratio(tok_s, ref_tps), _ratio(ttft_s, ref_ttft)

    def verdict(promote: bool, reason: str) -> Verdict:
        return Verdict(promote, reason, tok_s, ttft_s, ref_tps, ref_ttft, tps_ratio, ttft_ratio,
                       fidelity)

    if fidelity == FIDELITY_FAIL:
        return verdict(False, "fidelity: the candidate's answers differ from the model's reference"
                              f"{': ' + detail if detail else ''}")
    if fidelity == FIDELITY_UNAVAILABLE:
        return verdict(False, "fidelity: the candidate's sample could not be taken"
                              f"{' (' + detail + ')' if detail else ''}, so it cannot show that its "
                              "answers match the model's reference")
    if ref_tps is None:
        return verdict(True, f"no tok/s of SGLang {plan.current} is remembered to compare with: "
                             "promoted on a successful start alone")
    if tok_s is None or tps_ratio is None:
        return verdict(False, "the candidate's READY probe measured no tok/s")
    if tps_ratio < plan.min_tps_ratio:
        return verdict(False, f"decode {tok_s:.1f} tok/s is {tps_ratio:.3f} of SGLang "
                              f"{plan.current}'s {ref_tps:.1f} (upgrade.min_tps_ratio "
                              f"{plan.min_tps_ratio:g})")
    if ttft_ratio is not None and ttft_ratio > plan.max_ttft_ratio:
        return verdict(False, f"TTFT {ttft_s:.3f} s is {ttft_ratio:.3f} of SGLang {plan.current}'s "
                              f"{ref_ttft:.3f} s (upgrade.max_ttft_ratio {plan.max_ttft_ratio:g})")
    return verdict(True, f"decode {tok_s:.1f} tok/s is {tps_ratio:.3f} of SGLang {plan.current}'s "
                         f"{ref_tps:.1f} (upgrade.min_tps_ratio {plan.min_tps_ratio:g})")
