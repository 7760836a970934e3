from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
SGLANG_0517 = FIXTURES / "sglang-0.5.17-h200"

# `tests` is not a package; make `from tiers import require` work from every tier's folder.
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


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
