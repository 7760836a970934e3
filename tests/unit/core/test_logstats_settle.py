"""`settle_stats`: stat lines read only where `fold_stats` keeps them, the consumers none the wiser."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sglang_supervisor.core.events import DecodeStats, EngineEvent, PrefillStats
from sglang_supervisor.core.logstats import StatLine, fold_stats, settle_stats
from sglang_supervisor.core.logwatch import LogParser

# Real 0.5.17 lines (tests/fixtures), plus the variants a run must tell apart: an idle decode step
# (no busy tok/s), one without the CUDA-graph field, a rank, and lines that end a run.
_LINES = [
    "[2026-12-01 15:28:30 TP0] Decode batch, #running-req: 1, #full token: 1117, full token usage: 0.00, "
    "mamba num: 4, mamba usage: 0.00, accept len: 1.00, accept rate: 0.00, waiting-image-req: 0, "
    "cuda graph: True, gen throughput (token/s): 22.95, #queue-req: 0",
    "[2026-11-29 08:09:11.127] Decode batch, #running-req: 8, #token: 280, token usage: 0.00, "
    "cuda graph: False, gen throughput (token/s): 1666.46, #queue-req: 0",
    "[2026-11-29 08:09:11.254] Decode batch, #running-req: 0, #token: 0, token usage: 0.00, "
    "cuda graph: False, gen throughput (token/s): 0.00, #queue-req: 0",
    "[2026-11-29 08:09:11.378] Decode batch, #running-req: 3, #token: 920, token usage: 0.01, "
    "gen throughput (token/s): 2566.17, #queue-req: 1",
    "[2026-11-29 08:10:05.246] Prefill batch, #new-seq: 1, #new-token: 24, #cached-token: 0, token usage: "
    "0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput "
    "(token/s): 19.75",
    "[2026-11-29 08:10:04] INFO:     127.0.0.1:34610 - \"GET /health HTTP/1.1\" 200 OK",
    "[2026-11-29 08:10:04] The server is fired up and ready to roll!",
    "[2026-11-29 08:10:04] Decode batch, #running-req: 2, #token: 96, token usage: 0.00, cuda graph: True,",
    "  gen throughput (token/s): 341.63, #queue-req: 0",  # the rest of a line a terminal wrapped
]

_batches = st.lists(st.lists(st.sampled_from(_LINES), max_size=30), max_size=6)


def _parse(batches: list[list[str]], defer: bool) -> list[EngineEvent]:
    parser = LogParser(defer_stats=defer)
    out: list[EngineEvent] = []
    for batch in batches:
        events = [ev for line in batch for ev in parser.feed_line(line)]
        out += settle_stats(events) if defer else events
    return out


@given(_batches)
def test_settled_reads_fold_to_what_every_line_read_folds_to(batches: list[list[str]]) -> None:
    settled = _parse(batches, defer=True)
    assert not any(isinstance(ev, StatLine) for ev in settled)
    assert fold_stats(settled) == fold_stats(_parse(batches, defer=False))


@given(_batches)
def test_every_event_but_a_superseded_stat_line_is_still_there(batches: list[list[str]]) -> None:
    full = _parse(batches, defer=False)
    settled = _parse(batches, defer=True)
    assert [e for e in settled if not isinstance(e, DecodeStats | PrefillStats)] == \
        [e for e in full if not isinstance(e, DecodeStats | PrefillStats)]
    it = iter(full)
    assert all(any(e == f for e in it) for f in settled)  # a subsequence: nothing reordered


def test_a_busy_read_parses_only_its_last_stat_lines() -> None:
    parser = LogParser(defer_stats=True)
    batch = [_LINES[1]] * 40 + [_LINES[4]] + [_LINES[1]] * 40
    events = [ev for line in batch for ev in parser.feed_line(line)]
    assert sum(isinstance(ev, StatLine) for ev in events) == 81  # recognised, not read
    settled = settle_stats(events)
    assert [(type(ev).__name__, ev.line_no) for ev in settled] == [("PrefillStats", 41),
                                                                   ("DecodeStats", 81)]
    decode = settled[-1]
    assert isinstance(decode, DecodeStats) and decode.gen_throughput == 1666.46


def test_events_without_a_deferred_line_are_returned_untouched() -> None:
    events: list[EngineEvent] = [DecodeStats(i, None, 1, 0, 10.0, True, None) for i in range(1, 4)]
    assert settle_stats(events) is events
