#!/usr/bin/env python3
"""What one serving line costs the pump's parser, in a hot loop and as the pump meets it.

The pump reads a serving engine's chatter in paced rounds (`enginelog.COALESCE_S` apart, ~80 lines
each at 1000 lines/s); between rounds the thread sleeps and other processes (the engine, the event
loop) run on the core. This times the parse (and the settle of deferred stat lines) of 80-line
batches of the bench's serving corpus back to back, then with a pause after each batch: line by
line, with `defer_stats`, and a batch at once (`LogParser.feed_run`, the pump's way since issue 26's
sixth pass), on the thread's own CPU clock. Run from the repository root:

    .venv/bin/python bench/parse_cost.py            # ~20 s

Prints µs per line for each (way, pause) and the paused/hot ratio. Diagnostic only: bench/run
does not call it, and nothing asserts on its numbers.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import ingest  # bench/, this script's directory

from sglang_supervisor.core.events import EngineEvent
from sglang_supervisor.core.logstats import settle_stats
from sglang_supervisor.core.logwatch import LogParser

BATCH = 80  # lines of a paced round at 1000 lines/s
PAUSES = (0.0, 0.001, 0.01, 0.08)


def per_line_us(lines: list[str], pause: float, defer: bool, rounds: int, run: bool = False) -> float:
    parser = LogParser(defer_stats=defer)
    feed = parser.feed_line
    feed_run = getattr(parser, "feed_run", None) if run else None  # a commit before it: line by line
    spent = 0
    n = 0
    for r in range(rounds):
        start = (r * BATCH) % (len(lines) - BATCH)
        batch = lines[start:start + BATCH]
        t0 = time.thread_time_ns()
        if feed_run is None or feed_run(batch) is None:
            events: list[EngineEvent] = []
            for line in batch:
                events += feed(line)
            settle_stats(events)
        spent += time.thread_time_ns() - t0
        n += len(batch)
        if pause:
            time.sleep(pause)
    return spent / n / 1e3


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-parse-") as tmp:
        corpus = Path(tmp) / "serving.log"
        ingest.build_corpus(corpus, 20_000, serving_only=True)
        lines = corpus.read_text().splitlines()
    print(f"{len(lines)} serving lines, {BATCH}-line batches; µs per line (thread CPU time)")
    for label, defer, run in (("line by line", False, False), ("defer_stats", True, False),
                              ("feed_run", True, True)):
        hot = per_line_us(lines, 0.0, defer, 500, run)
        cells = [f"hot {hot:.2f}"]
        for pause in PAUSES[1:]:
            cost = per_line_us(lines, pause, defer, 60, run)
            cells.append(f"pause {pause * 1e3:g} ms {cost:.2f} ({cost / hot:.2f}x)")
        print(f"{label:12}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
