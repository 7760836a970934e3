"""The layout is the architecture (docs/ARCHITECTURE.md): `core/` is pure, `shell/` does the I/O.

`core/` modules decide; they may not import what touches processes, sockets, clocks, threads or
the filesystem, nor the shell, the commands or the simulator. A decision that needs such a fact
takes it as an argument, which is what lets tests/unit drive every decision as a table.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "daemon" / "sglang_supervisor"
FORBIDDEN_IN_CORE = {"asyncio", "httpx", "os", "subprocess", "socket", "time", "threading", "signal",
                     "shutil", "tempfile", "pathlib", "select", "selectors"}
LAYERS_CORE_MAY_NOT_USE = ("sglang_supervisor.shell", "sglang_supervisor.commands",
                           "sglang_supervisor.simulator", "sglang_supervisor.cli")


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
    unexpected = _violations(path)
    assert unexpected == set(), f"{rel} imports {sorted(unexpected)}: take the fact as an argument"


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import time\n    from sglang_supervisor.shell import process\n")
    assert _violations(bad) == {"time", "sglang_supervisor.shell"}


# ---- the second rule: SGLang's versions, log phrases and metric names live under engine/ -------
# (and simulator/, which imitates the engine). Elsewhere they are read from engine/'s constants,
# so that a release that renames a line or moves a rule is one edit in one place.

from sglang_supervisor.engine import patterns as P  # noqa: E402  (the rule's data, after rule 1)

# Guard substrings of patterns.py that are also our own vocabulary (the doctor says "prefill CUDA
# graph"); the log lines themselves are longer and are checked (PREFILL_DISABLED_LINE).
_VOCABULARY = frozenset({"prefill CUDA graph"})
SGLANG_PHRASES = frozenset(
    p for p in (
        *(key for key, _ in P.SIGNATURES), *P.CRASH_PREFIXES, *P.DRAIN_KEYS,
        *(getattr(P, n) for n in dir(P) if n.endswith(("_KEY", "_LINE")) and isinstance(getattr(P, n), str)),
        P.UNKNOWN_SPEC_ALGORITHM, P.SCHEDULER_COMM_PREFIX,
    )
    if len(p.strip()) >= 10 and p not in _VOCABULARY
)
# A release number such as 0.5.23, not part of an address (127.0.0.1) or a longer dotted name.
_VERSION = re.compile(r"(?<![\w.])0\.\d{1,2}\.\d{1,3}(?![\w.])")
_METRIC = re.compile(r"\bsglang:[a-z]")
OUTSIDE_ENGINE = [*sorted(p for layer in ("core", "shell", "commands") for p in (PKG / layer).rglob("*.py")),
                  PKG / "cli.py"]


def _docstrings(tree: ast.AST) -> set[int]:
    """Docstrings describe (they may name the release a fact comes from); code must not decide by it."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _sglang_knowledge(path: Path) -> list[str]:
    """String constants (f-string parts included) and version tuples that spell SGLang facts."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
            found += [f"{node.lineno}: log phrase {p!r}" for p in sorted(SGLANG_PHRASES) if p in text]
            found += [f"{node.lineno}: version {v!r}" for v in _VERSION.findall(text)]
            found += [f"{node.lineno}: metric name in {text!r}"] if _METRIC.search(text) else []
        elif (isinstance(node, ast.Tuple) and len(node.elts) == 3
              and all(isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts)):
            major, minor = (e.value for e in node.elts[:2])  # type: ignore[attr-defined]
            if major == 0 and 0 < minor < 10:
                found.append(f"{node.lineno}: version tuple {ast.unparse(node)}")
    return sorted(found, key=lambda item: (int(item.split(":")[0]), item))


def test_the_phrase_list_is_the_engine_knowledge() -> None:
    assert len(SGLANG_PHRASES) > 30
    assert {"Not enough memory. Please try to increase --mem-fraction-static", "server_args=",
            P.PREFILL_DISABLED_LINE} <= SGLANG_PHRASES


@pytest.mark.parametrize("path", OUTSIDE_ENGINE, ids=lambda p: str(p.relative_to(PKG)))
def test_sglang_knowledge_lives_in_engine(path: Path) -> None:
    found = _sglang_knowledge(path)
    assert found == [], (f"{path.relative_to(PKG)} spells SGLang facts: {found}; name them in engine/ "
                         "(patterns.py, sglang.py, api.py, graphs.py) and use the constant")


def test_the_knowledge_checker_sees_a_planted_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""Docstrings may say 0.5.23."""\n'
        'LOCAL = "127.0.0.1:30000"\n'
        'def f(v, n):\n'
        '    """Since 0.5.14."""\n'
        '    if v >= (0, 5, 13):\n'
        '        return f"{n}: Not enough memory. Please try to increase --mem-fraction-static"\n'
        '    return "needs 0.5.20", "sglang:num_running_reqs"\n'
    )
    assert _sglang_knowledge(bad) == [
        "5: version tuple (0, 5, 13)",
        "6: log phrase 'Not enough memory. Please try to increase --mem-fraction-static'",
        "7: metric name in 'sglang:num_running_reqs'",
        "7: version '0.5.20'",
    ]


ENGINE_FILES = sorted((PKG / "engine").rglob("*.py"))


@pytest.mark.parametrize("path", ENGINE_FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_engine_sits_below_the_shell(path: Path) -> None:
    """engine/ is SGLang knowledge: core/ and the shell read it, it reads neither the shell nor the
    commands (the simulator is started by name, never imported)."""
    bad = {n for n in _imports(path) if n.startswith(LAYERS_CORE_MAY_NOT_USE)}
    assert bad == set(), f"{path.relative_to(PKG)} imports {sorted(bad)}"


# ---- the fourth rule: no shell part holds the Supervisor (issue 27) ------------------------------
# A part takes what it uses (Current, the lifecycle, metrics, narrow callbacks); the wiring lives in
# shell/supervisor.py alone. `_imports` walks the whole file, so a TYPE_CHECKING import counts too.

SUPERVISOR_MODULE = "sglang_supervisor.shell.supervisor"
SHELL_FILES = sorted(p for p in (PKG / "shell").rglob("*.py") if p.name != "supervisor.py"
                     or p.parent != PKG / "shell")


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_shell_part_imports_the_supervisor(path: Path) -> None:
    rel = str(path.relative_to(PKG))
    assert SUPERVISOR_MODULE not in _imports(path), (
        f"{rel} imports shell/supervisor.py: take the collaborators it uses, not the Supervisor")


def test_the_circle_checker_sees_a_type_checking_import(tmp_path: Path) -> None:
    bad = tmp_path / "part.py"
    bad.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                   "    from sglang_supervisor.shell.supervisor import Supervisor\n")
    assert SUPERVISOR_MODULE in _imports(bad)


# ---- the fifth rule: a command is loaded only when it runs ---------------------------------------
# `--help`, the daemon and every one-shot command pay for their own imports only: cli.py names the
# subcommand's module and imports it by name (importlib) after parsing.

def test_cli_imports_no_command_up_front() -> None:
    bad = {n for n in _imports(PKG / "cli.py") if n.startswith("sglang_supervisor.commands")}
    assert bad == set(), f"cli.py imports {sorted(bad)}: import the subcommand's module when it runs"
    assert "importlib" in _imports(PKG / "cli.py")
