"""Compat tier: real `sglang` wheels in their own venvs under <cache> =
~/.cache/sglang-supervisor-tests/compat/ (tiers.cache_dir; outside the checkout, reused by clones).

Layout, so that a second SGLang release costs only its own wheel:
  <cache>/deps/           torch (CPU) + triton + the few modules server_args imports
  <cache>/sglang-<V>/     sglang==V installed --no-deps, plus deps.pth pointing at deps/
Each venv is marked ready only after a complete install, so an interrupted build is redone.
Without network or wheels the tier skips, and fails under SGLANG_SUPERVISOR_REQUIRE_ALL_TIERS=1.
  <cache>/deps-tv/        for 0.5.13 and 0.5.17, whose `server_args` import chain reaches
                                torchvision (sglang/srt/utils/common.py) and transformers: PyPI's
                                torchvision does not import beside the CPU torch 2.13 file, so this
                                layer has torch 2.14.1 + torchvision 0.29.1 (the pair this machine's
                                pip takes from local disk; a CUDA build, never run on a GPU here)
                                and transformers plus the few modules that chain imports.
Measured here on 2 busy cores (cold): deps 356 s, deps-tv 783 s + 60 s, sglang 0.5.23 152 s,
0.5.17 83 s, 0.5.13 53 s; warm (all cached): about 10 s of imports per release.
A stub of torchvision was tried and dropped: transformers probes torchvision with find_spec and,
finding the stub, imports half of it (transforms.v2, io.ImageReadMode...).
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
CACHE = cache_dir("compat")
# `pip install torch==2.13.0` takes the CPU wheel the machine image ships (no multi-GB CUDA build).
TORCH = "torch==2.13.0"
DEPS = [
    TORCH,
    "triton",
    "numpy",
    "orjson",
    "psutil",
    "pybase64",
    "requests",
    "packaging",
    "pillow",
    "starlette",
    "msgspec",
    "pydantic",
    "pyzmq",
    "tqdm",
    "ipython",
    "aiohttp",
    "huggingface_hub",
]
# torch 2.14.1 + torchvision 0.29.1: the pair that imports together (see the docstring).
DEPS_TV = [
    "torch==2.14.1",
    "torchvision==0.29.1",
    *[d for d in DEPS if not d.startswith("torch")],
    "transformers==5.12.1",
    "sentencepiece",
    "openai",
    "dill",
    "partial_json_parser",
    "xgrammar",
]
INSTALL_TIMEOUT_S = 1800
TIMES = CACHE / "build-times.json"


def _run(cmd: list[str]) -> tuple[bool, str]:
    return run_install(cmd, INSTALL_TIMEOUT_S)


def _record(name: str, seconds: float) -> None:
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    times[name] = round(seconds, 1)
    TIMES.write_text(json.dumps(times, indent=1))


def _venv(
    path: Path, packages: list[str], stamp: str, *, no_deps: bool = False, deps_site: Path | None = None
) -> tuple[Path | None, str]:
    python = path / "bin" / "python"
    marker = path / ".ready"
    if marker.exists() and marker.read_text() == stamp:
        return python, "cached"
    start = time.monotonic()
    shutil.rmtree(path, ignore_errors=True)
    ok, why = _run([sys.executable, "-m", "venv", str(path)])
    if ok and deps_site is not None:
        site = next((path / "lib").glob("python3*/site-packages"))
        (site / "deps.pth").write_text(str(deps_site) + "\n")
    if ok:
        ok, why = _run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *(["--no-deps"] if no_deps else []),
                *packages,
            ]
        )
    if not ok:
        return None, why
    marker.write_text(stamp)
    _record(path.name, time.monotonic() - start)
    return python, "built"


def _deps_venv_site(name: str, deps: list[str], what: str) -> Path:
    """The site-packages of the cached venv `name` holding `deps` (built once, reused)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    python, why = _venv(CACHE / name, deps, " ".join(deps))
    require(python is not None, f"cannot build the compat {name} venv ({what}): {why}", PYPI)
    return next((CACHE / name / "lib").glob("python3*/site-packages"))


@pytest.fixture(scope="session")
def deps_site() -> Path:
    return _deps_venv_site("deps", DEPS, "torch CPU, triton...")


def sglang_python(version: str, deps: Path) -> str:
    python, why = _venv(
        CACHE / f"sglang-{version}", [f"sglang=={version}"], version, no_deps=True, deps_site=deps
    )
    require(python is not None, f"cannot install sglang=={version} into {CACHE}: {why}", PYPI)
    return str(python)


@pytest.fixture(scope="session")
def deps_tv_site() -> Path:
    return _deps_venv_site("deps-tv", DEPS_TV, "torch+torchvision...")


@pytest.fixture(scope="session")
def real_sglang_0523(deps_site: Path) -> str:
    return sglang_python("0.5.23", deps_site)


@pytest.fixture(scope="session")
def real_sglang_0517(deps_tv_site: Path) -> str:
    return sglang_python("0.5.17", deps_tv_site)


@pytest.fixture(scope="session")
def real_sglang_0513(deps_tv_site: Path) -> str:
    return sglang_python("0.5.13", deps_tv_site)


@pytest.fixture(scope="session", params=["0.5.13", "0.5.17", "0.5.23"])
def real_sglang(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(version, python) of each release in the tier: legacy flags, the H200's, the default."""
    version: str = request.param
    fixture = {"0.5.13": "real_sglang_0513", "0.5.17": "real_sglang_0517", "0.5.23": "real_sglang_0523"}
    return version, request.getfixturevalue(fixture[version])
