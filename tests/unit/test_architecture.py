"""The layout is the architecture (docs/ARCHITECTURE.md): `core/` is pure, `shell/` does the I/O.

`core/` modules decide; they may not import what touches processes, sockets, clocks, threads or
the filesystem, nor the shell, the commands or the simulator. A decision that needs such a fact
takes it as an argument, which is what lets tests/unit drive every decision as a table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "daemon" / "sglang_supervisor"
FORBIDDEN_IN_CORE = {"asyncio", "httpx", "os", "subprocess", "socket", "time", "threading", "signal",
                     "shutil", "tempfile", "pathlib", "select", "selectors"}
LAYERS_CORE_MAY_NOT_USE = ("sglang_supervisor.shell", "sglang_supervisor.commands",
                           "sglang_supervisor.simulator", "sglang_supervisor.cli")
# Imports that are known to break the rule and are being taken out; each entry must still be true
# (test_known_debt_is_still_real) so that this list can only shrink.
KNOWN_DEBT: set[tuple[str, str]] = {
    ("core/audit.py", "sglang_supervisor.shell.gpu"), ("core/regression.py", "sglang_supervisor.shell.gpu"),
}


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth of the file (lazy imports count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _violations(path: Path) -> set[str]:
    bad = set()
    for name in _imports(path):
        if name.split(".")[0] in FORBIDDEN_IN_CORE:
            bad.add(name.split(".")[0])
        elif name.startswith(LAYERS_CORE_MAY_NOT_USE):
            bad.add(name)
    return bad


CORE_FILES = sorted((PKG / "core").rglob("*.py"))


def test_the_layout_exists() -> None:
    assert {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()} >= {
        "core", "engine", "shell", "commands", "simulator"}
    assert len(CORE_FILES) > 10


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_core_is_pure(path: Path) -> None:
    rel = str(path.relative_to(PKG))
    unexpected = {v for v in _violations(path) if (rel, v) not in KNOWN_DEBT}
    assert unexpected == set(), f"{rel} imports {sorted(unexpected)}: take the fact as an argument"


def test_known_debt_is_still_real() -> None:
    stale = {(rel, v) for rel, v in KNOWN_DEBT if v not in _violations(PKG / rel)}
    assert stale == set(), f"remove these paid debts from KNOWN_DEBT: {sorted(stale)}"


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import time\n    from sglang_supervisor.shell import process\n")
    assert _violations(bad) == {"time", "sglang_supervisor.shell"}
