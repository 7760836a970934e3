"""A saved engine log → the runs in it (one per SGLang start), each parsed on its own. Pure.

An engine log file kept across restarts holds several runs; summarising them as one pairs one
run's capture begin with another's end and prints READY beside a later run's failure. A run
starts at SGLang's first line of a launch: the launcher's `server_args=...` dump, or argparse's
`usage:` (a launch that failed on its flags prints no server_args). Lines before the first start
belong to the first run; the few warnings Python prints before a later run's server_args dump
count to the run before it (they carry no state the summary reads).

Line numbers count `\\n` as `wc -l` and editors do: the `\\r` frames of a progress bar are
parsed as separate lines (as the daemon does) but numbered by the line they sit on.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

from sglang_supervisor.core.events import EngineEvent
from sglang_supervisor.core.linesplit import MAX_LINE_BYTES, TRUNCATED_MARK
from sglang_supervisor.core.logwatch import LogParser
from sglang_supervisor.engine import patterns as P

_ENDS = re.compile(rb"[\r\n]")
# argparse's usage line, with or without a log header in front (a wrapper may add one).
_USAGE = re.compile(r"^(?:\[[^\]]*\] ?)?usage: ")


@dataclass(frozen=True)
class Run:
    index: int  # 1-based, in file order
    first_line: int
    last_line: int
    events: list[EngineEvent]
    text_request_records: int = 0  # --log-requests records in a text form (dict keys unescaped)


class NumberedSplitter:
    """Bytes → (line number, frame): frames split on `\\n` and `\\r` (empty ones dropped), the
    number counting `\\n` only. A frame longer than `max_line` bytes is cut and marked, the rest
    of it skipped, as LineSplitter does."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_line
        self._cut = False
        self._line = 1

    def feed(self, data: bytes) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        start = 0
        for m in _ENDS.finditer(data):
            self._append(data[start : m.start()])
            self._end(out)
            if m.group() == b"\n":
                self._line += 1
            start = m.end()
        self._append(data[start:])
        return out

    def flush(self) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        self._end(out)
        return out

    def _append(self, chunk: bytes) -> None:
        if self._cut or not chunk:
            return
        room = self._max - len(self._buf)
        if len(chunk) > room:
            self._buf += chunk[: max(room, 0)]
            self._cut = True
        else:
            self._buf += chunk

    def _end(self, out: list[tuple[int, str]]) -> None:
        if self._buf:
            text = self._buf.decode("utf-8", errors="replace")
            out.append((self._line, text + TRUNCATED_MARK if self._cut else text))
        self._buf.clear()
        self._cut = False


def is_run_start(frame: str) -> bool:
    if P.SERVER_ARGS_KEY in frame and P.SERVER_ARGS.search(frame) is not None:
        return True
    return "usage: " in frame and _USAGE.match(frame) is not None


class _RunBuilder:
    def __init__(self, index: int, first_line: int, version: str | None) -> None:
        self.index = index
        self.first_line = first_line
        self.last_line = first_line
        self.parser = LogParser(version)
        self.lines: list[int] = []  # the physical line of each frame fed, by the parser's count
        self.events: list[EngineEvent] = []
        self.started = False

    def feed(self, line_no: int, frame: str) -> None:
        self.lines.append(line_no)
        self.last_line = line_no
        self.events.extend(self.parser.feed_line(frame))

    def close(self) -> Run:
        self.events.extend(self.parser.finish())
        lines = self.lines

        def renumber(e: EngineEvent) -> EngineEvent:
            n = e.line_no
            return dataclasses.replace(e, line_no=lines[n - 1]) if 0 < n <= len(lines) else e

        return Run(self.index, self.first_line, self.last_line, [renumber(e) for e in self.events],
                   self.parser.text_echoes)


def scan_runs(read: Callable[[int], bytes], version: str | None = None, chunk: int = 1 << 20) -> list[Run]:
    """Every run in what `read(n)` returns until b"" (a file or stdin), in order. An empty input
    gives one empty run."""
    splitter = NumberedSplitter()
    runs: list[Run] = []
    current = _RunBuilder(1, 1, version)

    def take(frames: list[tuple[int, str]]) -> None:
        nonlocal current
        for line_no, frame in frames:
            if is_run_start(frame):
                if current.started:
                    runs.append(current.close())
                    current = _RunBuilder(len(runs) + 1, line_no, version)
                current.started = True
            current.feed(line_no, frame)

    while True:
        data = read(chunk)
        if not data:
            break
        take(splitter.feed(data))
    take(splitter.flush())
    runs.append(current.close())
    return runs
