"""`fold_stats`: a hand-over's stat lines folded to what the consumers keep, nothing else moved."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sglang_supervisor.core.events import DecodeStats, EngineEvent, HttpUp, PrefillStats, ServerReady
from sglang_supervisor.core.logstats import fold_stats

_opt_int = st.none() | st.integers(0, 3)
_decode = st.builds(DecodeStats, st.integers(1, 10**6), st.none() | st.just("TP0"), _opt_int, _opt_int,
                    st.none() | st.floats(0, 1e4), st.none() | st.booleans(), st.none() | st.floats(1, 4))
_prefill = st.builds(PrefillStats, st.integers(1, 10**6), st.none(), _opt_int, _opt_int,
                     st.none() | st.floats(0, 1e4), st.none() | st.booleans())
_other = st.builds(ServerReady, st.integers(1, 10**6), st.none()) | st.builds(
    HttpUp, st.integers(1, 10**6), st.none(), st.just("127.0.0.1"), st.integers(1, 65535))
_events = st.lists(_decode | _prefill | _other, max_size=40)


def _consumers(events: list[EngineEvent]) -> list[tuple[object, ...]]:
    """What the lifecycle and the monitor know of the stat lines, as each other event arrives and
    at the end: a decode step seen, the latest busy tok/s, the latest CUDA-graph flag."""
    seen: list[tuple[object, ...]] = []
    progress, tok_s, graph = False, None, None
    for ev in events:
        if isinstance(ev, DecodeStats):
            progress = True
            if ev.gen_throughput is not None and ev.running_req:
                tok_s = ev.gen_throughput
            if ev.cuda_graph is not None:
                graph = ev.cuda_graph
        elif not isinstance(ev, PrefillStats):
            seen.append((ev, progress, tok_s, graph))
    return [*seen, (progress, tok_s, graph)]


@given(_events)
def test_consumers_see_the_same_figures_and_every_other_event_in_order(events: list[EngineEvent]) -> None:
    folded = fold_stats(events)
    assert _consumers(folded) == _consumers(events)
    it = iter(events)
    assert all(any(e is f for e in it) for f in folded)  # a subsequence: nothing reordered


@given(_events)
def test_a_run_keeps_at_most_four_stat_events(events: list[EngineEvent]) -> None:
    folded = fold_stats(events)
    others = sum(not isinstance(e, DecodeStats | PrefillStats) for e in events)
    assert len(folded) <= others + 4 * (others + 1)
    assert [e for e in folded if isinstance(e, PrefillStats)][-1:] == \
        [e for e in events if isinstance(e, PrefillStats)][-1:]


def test_a_serving_batch_folds_to_its_latest_figure() -> None:
    batch: list[EngineEvent] = [DecodeStats(i, None, 2, 0, 100.0 + i, True, None) for i in range(1, 41)]
    assert fold_stats(batch) == [batch[-1]]
