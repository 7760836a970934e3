"""logmux: the engine's stderr and stdout into one log file, whole lines at a time."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_supervisor.core.logmux import LineMux

ERR, OUT = 0, 1


def test_a_partial_line_waits_for_its_end_while_the_other_stream_writes_whole_lines() -> None:
    mux = LineMux(2)
    assert mux.feed(ERR, b"[t] Capture cuda graph be", 0.0) == b""
    assert mux.feed(OUT, b"[t] Receive: obj=GenerateReqInput(text='hi')\n[t] Fin", 0.0) == (
        b"[t] Receive: obj=GenerateReqInput(text='hi')\n")
    assert mux.feed(ERR, b"gin.\n", 0.0) == b"[t] Capture cuda graph begin.\n"
    assert mux.feed(OUT, b"ish: obj=x\n", 0.0) == b"[t] Finish: obj=x\n"
    assert not mux.holding()


def test_a_progress_frame_ends_at_a_carriage_return() -> None:
    mux = LineMux(2)
    assert mux.feed(ERR, b"\rCapturing batches:  10%", 0.0) == b"\r"
    assert mux.feed(ERR, b"\rCapturing batches:  20%", 0.0) == b"Capturing batches:  10%\r"


def test_one_open_stream_passes_straight_through() -> None:
    single = LineMux(1)
    assert single.feed(ERR, b"no newline", 0.0) == b"no newline"
    mux = LineMux(2)
    assert mux.feed(OUT, b"held", 0.0) == b""
    assert mux.close(OUT) == b"held"  # its end releases it
    assert mux.feed(ERR, b"partial", 0.0) == b"\npartial"  # the file ended inside stdout's line
    assert mux.feed(ERR, b" more", 0.0) == b" more"


def test_a_quiet_stream_releases_its_partial_line_and_the_next_line_of_the_other_starts_fresh() -> None:
    mux = LineMux(2, idle_s=1.0)
    mux.feed(ERR, b"Loading model", 10.0)
    assert mux.idle(10.5) == b""  # not quiet long enough
    assert mux.idle(11.0) == b"Loading model"
    assert not mux.holding()
    assert mux.feed(OUT, b"GET /health 200\n", 11.5) == b"\nGET /health 200\n"
    assert mux.feed(ERR, b" done\n", 12.0) == b" done\n"


def test_a_line_longer_than_the_bound_is_written_as_it_is() -> None:
    mux = LineMux(2, max_held=8)
    assert mux.feed(OUT, b"12345678", 0.0) == b""
    assert mux.feed(OUT, b"9", 0.0) == b"123456789"
    assert mux.feed(ERR, b"err\n", 0.0) == b"\nerr\n"


_ERR_TEXT = st.text(alphabet="abc\n\r", max_size=60).map(str.encode)
_OUT_TEXT = st.text(alphabet="123\n\r", max_size=60).map(str.encode)


@st.composite
def _schedules(draw: st.DrawFn) -> tuple[bytes, bytes, list[tuple[str, int, int]]]:
    """Both streams' bytes, and an interleaving of reads (stream, cut), quiet spells and ends."""
    err, out = draw(_ERR_TEXT), draw(_OUT_TEXT)
    cuts = {ERR: [*sorted(draw(st.sets(st.integers(0, len(err)), max_size=8))), len(err)],
            OUT: [*sorted(draw(st.sets(st.integers(0, len(out)), max_size=8))), len(out)]}
    ops: list[tuple[str, int, int]] = []
    pending = {ERR: list(cuts[ERR]), OUT: list(cuts[OUT])}
    while pending[ERR] or pending[OUT]:
        choices = [s for s in (ERR, OUT) if pending[s]]
        s = draw(st.sampled_from(choices))
        ops.append(("read", s, pending[s].pop(0)))
        if not pending[s]:
            ops.append(("end", s, 0))
        if draw(st.booleans()):
            ops.append(("quiet", 0, draw(st.integers(0, 2))))
    return err, out, ops


@settings(max_examples=400, deadline=None)
@given(_schedules(), st.integers(2, 80))
def test_every_byte_is_kept_and_no_line_mixes_the_streams(
        schedule: tuple[bytes, bytes, list[tuple[str, int, int]]], max_held: int) -> None:
    err, out, ops = schedule
    data = {ERR: err, OUT: out}
    pos = {ERR: 0, OUT: 0}
    mux = LineMux(2, max_held=max_held, idle_s=1.0)
    now = 0.0
    written = b""
    for op, s, arg in ops:
        if op == "read":
            written += mux.feed(s, data[s][pos[s]:arg], now)
            pos[s] = arg
        elif op == "end":
            written += mux.close(s)
        else:
            now += arg
            written += mux.idle(now)
    assert not mux.holding()
    # Every byte of each stream, in its order (the mux adds only newlines).
    assert re.sub(rb"[^abc]", b"", written) == re.sub(rb"[^abc]", b"", err)
    assert re.sub(rb"[^123]", b"", written) == re.sub(rb"[^123]", b"", out)
    assert written.count(b"\r") == err.count(b"\r") + out.count(b"\r")
    assert written.count(b"\n") >= err.count(b"\n") + out.count(b"\n")
    # No line of the file holds bytes of both streams.
    for line in re.split(rb"[\r\n]", written):
        assert not (re.search(rb"[abc]", line) and re.search(rb"[123]", line)), line
