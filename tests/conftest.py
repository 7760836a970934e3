from __future__ import annotations

import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import structlog

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
SGLANG_0517 = FIXTURES / "sglang-0.5.17-h200"

# `tests` is not a package; make `from tiers import require` work from every tier's folder.
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import tiers  # noqa: E402  (needs the path above)
from tiersummary import Result, merge, skip_reason, summarize, tier_of  # noqa: E402


class TierSummary:
    """Records each test's outcome per tier and prints tiersummary's lines after pytest's own
    final line, so that they are the run's last: the verdict cannot scroll away."""

    def __init__(self) -> None:
        self.tier: dict[str, str] = {}
        self.results: dict[str, Result] = {}
        self.deselected: list[Result] = []
        self.collect_errors = 0

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        self.tier[item.nodeid] = tier_of(m.name for m in item.iter_markers())

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += [Result(tier_of(m.name for m in i.iter_markers()), "deselected") for i in items]

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collect_errors += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = self.tier.get(report.nodeid, "unit")
        if report.failed:
            phase = Result(tier, "failed")
        elif report.skipped and hasattr(report, "wasxfail"):  # failed as expected: it ran
            phase = Result(tier, "xfailed")
        elif report.skipped:
            longrepr = report.longrepr
            text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            phase = Result(tier, "skipped", skip_reason(text))
        elif report.when == "call":
            phase = Result(tier, "passed")
        else:
            return
        self.results[report.nodeid] = merge(self.results.get(report.nodeid), phase)

    # wrapper + tryfirst: the outermost wrapper, so this runs after the terminal reporter's
    # (its short summary and the "N passed" line)
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        result = yield
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return result
        collect_only = bool(session.config.option.collectonly)
        if collect_only:
            results = [Result(self.tier.get(i.nodeid, "unit"), "collected") for i in session.items]
        else:
            results = list(self.results.values())
        summary = summarize(results + self.deselected, require_all=tiers.REQUIRE_ALL,
                            collect_only=collect_only, collect_errors=self.collect_errors)
        reporter.write_sep("=", summary.lines[0], bold=True)
        for line in summary.lines[1:-1]:
            reporter.write_line(line)
        reporter.write_line(summary.lines[-1], bold=True, green=summary.full, red=not summary.full)
        return result


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierSummary(), "sglang-supervisor-tier-summary")


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def sglang_0517() -> Path:
    return SGLANG_0517


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Each test starts from structlog's defaults: commands under test (doctor, logsetup) configure
    structlog globally, and a filtering wrapper left behind hides warnings from a later test's
    structlog.testing.capture_logs() (which swaps processors, not the wrapper class)."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
