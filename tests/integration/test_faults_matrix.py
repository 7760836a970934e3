"""docs/FAULTS.md stays honest: every row names a test that exists and injects what it says."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "docs" / "FAULTS.md"
TEST_REF = re.compile(r"^`(tests/[\w/]+\.py)::(\w+)`$")
REF_SEP = re.compile(r",\s*")  # a row may name several tests; each must exist
CODE = re.compile(r"`([^`]+)`")


def rows() -> list[list[str]]:
    out = []
    for line in MATRIX.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[3].startswith("`tests/"):
            out.append(cells)
    return out


def test_the_matrix_has_the_faults_the_issue_lists() -> None:
    faults = " ".join(r[0].lower() for r in rows())
    for needle in ["crash during weight load", "crash during cuda graph capture", "crash after ready",
                   "hang during weight load", "hang during capture", "hang while serving", "kv cache",
                   "port already in use", "foreign process", "ignores sigterm", "log flood",
                   "invalid utf-8", "3 mb line", "deleted", "disk full", "journald unavailable",
                   "metrics port taken", "probe endpoint returns errors", "refuses or hangs",
                   "configuration changed on disk", "sighup during startup", "sigkilled",
                   "wall clock"]:
        assert needle in faults, f"docs/FAULTS.md has no row for {needle!r}"
    assert len(rows()) >= 30


def test_every_row_names_an_existing_test_that_injects_the_fault() -> None:
    problems = []
    for fault, injected, _expected, tests in rows():
        sources = []
        for test in REF_SEP.split(tests):
            m = TEST_REF.match(test)
            if m is None:
                problems.append(f"{fault}: test column {test!r} is not `tests/...py::test_name`")
                continue
            path, name = ROOT / m.group(1), m.group(2)
            if not path.is_file():
                problems.append(f"{fault}: {m.group(1)} does not exist")
                continue
            source = path.read_text()
            sources.append(source)
            if not re.search(rf"^(async )?def {name}\(", source, re.MULTILINE):
                problems.append(f"{fault}: {m.group(1)} has no test {name}")
        for token in CODE.findall(injected):
            if sources and not any(token in source for source in sources):
                problems.append(f"{fault}: no test it names mentions the injected {token!r}")
    assert problems == []
