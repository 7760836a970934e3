"""No module of the package may share a name with a stdlib module.

Run from one of the package's directories (engine/argcheck.py as a script, an operator's
`python -m` from there), such a module is imported instead of the stdlib one by everything in the interpreter:
a `secrets.py` here once broke the real SGLang argument parser that way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import sglang_supervisor


def _top_level_names(package_dir: Path) -> set[str]:
    names = {p.stem for p in package_dir.glob("*.py")}
    names |= {p.name for p in package_dir.iterdir() if (p / "__init__.py").is_file()}
    return names - {"__init__", "__main__"}


def test_no_module_shadows_the_stdlib() -> None:
    root = Path(sglang_supervisor.__file__).parent
    dirs = [root, *(d for d in root.rglob("*") if (d / "__init__.py").is_file())]
    names = set().union(*(_top_level_names(d) for d in dirs))
    assert {"apikey", "lifecycle", "argcheck", "cli"} <= names  # the walk sees every package's modules
    assert sorted(names & set(sys.stdlib_module_names)) == []
