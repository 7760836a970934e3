"""`LogParser.feed_run`: a read of serving chatter at once, exactly as reading it line by line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sglang_supervisor.core.events import DecodeStats, EngineEvent, PrefillStats
from sglang_supervisor.core.logstats import StatLine, settle_stats
from sglang_supervisor.core.logwatch import LogParser

# Access and stat lines as SGLang 0.5.17 writes them (tests/fixtures), with ranks, the fixtures'
# timed lead, and an access line whose path looks like a ranked header.
_SERVING = [
    "[2026-11-29 08:09:11.127] Decode batch, #running-req: 8, #token: 280, token usage: 0.00, "
    "cuda graph: False, gen throughput (token/s): 1666.46, #queue-req: 0",
    "[2026-11-29 08:09:11.254] Decode batch, #running-req: 0, #token: 0, token usage: 0.00, "
    "cuda graph: False, gen throughput (token/s): 0.00, #queue-req: 0",
    "[2026-12-01 15:28:30 TP0] Decode batch, #running-req: 1, #full token: 1117, full token usage: 0.00, "
    "mamba num: 4, mamba usage: 0.00, accept len: 1.00, accept rate: 0.00, waiting-image-req: 0, "
    "cuda graph: True, gen throughput (token/s): 22.95, #queue-req: 0",
    "[2026-12-01 15:28:31.5 DP0 TP1] Decode batch, #running-req: 3, #token: 920, token usage: 0.01, "
    "gen throughput (token/s): 2566.17, #queue-req: 1",
    "[2026-11-29 08:10:05.246] Prefill batch, #new-seq: 1, #new-token: 24, #cached-token: 0, token usage: "
    "0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput "
    "(token/s): 19.75",
    "[2026-12-01 15:28:32,001 TP0] Prefill batch, #new-seq: 2, #new-token: 48, #cached-token: 0, "
    "token usage: 0.00, #running-req: 1, #queue-req: 0, cuda graph: True, input throughput (token/s): 9.5",
    "[2026-11-29 08:10:04] INFO:     127.0.0.1:34610 - \"GET /health HTTP/1.1\" 200 OK",
    "[2026-11-29 08:10:04 TP0] INFO:     127.0.0.1:34612 - \"POST /generate HTTP/1.1\" 200 OK",
    "[08:10:04] INFO:     127.0.0.1:1 - \"GET /x?at=12:30:45 TP1] HTTP/1.1\" 404 Not Found",
    "   45.579 NL [2026-11-29 08:10:04] INFO:     127.0.0.1:34610 - \"GET /health HTTP/1.1\" 503 "
    "Service Unavailable",
    "\t46.085 CR [2026-11-29 08:10:05.1 TP3] Decode batch, #running-req: 2, #token: 96, token usage: 0.00, "
    "cuda graph: True, gen throughput (token/s): 341.63, #queue-req: 0",
    # the start of a line a terminal wrapped: a stat line still, whose rest may follow
    "[2026-11-29 08:10:04] Decode batch, #running-req: 2, #token: 96, token usage: 0.00, cuda graph: True,",
]
# Lines a serving run must not take: events, near misses, and what changes the parser's state.
_OTHER = [
    "[2026-11-29 08:10:04] The server is fired up and ready to roll!",
    "[2026-11-29 08:10:04] INFO:     Shutting down",  # uvicorn, no access line: a drain
    "[2026-11-29 08:10:04]  Decode batch, #running-req: 1",  # two spaces: not the fast path's
    "\x1b[32m[2026-11-29 08:10:04] Decode batch, #running-req: 1, #token: 5, token usage: 0.00, "
    "cuda graph: True, gen throughput (token/s): 7.00, #queue-req: 0\x1b[0m",
    "",
    "  gen throughput (token/s): 341.63, #queue-req: 0",  # the rest of a line a terminal wrapped
    "Traceback (most recent call last):",
    "RuntimeError: CUDA error: out of memory",
    "\x0c45.579 NL [2026-11-29 08:10:04] INFO:     127.0.0.1:1 - \"GET /health HTTP/1.1\" 200 OK",
    "[2026-11-29 08:10:04] Receive: obj=GenerateReqInput(rid='r1', text='hi [2026-11-29 08:10:04] "
    "Decode batch'",
    "[2026-11-29 08:10:04] Decode batch, #running-req: 1\n[2026-11-29 08:10:04] INFO: x HTTP/1.1",
]

_reads = st.lists(st.one_of(st.lists(st.sampled_from(_SERVING), max_size=40),
                            st.lists(st.sampled_from(_SERVING + _OTHER), max_size=12)), max_size=6)


def _line_by_line(parser: LogParser, lines: list[str]) -> tuple[list[EngineEvent], list[str | None]]:
    """What the pump does without feed_run: each line's events, settled; each line's rank."""
    events: list[EngineEvent] = []
    ranks: list[str | None] = []
    for line in lines:
        got = parser.feed_line(line)
        events += got
        ranks.append(got[0].rank if got else None)
    return settle_stats(events), ranks


@given(_reads)
def test_a_run_reads_as_its_lines_read_one_by_one(reads: list[list[str]]) -> None:
    by_line, by_run = LogParser(defer_stats=True), LogParser(defer_stats=True)
    for lines in reads:
        want, ranks = _line_by_line(by_line, lines)
        run = by_run.feed_run(lines)
        if run is None:  # not a serving run: nothing was read, the lines go one by one
            got, _ = _line_by_line(by_run, lines)
        else:
            got = run.events
            assert (run.ranks if run.ranks is not None else [None] * len(lines)) == ranks
        assert got == want
        assert not any(isinstance(ev, StatLine) for ev in got)
        assert by_run.line_no == by_line.line_no
    # the state a run leaves (the line a wrapped rest joins) is the same too
    rest = "  gen throughput (token/s): 9.99, #queue-req: 0"
    assert by_run.feed_line(rest) == by_line.feed_line(rest)


def test_a_read_of_only_serving_lines_is_one_run_and_keeps_the_last_figures() -> None:
    parser = LogParser(defer_stats=True)
    lines = [_SERVING[6], _SERVING[2], _SERVING[4]] * 30 + [_SERVING[0], _SERVING[7]]
    run = parser.feed_run(lines)
    assert run is not None
    assert [(type(ev), ev.line_no) for ev in run.events] == [(PrefillStats, 90), (DecodeStats, 91)]
    decode = run.events[-1]
    assert isinstance(decode, DecodeStats) and decode.gen_throughput == 1666.46 and decode.rank is None
    assert run.ranks is not None and run.ranks[:3] == [None, "TP0", None] and run.ranks[-1] is None
    assert parser.line_no == len(lines)


def test_a_run_is_refused_for_a_line_that_is_not_chatter_and_for_a_parser_that_reads_in_full() -> None:
    for other in _OTHER:
        parser = LogParser(defer_stats=True)
        assert parser.feed_run([_SERVING[0], other, _SERVING[6]]) is None, other
        assert parser.line_no == 0  # nothing read
    assert LogParser().feed_run([_SERVING[0]]) is None  # it hands every stat line on, unfolded
    assert LogParser(defer_stats=True).feed_run([]) is None


def test_a_run_is_refused_inside_a_traceback() -> None:
    parser = LogParser(defer_stats=True)
    parser.feed_line("Traceback (most recent call last):")
    assert parser.feed_run([_SERVING[0]]) is None
