"""The engine's periodic stat lines (`Decode batch`, `Prefill batch`) → typed `DecodeStats` and
`PrefillStats`. Pure.

Each reader tries the whole line against the release's exact layout first (one regex match, the
common case while serving) and falls back to reading field by field, which any line order or a
missing field survives.
"""

from __future__ import annotations

import re

from sglang_supervisor.core.events import DecodeStats, PrefillStats
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
