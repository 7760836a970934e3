"""Tier prerequisites: skip with a reason locally, fail in CI.

CI sets SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS=1 after installing every prerequisite, so a tier that
silently skipped there would hide a broken install step.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REQUIRE_ALL = os.environ.get("SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS") == "1"


def require(condition: bool, reason: str) -> None:
    """Skip the calling test (or fixture) unless `condition`; under CI, fail instead."""
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"prerequisite missing in CI (SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS=1): {reason}")
    pytest.skip(reason)


def cache_dir(tier: str) -> Path:
    """Where a tier keeps the venvs it builds from PyPI (the real sglang wheels, the gateway):
    outside the checkout, so a fresh clone on the same machine (CI's) reuses them instead of
    rebuilding gigabytes. $SGLANG_SUPERVISOR_TEST_CACHE overrides; else the XDG cache directory."""
    base = os.environ.get("SGLANG_SUPERVISOR_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sglang-supervisor-tests")
    return Path(base) / tier


def run_install(cmd: list[str], timeout_s: float) -> tuple[bool, str]:
    """Run a venv/pip step of a tier's cached environment: (ok, the last lines of its output)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{cmd[0]}: {e}"
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
    return proc.returncode == 0, tail
