"""The run's last lines (tests/tiersummary.py): per tier what ran, what skipped and why with the fix,
and a verdict that a skipped, unselected or failed tier cannot pass for a full run."""

from __future__ import annotations

from tiers import FIX_SEP
from tiersummary import TIERS, Result, merge, skip_reason, split_fix, summarize, tier_of

FIX = "run scripts/test as root"


def every_tier_passed() -> list[Result]:
    return [Result(t, "passed") for t in TIERS]


def line_of(lines: list[str], tier: str) -> str:
    return next(ln for ln in lines if ln.startswith(tier + " "))


def test_every_tier_passed_is_a_full_run() -> None:
    s = summarize(every_tier_passed())
    assert s.full
    assert s.lines[-1] == "full run: every tier ran"
    assert all(line_of(s.lines, t).split()[1] == "ran" for t in TIERS)


def test_a_tier_all_skipped_for_a_prerequisite_is_named_with_its_reason_and_fix() -> None:
    results = [r for r in every_tier_passed() if r.tier != "system"]
    results += [Result("system", "skipped", f"dh_virtualenv missing{FIX_SEP}{FIX}")] * 30
    s = summarize(results)
    assert not s.full
    assert line_of(s.lines, "system").split()[1:] == ["SKIPPED", "30", "skipped"]
    at = s.lines.index(line_of(s.lines, "system"))
    assert s.lines[at + 1].strip() == "30 skipped: dh_virtualenv missing"
    assert s.lines[at + 2].strip() == f"fix: {FIX}"
    assert s.lines[-1].startswith("NOT A FULL RUN: system SKIPPED")


def test_a_prerequisite_skip_beside_passes_is_partial_a_skip_by_design_is_not() -> None:
    by_design = [*every_tier_passed(), Result("unit", "skipped", "root reads everything")]
    s = summarize(by_design)
    assert s.full and line_of(s.lines, "unit").split()[1] == "ran"
    assert "    1 skipped: root reads everything" in s.lines
    missing = [*every_tier_passed(), Result("unit", "skipped", f"promtool not installed{FIX_SEP}{FIX}")]
    s = summarize(missing)
    assert not s.full and line_of(s.lines, "unit").split()[1] == "PARTIAL"


def test_deselected_uncollected_and_failed_tiers_are_not_a_full_run() -> None:
    results = [Result("unit", "passed"), Result("integration", "failed"), Result("integration", "passed"),
               Result("system", "passed"), Result("compat", "deselected")]
    s = summarize(results)
    assert line_of(s.lines, "integration").split()[1] == "FAILED"
    assert line_of(s.lines, "compat").startswith("compat       not selected")
    assert line_of(s.lines, "fleet").startswith("fleet        not collected")
    assert s.lines[-1].startswith(
        "NOT A FULL RUN: integration FAILED, compat not selected, fleet not collected")


def test_an_expected_failure_counts_as_run_and_is_shown_apart() -> None:
    s = summarize([*every_tier_passed(), Result("fleet", "xfailed")])
    assert s.full
    assert line_of(s.lines, "fleet").split()[1:] == ["ran", "1", "passed,", "1", "xfailed"]
    assert line_of(summarize([Result("unit", "xfailed")]).lines, "unit").split()[1] == "ran"


def test_collection_errors_spoil_a_full_run() -> None:
    s = summarize(every_tier_passed(), collect_errors=2)
    assert not s.full
    assert "2 collection error(s)" in s.lines[-2]


def test_collect_only_says_nothing_ran() -> None:
    s = summarize([Result("unit", "collected"), Result("fleet", "deselected")], collect_only=True)
    assert not s.full
    assert line_of(s.lines, "unit").split()[1:] == ["collected", "1", "collected"]
    assert line_of(s.lines, "fleet").split()[1:3] == ["not", "selected"]
    assert s.lines[-1] == "collect only: no test ran"


def test_the_header_says_when_a_missing_prerequisite_fails() -> None:
    assert "SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS=1" in summarize([], require_all=True).lines[0]
    assert summarize([]).lines[0] == "tiers"


def test_reasons_beyond_the_shown_few_are_counted_and_prerequisites_come_first() -> None:
    results = [Result("unit", "passed")] + [Result("unit", "skipped", f"by design {i}") for i in range(6)]
    results.append(Result("unit", "skipped", f"needs a package{FIX_SEP}{FIX}"))
    lines = summarize(results).lines
    at = lines.index(line_of(lines, "unit"))
    assert lines[at + 1].strip() == "1 skipped: needs a package"
    assert "3 skipped for 3 other reasons" in lines[at + 6]


def test_a_multiline_reason_shows_its_first_line_only() -> None:
    reason = f"cannot install sglang: ERROR: no network\nmore{FIX_SEP}{FIX}"
    lines = summarize([Result("compat", "skipped", reason)]).lines
    assert "    1 skipped: cannot install sglang: ERROR: no network" in lines
    assert not any(ln.strip() == "more" for ln in lines)


def test_tier_of_reads_the_markers() -> None:
    assert tier_of([]) == "unit"
    assert tier_of(["timeout", "integration"]) == "integration"
    assert tier_of(["fleet", "timeout"]) == "fleet"


def test_merge_keeps_the_worst_phase() -> None:
    passed, skipped = Result("unit", "passed"), Result("unit", "skipped", "x")
    failed = Result("unit", "failed")
    assert merge(None, passed) == passed
    assert merge(passed, failed) == failed  # a teardown error after a passing call
    assert merge(failed, passed) == failed
    assert merge(skipped, passed) == skipped


def test_skip_text_parsing() -> None:
    assert skip_reason("Skipped: promtool not installed") == "promtool not installed"
    assert split_fix(f"promtool not installed{FIX_SEP}{FIX}") == ("promtool not installed", FIX)
    assert split_fix("root reads everything") == ("root reads everything", "")
