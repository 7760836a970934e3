"""Logs of every SGLang generation (tests/fixtures/generations, written from each release's
format strings; the real 0.5.17 H200 logs) give the hand-checked `logscan --json` summary, under
any framing a user pastes them in; and no input makes the parser raise."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_supervisor import cli
from sglang_supervisor.core.logruns import scan_runs
from sglang_supervisor.core.logwatch import LogParser, summarize

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GENERATIONS = sorted((FIXTURES / "generations").glob("*.log"))
H200 = [FIXTURES / "sglang-0.5.17-h200" / n for n in (
    "graphs.log", "eager.log", "crash.log", "failures/decode_capture_oom.log", "failures/kv_oom.log",
    "failures/prefill_capture_oom.log", "failures/draft_extend_capture_import_error.log")]


def logscan_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert cli.main(["logscan", "--json", str(path)]) == 0
    row: dict[str, Any] = json.loads(capsys.readouterr().out)
    row.pop("file")
    return row


@pytest.mark.parametrize("path", GENERATIONS, ids=[p.stem for p in GENERATIONS])
def test_generation_fixture_gives_the_hand_checked_summary(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    assert logscan_json(path, capsys) == expected


def test_the_issue_cases_are_read() -> None:
    """What the issue found missed, by name (the expected files pin the details)."""
    def exp(name: str) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((FIXTURES / "generations" / f"{name}.expected.json").read_text())
        return loaded

    dp = exp("sglang-0.4-dp-attention-watchdog")
    assert dp["tp_size"] == 8 and dp["failure"]["class"] == "watchdog_timeout" and dp["crashed"]
    old = exp("sglang-0.3-run-tp-server-capture-oom")
    assert old["failure"]["class"] == "capture_oom" and old["capture"]["failed"]
    assert exp("sglang-0.5.9-piecewise-dynamo")["failure"]["class"] == "prefill_graph_failed"
    npu = exp("sglang-0.5-npu-no-rank")
    assert npu["tp_size"] == 1 and npu["decode_cuda_graph"] is True and npu["capture"]["completed"]
    assert exp("sglang-0.4-ep-ready")["tp_size"] == 4
    assert exp("sglang-0.5-pp-capture-failed")["tp_size"] == 4  # server_args wins over PP ranks


# -- framings ------------------------------------------------------------------------------------

def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").split("\n")


def k8s_box(data: bytes) -> bytes:
    """A log viewer's box: borders, padding to the widest line, a top and bottom rule."""
    lines = _lines(data)
    width = min(max(len(line) for line in lines), 400)
    body = [f"│ {line.ljust(width)} │" for line in lines]
    rule = "─" * (width + 2)
    return "\n".join([f"┌{rule}┐", *body, f"└{rule}┘"]).encode()


def prefixed(prefix: str) -> Callable[[bytes], bytes]:
    def frame(data: bytes) -> bytes:
        return "\n".join(prefix + line for line in _lines(data)).encode()
    return frame


def wrapped(width: int) -> Callable[[bytes], bytes]:
    """A terminal that wraps long lines at `width` columns (progress frames left alone)."""
    def frame(data: bytes) -> bytes:
        out: list[str] = []
        for line in _lines(data):
            if "\r" in line or len(line) <= width:
                out.append(line)
            else:
                out += [line[i : i + width] for i in range(0, len(line), width)]
        return "\n".join(out).encode()
    return frame


FRAMINGS: dict[str, tuple[Callable[[bytes], bytes], int]] = {  # framing, lines it adds on top
    "k8s-viewer": (k8s_box, 1),
    "python-wrapper": (prefixed("2026-01-14 11:20:00,123 - engine - INFO - "), 0),
    "kubectl-timestamps": (prefixed("2026-01-14T11:20:00.123456789Z "), 0),
    "docker-compose": (prefixed("sglang-1  | "), 0),
    "journald": (prefixed("Jan 14 11:20:00 gpu-7 python3[4242]: "), 0),
}


def comparable(summary: dict[str, Any], offset: int) -> dict[str, Any]:
    out = dict(summary)
    out.pop("runs", None)  # line ranges move with the framing
    if out["failure"] is not None:
        out["failure"] = {**out["failure"], "line": out["failure"]["line"] - offset}
    return out


def summary_of(data: bytes) -> dict[str, Any]:
    runs = scan_runs(io.BytesIO(data).read)
    return {**summarize(runs[-1].events).to_json(), "runs": len(runs)}


@pytest.mark.parametrize("framing", FRAMINGS, ids=list(FRAMINGS))
@pytest.mark.parametrize("path", GENERATIONS + H200, ids=[p.stem for p in GENERATIONS + H200])
def test_any_framing_gives_the_same_summary(path: Path, framing: str) -> None:
    frame, offset = FRAMINGS[framing]
    data = path.read_bytes()
    assert comparable(summary_of(frame(data)), offset) == comparable(summary_of(data), 0)


@pytest.mark.parametrize("width", [120, 200])  # at 80 columns some exception lines lose their class
@pytest.mark.parametrize("path", GENERATIONS + H200, ids=[p.stem for p in GENERATIONS + H200])
def test_terminal_wrapping_keeps_the_summary(path: Path, width: int) -> None:
    """Wrapped rows are joined back: the same summary, the failure at the row where its line
    starts. The failure message is the first row's text (the exception line's rest is lost)."""
    data = path.read_bytes()
    if not data.startswith((b"[", b"/")):
        pytest.skip("no log header: a wrapped row cannot be told from a line of its own")
    want = summary_of(data)
    got = summary_of(wrapped(width)(data))
    for key in ("ready", "phase", "tp_size", "capture", "crashed", "last_gen_throughput",
                "last_input_throughput", "decode_cuda_graph"):
        assert got[key] == want[key], key
    if want["failure"] is None:
        assert got["failure"] is None
    else:
        assert got["failure"]["class"] == want["failure"]["class"]
        assert want["failure"]["message"].startswith(got["failure"]["message"][: width - 40])


# -- never raises --------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    runs = scan_runs(io.BytesIO(data).read)
    assert runs
    for run in runs:
        json.dumps(summarize(run.events).to_json())


CORPUS = b"".join(p.read_bytes() for p in GENERATIONS)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(CORPUS)), st.binary(max_size=40)), max_size=12))
def test_never_raises_on_mangled_real_logs(edits: list[tuple[int, bytes]]) -> None:
    """Fixture logs with random bytes spliced in (cut lines, stray \\r, broken UTF-8, ...)."""
    data = bytearray(CORPUS)
    for pos, junk in sorted(edits, reverse=True):
        data[pos:pos] = junk
    parser = LogParser()
    for line in bytes(data).decode("utf-8", errors="replace").split("\n"):
        parser.feed_line(line)
    parser.finish()
    for run in scan_runs(io.BytesIO(bytes(data)).read):
        json.dumps(summarize(run.events).to_json())
