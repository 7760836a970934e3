"""The fast paths of logwatch give exactly what the general paths give.

The splitter works on whole chunks and the parser short-cuts timestamped serving lines and reads
0.5.x batch stats with one regex; these properties pin them to simple reference models.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_supervisor.core import logstats, logwatch
from sglang_supervisor.core.events import DecodeStats, EngineEvent, PrefillStats
from sglang_supervisor.core.logwatch import TRUNCATED_MARK, LineSplitter, LogParser
from sglang_supervisor.engine import patterns as P
from splitfeed import feed_in_pieces

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sglang-0.5.17-h200"


def reference_lines(data: bytes, max_line: int) -> list[str]:
    """The splitter's contract, one line at a time: split on \\n and \\r, drop empty frames,
    cut a line longer than max_line bytes and mark it."""
    out = []
    for raw in re.split(rb"[\r\n]", data):
        if len(raw) > max_line:
            out.append(raw[:max_line].decode("utf-8", errors="replace") + TRUNCATED_MARK)
        elif raw:
            out.append(raw.decode("utf-8", errors="replace"))
    return out


BYTE_PIECES = st.sampled_from([
    b"\n", b"\r", b"\r\n", b"a", b"xyz", b"\xe2\x82\xac", b"\xe2", b"\x82", b"\xff", b"\xf0\x9f\x98", b"\xc3",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(BYTE_PIECES, max_size=80), st.lists(st.integers(0, 30), max_size=20), st.integers(0, 12))
def test_splitter_matches_reference_for_any_chunking(
    pieces: list[bytes], cuts: list[int], max_line: int
) -> None:
    data = b"".join(pieces)
    assert feed_in_pieces(LineSplitter(max_line), data, cuts) == reference_lines(data, max_line)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.integers(1, 200))
def test_splitter_matches_reference_on_arbitrary_bytes(data: bytes, max_line: int) -> None:
    splitter = LineSplitter(max_line)
    assert splitter.feed(data) + splitter.flush() == reference_lines(data, max_line)


NUM = st.one_of(st.integers(0, 10**6).map(str),
                st.sampled_from(["0.00", "6.04", "1.", ".5", "12.5", "1.2.3"]))
GRAPH = st.sampled_from(["cuda graph: True", "cuda graph: False", "npu graph: True", "musa graph: False"])


@st.composite
def decode_lines(draw: st.DrawFn) -> str:
    accept = draw(st.booleans())
    spec = f"accept len: {draw(NUM)}, accept rate: {draw(NUM)}, " if accept else ""
    line = (f"Decode batch, #running-req: {draw(NUM)}, #token: {draw(NUM)}, token usage: {draw(NUM)}, "
            f"{spec}{draw(GRAPH)}, gen throughput (token/s): {draw(NUM)}, #queue-req: {draw(NUM)}")
    return line + draw(st.sampled_from(["", " ", ", #extra: 1", "x"]))


@st.composite
def prefill_lines(draw: st.DrawFn) -> str:
    line = (f"Prefill batch, #new-seq: {draw(NUM)}, #new-token: {draw(NUM)}, #cached-token: {draw(NUM)}, "
            f"token usage: {draw(NUM)}, #running-req: {draw(NUM)}, #queue-req: {draw(NUM)}, "
            f"#pending-token: {draw(NUM)}, {draw(GRAPH)}, input throughput (token/s): {draw(NUM)}")
    return line + draw(st.sampled_from(["", " ", ", #extra: 1"]))


def _outcome(fn: object, *args: object) -> object:
    assert callable(fn)
    try:
        return fn(*args)
    except ValueError as exc:  # "1." parses, "1.2.3" would not: both paths must agree either way
        return repr(exc)


@settings(max_examples=300, deadline=None)
@given(decode_lines())
def test_decode_line_regex_equals_field_regexes(msg: str) -> None:
    fast = _outcome(logstats.decode_stats, msg, "TP0", 7)
    assert fast == _outcome(logstats.decode_stats_by_field, msg, "TP0", 7)
    assert isinstance(fast, DecodeStats) or "1.2.3" in msg


@settings(max_examples=300, deadline=None)
@given(prefill_lines())
def test_prefill_line_regex_equals_field_regexes(msg: str) -> None:
    fast = _outcome(logstats.prefill_stats, msg, None, 3)
    assert fast == _outcome(logstats.prefill_stats_by_field, msg, None, 3)
    assert isinstance(fast, PrefillStats) or "1.2.3" in msg


def test_real_batch_lines_take_the_one_regex_path() -> None:
    """The 0.5.17 fixture lines have the shape the one-regex path reads (else it would never run)."""
    seen = {"Decode": 0, "Prefill": 0}
    for path in sorted(FIXTURES.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            for kind, pattern in (("Decode", P.DECODE_LINE), ("Prefill", P.PREFILL_LINE)):
                start = line.find(f"{kind} batch, ")
                if start >= 0 and " NL " not in line[:start]:
                    assert pattern.fullmatch(line[start:]), line
                    seen[kind] += 1
    assert seen["Decode"] > 0 and seen["Prefill"] > 0


HEADS = st.sampled_from([
    "", "[2026-05-01 12:00:00 TP0] ", "[2026-05-01 12:00:00.123 DP0 TP1] ", "   21.249 NL ", "[12:00:00] ",
    "  3.1 CR [2026-05-01 12:00:00] ", " ", "\x1b[1;33m", "9", "[2026-05-01 12:00:00] ",
])
BODIES = st.one_of(decode_lines(), prefill_lines(), st.sampled_from([
    'INFO:     127.0.0.1:49178 - "POST /generate HTTP/1.1" 200 OK',
    "INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
    "The server is fired up and ready to roll!",
    "Traceback (most recent call last):",
    '  File "/x/cuda_graph_runner.py", line 3, in capture',
    "torch.OutOfMemoryError: CUDA out of memory.",
    "Scheduler hit an exception: Traceback (most recent call last):",
    "Capture target decode CUDA graph begin. backend=full",
    "Capturing batches (bs=8 avail_mem=1 GB):  50%|##| 3/6",
    "Load weight end. elapsed=1.0 s, type=X, mem usage=2.0 GB.",
    "SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
    "wrapped tail of a long line",
]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(HEADS, BODIES), max_size=30))
def test_parser_fast_path_equals_general_path(lines: list[tuple[str, str]]) -> None:
    fast = LogParser(secrets=("sk-test",))
    general = LogParser(secrets=("sk-test",))
    got: list[EngineEvent] = []
    want: list[EngineEvent] = []
    for head, body in lines:
        got += fast.feed_line(head + body)
        general._line_no += 1
        try:
            want += general._parse(head + body, general._line_no)
        except ValueError as exc:  # feed_line's own guard, as in the fast path
            want.append(logwatch.TracebackLine(general._line_no, None,
                                               f"[logwatch could not parse this line: {exc!r}]"))
    assert got + fast.finish() == want + general.finish()


def test_access_line_is_what_a_wrapped_line_joins() -> None:
    """A headerless line continues the line just before it, even when that one (an access log
    line, read by the fast path) produced no event: it must not join an older line."""
    lines = [
        "[2026-05-01 12:00:00] INFO:     Uvicorn running on http://0.0.0.0:",
        '[2026-05-01 12:00:01] INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK',
        "30000 (Press CTRL+C to quit)",
    ]
    fast = LogParser()
    general = LogParser()
    got = [e for line in lines for e in fast.feed_line(line)]
    want = []
    for line in lines:
        general._line_no += 1
        want += general._parse(line, general._line_no)
    assert got == want == []
    assert fast.feed_line("[2026-05-01 12:00:02] Uvicorn running on http://0.0.0.0:") == []
    assert [type(e).__name__ for e in fast.feed_line("30000 (Press CTRL+C to quit)")] == ["HttpUp"]
