"""bench/ab's arithmetic: headline figures out of `bench/run --json` reports, B/A of medians."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import ab


def report(scale: float, *, steady_error: str | None = None) -> dict[str, Any]:
    return {"sections": [
        {"key": "ingest", "error": None, "raw": {
            "lines": 1000, "full": [[2.0 * scale, 1000, 1000, 0], [1.0 * scale, 1000, 1000, 0],
                                    [3.0 * scale, 1000, 1000, 0]],
            "pump": [[1.0 * scale, 1000, 0, 0]], "forwarder_s": [0.5 * scale],
            "flood": [[100_000, {"rate": 100_000.0}, {"rate": 80_000.0 / scale}]]}},
        {"key": "respawn", "error": None, "raw": {"respawn_s": [0.1 * scale, 0.3 * scale, 0.2 * scale]}},
        {"key": "steady", "error": steady_error, "raw": {} if steady_error else {
            "busy": {"cpu": 10.0 * scale, "rss": [1 << 20, 3 << 20]},
            "rest": {"cpu": 1.0 * scale, "rss": [2 << 20]}}},
        {"key": "stop", "error": None, "raw": {}},  # measured inside "ready": nothing of its own
    ]}


def test_figures_are_the_medians_of_each_sections_samples() -> None:
    got = ab.figures(report(1.0))
    assert got["ingest: reader + file + parser + forwarder, lines/s"] == 500.0  # 1000 lines / median 2 s
    assert got["engine writing 100,000 lines/s: achieved, lines/s"] == 80_000.0
    assert got["engine exit -> respawn, p50 s"] == 0.2
    assert got["RSS max, busy, MiB"] == 3.0
    assert ab.figures(report(1.0, steady_error="Traceback ...")).keys().isdisjoint(
        {"CPU, at rest, % of a core"})  # an errored section is not compared


def test_the_table_gives_b_over_a_of_the_medians_for_figures_both_sides_have() -> None:
    a = [ab.figures(report(1.0)), ab.figures(report(1.0))]
    b = [ab.figures(report(2.0)), ab.figures(report(2.0, steady_error="boom"))]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in ab.table(a, b).splitlines()[2:]}
    assert rows["engine exit -> respawn, p50 s"].endswith("| 0.2, 0.2 | 0.4, 0.4 | 2.00 |")
    assert rows["ingest: reader + file + parser, lines/s"].endswith("| 0.50 |")  # twice the time
    assert "CPU, at rest, % of a core" not in rows  # one B round errored there: no ratio


def test_options_after_base_are_abs_and_after_the_double_dash_bench_runs() -> None:
    assert ab.split_argv(["main~3", "--rounds", "3", "--keep", "--", "--quick", "--only", "ingest"]) == (
        ["main~3", "--rounds", "3", "--keep"], ["--quick", "--only", "ingest"])
    assert ab.split_argv(["main~3"]) == (["main~3"], [])


def test_sides_alternate_so_that_neither_always_runs_first() -> None:
    order = [side for side, _ in ab.sides(4, Path("a"), Path("b"))]
    assert order == ["A", "B", "B", "A", "A", "B", "B", "A"]


def test_a_directory_bench_ab_did_not_make_is_never_used_nor_touched(tmp_path: Path) -> None:
    mine = tmp_path / "my-worktree"
    (mine / "bench").mkdir(parents=True)
    (mine / "bench" / "notes.txt").write_text("uncommitted work")
    for workdir in (mine, ab.ROOT, ab.ROOT / "bench"):
        with pytest.raises(SystemExit):
            ab.prepare_base("HEAD", workdir, own_harness=False)
    assert (mine / "bench" / "notes.txt").read_text() == "uncommitted work"
    assert (ab.ROOT / "bench" / "ab.py").exists()


def test_a_section_that_did_not_measure_is_named_with_its_last_error_line() -> None:
    assert ab.errors(report(1.0)) == []
    bad = report(1.0, steady_error="Traceback (most recent call last):\n  ...\nModuleNotFoundError: x\n")
    assert ab.errors(bad) == ["steady: ModuleNotFoundError: x"]
