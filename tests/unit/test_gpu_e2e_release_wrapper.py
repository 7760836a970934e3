"""scripts/gpu/e2e_scenarios/canary.py's interpreter wrappers for the canary scenario (issue 24):
each one must put exactly one SGLang release on PYTHONPATH, whatever the caller's PYTHONPATH
holds, because the supervisor's version detection and the engine both run through it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import gpu_scripts

SHOW = "import os; print(os.environ.get('PYTHONPATH', '<unset>')); print(os.environ.get('MARK', ''))"


@pytest.fixture(scope="module")
def e2e() -> ModuleType:
    return gpu_scripts.load("e2e_scenarios.canary")


def run(python: str, pythonpath: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([python, "-c", SHOW], capture_output=True, text=True, env=env,
                         timeout=60, check=True)
    return out.stdout.splitlines()


def test_the_old_release_comes_first_once(e2e: ModuleType, tmp_path: Path) -> None:
    text = e2e.release_wrapper(sys.executable, ["/tmp/site16"], ["/tmp/site16"], ["export MARK=16"])
    python = e2e.write_wrapper(tmp_path / "rel16" / "bin", text)
    assert python.endswith("/bin/python") and os.access(python, os.X_OK)
    assert run(python, "/d:/tmp/site16:/tmp/site") == ["/tmp/site16:/d:/tmp/site", "16"]
    assert run(python, None) == ["/tmp/site16", "16"]


def test_the_new_release_never_sees_the_old_site(e2e: ModuleType, tmp_path: Path) -> None:
    python = e2e.write_wrapper(tmp_path / "rel17" / "bin",
                               e2e.release_wrapper(sys.executable, [], ["/tmp/site16"]))
    assert run(python, "/tmp/site16:/a b:/tmp/site:/tmp/site16") == ["/a b:/tmp/site", ""]
    assert run(python, "/tmp/site16") == ["", ""]
    # a prefix of the old site is another directory: kept
    assert run(python, "/tmp/site16x:/tmp/site") == ["/tmp/site16x:/tmp/site", ""]
