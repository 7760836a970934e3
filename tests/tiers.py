"""Tier prerequisites: skip with a reason locally, fail in CI.

CI sets SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS=1 after installing every prerequisite, so a tier that
silently skipped there would hide a broken install step. A skip carries its fix after FIX_SEP; the
run's last lines (tiersummary.py) print both per tier.

The Debian packages come from scripts/prereqs.txt, the one list that scripts/prereqs installs;
`apt_fix` refuses a package that is not on it, so a fix cannot name what scripts/test never installs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REQUIRE_ALL = os.environ.get("SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS") == "1"
PREREQS = Path(__file__).resolve().parents[1] / "scripts" / "prereqs.txt"
FIX_SEP = " -- fix: "
# the fixes that are not a Debian package
AS_ROOT = "run scripts/test as root"
PYPI = ("needs PyPI (pip) reachable; built once, then reused from the cache "
        "($SGLANG_SUPERVISOR_TEST_CACHE, default ~/.cache/sglang-supervisor-tests)")


def parse_prereqs(text: str) -> dict[str, str]:
    """scripts/prereqs.txt's `package group  # why` lines -> {package: group}, in file order
    (the format scripts/prereqs reads with sed and awk: '#' starts a comment)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2:
            out[fields[0]] = fields[1]
    return out


def debian_prereqs() -> dict[str, str]:
    return parse_prereqs(PREREQS.read_text())


def apt_fix(*packages: str) -> str:
    """The fix for a missing Debian package: scripts/test installs it as root, else the command."""
    unknown = sorted(set(packages) - set(debian_prereqs()))
    if unknown:
        raise ValueError(f"{unknown} not in {PREREQS}: add them to that list, which scripts/test installs")
    return f"{AS_ROOT} (it installs the packages of scripts/prereqs.txt), or: " \
           f"sudo apt-get install --no-install-recommends {' '.join(packages)}"


def group_fix(group: str) -> str:
    """apt_fix for every package of one group of scripts/prereqs.txt (e.g. "build")."""
    packages = [p for p, g in debian_prereqs().items() if g == group]
    if not packages:
        raise ValueError(f"no package of group {group!r} in {PREREQS}")
    return apt_fix(*packages)


SANDBOX_FIX = (f"{AS_ROOT} on Linux with cgroup2 and namespaces (a VM or a privileged container) whose "
               f"PID 1 is not systemd, with systemd's binaries installed: {apt_fix('systemd')}")


def require(condition: bool, reason: str, fix: str | None = None) -> None:
    """Skip the calling test (or fixture) unless `condition`; under CI, fail instead. `fix` is what
    makes it run: the run's per-tier summary prints it under the reason."""
    if condition:
        return
    text = reason if fix is None else f"{reason}{FIX_SEP}{fix}"
    if REQUIRE_ALL:
        pytest.fail(f"prerequisite missing in CI (SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS=1): {text}")
    pytest.skip(text)


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
