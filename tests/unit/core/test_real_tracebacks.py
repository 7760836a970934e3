"""Real SGLang tracebacks without a header line of their own (tests/fixtures/tracebacks, each
from a public sgl-project/sglang issue) are failures of the right class, through `logscan` and
through the live parser alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_supervisor import cli
from sglang_supervisor.core.events import EngineFailed
from sglang_supervisor.core.logwatch import LogParser

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "tracebacks"

# file → (class, line of the failure as `grep -n` counts)
EXPECTED = {
    "bare_init_cuda_graphs_cut.log": ("capture_failed", 1),
    "compose_init_cuda_graphs_cut.log": ("capture_failed", 1),
    "compose_capture_failed.log": ("capture_failed", 8),
    "chained_stream_capturing.log": ("capture_failed", 5),
    "chained_gloo_capture.log": ("capture_failed", 18),
}


def test_every_fixture_is_expected() -> None:
    assert {p.name for p in FIX.glob("*.log")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_logscan_reports_it(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["logscan", "--json", str(FIX / name)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["failure"] is not None, name
    assert (row["failure"]["class"], row["failure"]["line"]) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_live_parser_reports_it(name: str) -> None:
    parser = LogParser()
    events = []
    for line in (FIX / name).read_text().splitlines():
        events.extend(parser.feed_line(line))
    events.extend(parser.finish())
    failed = [e for e in events if isinstance(e, EngineFailed)]
    assert [(f.failure.value, f.line_no) for f in failed] == [EXPECTED[name]]
