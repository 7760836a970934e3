"""Imports a module of scripts/gpu/ for the unit tests: that folder is no package, its scripts find
one another (e2e.py the package e2e_scenarios/, seedshape.py, warmcache.py) by being beside each
other, so it stands on sys.path for the import only."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

GPU_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "gpu"


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(GPU_SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(GPU_SCRIPTS))
