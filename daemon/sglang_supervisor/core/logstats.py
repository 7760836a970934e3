"""The engine's periodic stat lines (`Decode batch`, `Prefill batch`) → typed `DecodeStats` and
`PrefillStats`, and a hand-over's run of them folded to what consumers keep (`fold_stats`). Pure.

A reader that hands runs over folded may defer the parse: `StatLine` holds a stat line unread, and
`settle_stats` parses only those of a run that `fold_stats` would keep, from the run's end back.
At 1000 lines/s most of a serving engine's stat lines are superseded within the same read, and a
stat line costs ~3.5 µs to read where an access line costs ~1 (issue 26).

Each reader tries the whole line against the release's exact layout first (one regex match, the
common case while serving) and falls back to reading field by field, which any line order or a
missing field survives.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sglang_supervisor.core.events import DecodeStats, EngineEvent, PrefillStats
from sglang_supervisor.engine import patterns as P


def _int_search(pattern: re.Pattern[str], msg: str) -> int | None:
    m = pattern.search(msg)
    return int(m.group(1)) if m else None


def _float_search(pattern: re.Pattern[str], msg: str) -> float | None:
    m = pattern.search(msg)
    return float(m.group(1)) if m else None


def _graph_used(msg: str) -> bool | None:
    m = P.GRAPH_USED.search(msg)
    return None if m is None else m.group(1) == "True"


def decode_stats(msg: str, rank: str | None, line_no: int) -> DecodeStats:
    m = _decode_line(msg)
    if m is None:
        return decode_stats_by_field(msg, rank, line_no)
    running, accept, graph, gen, queued = m.groups()
    return DecodeStats(
        line_no, rank,
        running_req=int(running),
        queue_req=int(queued),
        gen_throughput=float(gen),
        cuda_graph=graph == "True",
        accept_len=float(accept) if accept is not None else None,
    )


def decode_stats_by_field(msg: str, rank: str | None, line_no: int) -> DecodeStats:
    return DecodeStats(
        line_no, rank,
        running_req=_int_search(P.RUNNING_REQ, msg),
        queue_req=_int_search(P.QUEUE_REQ, msg),
        gen_throughput=_float_search(P.GEN_TPUT, msg),
        cuda_graph=_graph_used(msg),
        accept_len=_float_search(P.ACCEPT_LEN, msg),
    )


def prefill_stats(msg: str, rank: str | None, line_no: int) -> PrefillStats:
    m = _prefill_line(msg)
    if m is None:
        return prefill_stats_by_field(msg, rank, line_no)
    running, queued, graph, tput = m.groups()
    return PrefillStats(
        line_no, rank,
        running_req=int(running),
        queue_req=int(queued),
        input_throughput=float(tput),
        cuda_graph=graph == "True",
    )


def prefill_stats_by_field(msg: str, rank: str | None, line_no: int) -> PrefillStats:
    return PrefillStats(
        line_no, rank,
        running_req=_int_search(P.RUNNING_REQ, msg),
        queue_req=_int_search(P.QUEUE_REQ, msg),
        input_throughput=_float_search(P.INPUT_TPUT, msg),
        cuda_graph=_graph_used(msg),
    )


_decode_line = P.DECODE_LINE.fullmatch
_prefill_line = P.PREFILL_LINE.fullmatch


@dataclass(frozen=True, slots=True)
class StatLine(EngineEvent):
    """A stat line recognised by its head but not read yet (`LogParser(defer_stats=True)`); never
    leaves the reader: `settle_stats` turns it into its `DecodeStats`/`PrefillStats` or drops it."""

    msg: str  # the line after its log header
    prefill: bool  # `Prefill batch` (else `Decode batch`)


def _read(ev: EngineEvent) -> EngineEvent:
    if not isinstance(ev, StatLine):
        return ev
    if ev.prefill:
        return prefill_stats(ev.msg, ev.rank, ev.line_no)
    return decode_stats(ev.msg, ev.rank, ev.line_no)


def _kinds(ev: EngineEvent) -> tuple[str, ...]:
    """What a consumer can tell a stat event apart by: a decode step ran, the throughput of a busy
    engine (passive tok/s), whether CUDA graphs ran; or a prefill."""
    if isinstance(ev, PrefillStats):
        return ("prefill",)
    assert isinstance(ev, DecodeStats)
    busy = ev.gen_throughput is not None and bool(ev.running_req)
    return ("decode",) + (("tok_s",) if busy else ()) + (("graph",) if ev.cuda_graph is not None else ())


def _kept_stats(run: list[EngineEvent]) -> list[EngineEvent]:
    """Of one run of stat events, in order, the last of each kind (`_kinds`)."""
    return kept_from_end(reversed(run))


def kept_from_end(backwards: Iterable[EngineEvent]) -> list[EngineEvent]:
    """`_kept_stats` of a run given from its end back, in order: a `StatLine` is read only while
    a kind it could be the last of is still open, and nothing is taken from `backwards` once every
    kind is closed (a reader may yield a long run's lines lazily: `LogParser.feed_run`)."""
    open_kinds = {"decode", "tok_s", "graph", "prefill"}
    kept: list[EngineEvent] = []
    for line in backwards:
        is_prefill = line.prefill if isinstance(line, StatLine) else isinstance(line, PrefillStats)
        if ("prefill" in open_kinds) if is_prefill else bool(open_kinds - {"prefill"}):
            ev = _read(line)
            hit = open_kinds.intersection(_kinds(ev))
            if hit:
                open_kinds -= hit
                kept.append(ev)
                if not open_kinds:
                    break
    kept.reverse()
    return kept


def fold_stats(events: Sequence[EngineEvent]) -> list[EngineEvent]:
    """One hand-over's events with the stat lines a later one of the same run supersedes left out.

    A serving engine writes hundreds of `Decode batch` / `Prefill batch` lines a second, and each
    one that reaches the lifecycle is a step of its own (issue 26); what the consumers keep of
    them is the latest figure (the lifecycle's progress and tok/s, the monitor's passive tok/s
    gauge and CUDA-graph flag). Every other event stays, in order; stat events are folded only
    within a run between two others, so none moves past an event that is not a stat line."""
    out: list[EngineEvent] = []
    run: list[EngineEvent] = []
    for ev in events:
        if isinstance(ev, DecodeStats | PrefillStats | StatLine):
            run.append(ev)
            continue
        if run:
            out += _kept_stats(run) if len(run) > 1 else [_read(run[0])]
            run = []
        out.append(ev)
    if run:
        out += _kept_stats(run) if len(run) > 1 else [_read(run[0])]
    return out


def settle_stats(events: list[EngineEvent]) -> list[EngineEvent]:
    """A deferring parser's read with its `StatLine`s settled: `fold_stats` of it, which reads only
    what it keeps, so the same as `fold_stats` of the events read in full. Events of a parser that
    does not defer are returned as they are."""
    return fold_stats(events) if any(type(ev) is StatLine for ev in events) else events
