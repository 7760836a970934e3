"""Small modules and short functions, or a stated reason (issue 13, item 5).

Checked in the package (daemon/sglang_supervisor) and in the Python that drives it from outside:
the GPU end-to-end scripts (scripts/gpu) and the benchmarks (bench).

A module of more than 400 lines, or a function of more than 60, says why it is one unit in its
docstring, on a line that starts with `Long because:` (a table, a schema, an argparse surface, one
state machine...). A reason is a claim a reviewer can check; a number is not a reason, so the
marker needs words after it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "daemon" / "sglang_supervisor"
SCRIPT_DIRS = (ROOT / "scripts" / "gpu", ROOT / "bench")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MARKER = "Long because:"
MIN_REASON_CHARS = 20


def _has_reason(doc: str | None) -> bool:
    for raw in (doc or "").splitlines():
        line = raw.strip()
        if line.startswith(MARKER) and len(line[len(MARKER):].strip()) >= MIN_REASON_CHARS:
            return True
    return False


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def long_units(path: Path) -> list[tuple[str, int]]:
    """(name, lines) of the module, if long, and of every long function or method in it; decorators
    do not count, the docstring does (it is part of what a reader reads)."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    out: list[tuple[str, int]] = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        out.append(("<module>", lines))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _length(node) > MAX_FUNCTION_LINES:
            out.append((node.name, _length(node)))
    return out


def unexplained(path: Path) -> list[str]:
    """Every long unit of `path` whose docstring gives no reason, as 'name (N lines)'."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    bad: list[str] = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES and not _has_reason(ast.get_docstring(tree)):
        bad.append(f"<module> ({lines} lines)")
    for node in ast.walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _length(node) > MAX_FUNCTION_LINES
                and not _has_reason(ast.get_docstring(node))):
            bad.append(f"{node.name}:{node.lineno} ({_length(node)} lines)")
    return bad


FILES = sorted(PKG.rglob("*.py"))
SCRIPT_FILES = sorted(p for d in SCRIPT_DIRS for p in d.rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(PKG))


def _rel_root(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_long_units_say_why(path: Path) -> None:
    _assert_explained(path, _rel(path))


@pytest.mark.parametrize("path", SCRIPT_FILES, ids=_rel_root)
def test_long_units_of_scripts_and_benchmarks_say_why(path: Path) -> None:
    _assert_explained(path, _rel_root(path))


def test_the_script_directories_are_seen() -> None:
    assert all(any(p.is_relative_to(d) for p in SCRIPT_FILES) for d in SCRIPT_DIRS), SCRIPT_DIRS


def _assert_explained(path: Path, name: str) -> None:
    bad = unexplained(path)
    assert bad == [], (f"{name}: {bad} exceed {MAX_MODULE_LINES} lines per module / "
                       f"{MAX_FUNCTION_LINES} per function: split them into parts named for what "
                       f"they hold, or say why each is one unit on a '{MARKER} ...' line of its docstring")


def test_the_checker_sees_long_units(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    bad = tmp_path / "bad.py"
    bad.write_text('"""A module."""\n\n\ndef long():\n    """Does things."""\n' + body + "\n\n\n"
                   + "\n" * MAX_MODULE_LINES
                   + 'def short():\n    """Long because: it is not."""\n')
    assert unexplained(bad) == [f"<module> ({MAX_MODULE_LINES + 69} lines)",
                                f"long:4 ({MAX_FUNCTION_LINES + 2} lines)"]
    assert [name for name, _ in long_units(bad)] == ["<module>", "long"]


def test_a_reason_silences_it_and_a_bare_marker_does_not(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    ok = tmp_path / "ok.py"
    ok.write_text('"""A module.\n\nLong because: one table of every flag, row per flag.\n"""\n\n\n'
                  'def long():\n    """Does things.\n\n'
                  '    Long because: one match over every input kind.\n    """\n'
                  + body + "\n" + "\n" * MAX_MODULE_LINES)
    assert unexplained(ok) == []
    bare = tmp_path / "bare.py"
    bare.write_text('"""Long because: 500 lines."""\n' + "\n" * MAX_MODULE_LINES)
    assert unexplained(bare) == [f"<module> ({MAX_MODULE_LINES + 1} lines)"]
