"""Fixtures of the system tier: the Debian package (built once, cached under packaging/out/) and
a booted systemd sandbox with that package installed (purged again at the end).

The sandbox shares the host's file system: installing the package installs it on this machine.
That is what CI (root, throwaway) is for; the fixtures purge it again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from system.sandbox import Sandbox, allow_service_actions, unavailable_reason
from tiers import SANDBOX_FIX, group_fix, require

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "packaging" / "out"
# what goes into the package: a change here means a rebuild
PACKAGE_INPUTS = ("pyproject.toml", "daemon", "units", "etc/sglang-supervisor", "packaging/debian",
                  "packaging/build-deb", "docs/OPERATIONS.md")  # fmt: skip
PACKAGE = "sglang-supervisor"


def _source_digest() -> str:
    h = hashlib.sha256()
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *PACKAGE_INPUTS],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    for name in sorted(f for f in files if f):
        path = REPO / name.decode()
        if path.is_file():
            h.update(name + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def build_deb() -> Path:
    """packaging/build-deb, unless packaging/out/ holds a package built from these sources."""
    for tool in ("dpkg-buildpackage", "dh_virtualenv", "lintian"):
        require(shutil.which(tool) is not None,
                f"{tool} missing: packaging/build-deb cannot build the package", group_fix("build"))
    digest = _source_digest()
    stamp = OUT / "sources.sha256"
    debs = sorted(OUT.glob(f"{PACKAGE}_*.deb"))
    if stamp.exists() and stamp.read_text().strip() == digest and len(debs) == 1:
        return debs[0]
    for old in debs:
        old.unlink()
    proc = subprocess.run([str(REPO / "packaging" / "build-deb")], capture_output=True, text=True,
                          check=False, timeout=900)
    assert proc.returncode == 0, f"build-deb failed:\n{proc.stdout}\n{proc.stderr[-5000:]}"
    deb = Path(proc.stdout.strip().splitlines()[-1])
    assert deb.is_file(), proc.stdout
    stamp.write_text(digest + "\n")
    return deb


@pytest.fixture(scope="session")
def deb() -> Path:
    return build_deb()


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    reason = unavailable_reason()
    require(reason is None, f"systemd sandbox unavailable: {reason}", SANDBOX_FIX)
    box = Sandbox(f"sglang-systest-{os.getpid()}")
    box.up()
    try:
        allow_service_actions(box)
        yield box
    finally:
        box.down()


def purge(box: Sandbox) -> None:
    box.run("dpkg", "--purge", PACKAGE, check=False, timeout=300)


def _user_exists(box: Sandbox, user: str) -> bool:
    return box.run("id", user, check=False).returncode == 0


@pytest.fixture(scope="session")
def installed(sandbox: Sandbox, deb: Path) -> Iterator[Sandbox]:
    """The package installed inside the running systemd (its maintainer scripts see systemd)."""
    # Purge keeps the system user (Debian practice); the host gets rid of one the tests created.
    had_user = _user_exists(sandbox, "sglang")
    sandbox.run("dpkg", "-i", str(deb), timeout=300)
    try:
        yield sandbox
    finally:
        purge(sandbox)
        if not had_user and _user_exists(sandbox, "sglang"):
            sandbox.run("userdel", "sglang", check=False)
            sandbox.run("groupdel", "sglang", check=False)
