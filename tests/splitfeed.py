"""Feeding a `LineSplitter` the way a pipe delivers bytes: in pieces of arbitrary length.

`tests` is not a package: tests import this as `from splitfeed import feed_in_pieces` (see conftest.py).
"""

from __future__ import annotations

from sglang_supervisor.core.linesplit import LineSplitter


def feed_in_pieces(splitter: LineSplitter, data: bytes, cuts: list[int]) -> list[str]:
    """The lines `splitter` gives for `data` cut into pieces of the lengths `cuts` (the rest
    last), then flushed."""
    got: list[str] = []
    pos = 0
    for n in cuts:
        got += splitter.feed(data[pos : pos + n])
        pos += n
    return got + splitter.feed(data[pos:]) + splitter.flush()
