"""Tier prerequisites: skip with a reason locally, fail in CI.

CI sets SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS=1 after installing every prerequisite, so a tier that
silently skipped there would hide a broken install step.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_ALL = os.environ.get("SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS") == "1"


def require(condition: bool, reason: str) -> None:
    """Skip the calling test (or fixture) unless `condition`; under CI, fail instead."""
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"prerequisite missing in CI (SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS=1): {reason}")
    pytest.skip(reason)
