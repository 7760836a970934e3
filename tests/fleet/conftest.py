"""Fleet tier: the real `sglang-router` wheel (the SGLang Model Gateway) and `kubernetes-validate`,
each in its own venv under ~/.cache/sglang-supervisor-tests/fleet/ (tiers.cache_dir: outside the
checkout, reused by clones; marked ready only after a complete install, so an interrupted build is
redone). Without network or wheels the tier skips, and fails
under SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS=1 (CI).

Measured here on 2 shared cores: router venv cold 40-60 s (sglang-router 0.3.2 and its few
dependencies, about 60 MB), kubernetes-validate venv cold about 30 s; warm runs reuse both.
Build times land in <cache>/fleet/build-times.json.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from tiers import PYPI, cache_dir, require, run_install

ROOT = Path(__file__).resolve().parents[2]
CACHE = cache_dir("fleet")
TIMES = CACHE / "build-times.json"
# The gateway's Python entry point and Rust core come in one abi3 wheel; pinned so that a new
# release with another worker API is a deliberate change (gateway.py documents what it expects).
ROUTER = "sglang-router==0.3.2"
K8S_VALIDATE = "kubernetes-validate==1.37.0"
INSTALL_TIMEOUT_S = 900


def _run(cmd: list[str]) -> tuple[bool, str]:
    return run_install(cmd, INSTALL_TIMEOUT_S)


def venv(name: str, packages: list[str]) -> tuple[Path | None, str]:
    path = CACHE / name
    python = path / "bin" / "python"
    marker = path / ".ready"
    stamp = " ".join(packages)
    if marker.exists() and marker.read_text() == stamp:
        return python, "cached"
    CACHE.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    shutil.rmtree(path, ignore_errors=True)
    ok, why = _run([sys.executable, "-m", "venv", str(path)])
    if ok:
        ok, why = _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages])
    if not ok:
        return None, why
    marker.write_text(stamp)
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    times[name] = round(time.monotonic() - start, 1)
    TIMES.write_text(json.dumps(times, indent=1))
    return python, "built"


@pytest.fixture(scope="session")
def router_python() -> str:
    python, why = venv("router", [ROUTER])
    require(python is not None, f"cannot install {ROUTER} into {CACHE}/router: {why}", PYPI)
    return str(python)


@pytest.fixture(scope="session")
def k8s_validate() -> str:
    python, why = venv("k8s", [K8S_VALIDATE])
    require(python is not None, f"cannot install {K8S_VALIDATE} into {CACHE}/k8s: {why}", PYPI)
    return str(python.parent / "kubernetes-validate")
