"""The engine's two output streams into one log file, a whole line at a time. Pure.

SGLang writes its own log to stderr and (0.5.8+) its request records and uvicorn's access lines
to stdout; the supervisor reads the two through two pipes and keeps both in one engine log. A line
of one stream must never be cut by the other's bytes: `logscan` and anyone tailing the file read
lines. So each stream's unfinished line is held back until it ends (`\\n`, or `\\r` as the line
splitter counts a progress frame), grows past `max_held` (then written as it is), its stream ends,
or the stream has been quiet for `idle_s` (`idle`: a partial line is not hidden while the engine
hangs). When such a partial line was written and another stream's line comes next, a newline the
engine did not write closes it first; the partial line's continuation then starts a line of its
own. Nothing is dropped. With only one stream open, bytes pass straight through: the file is that
stream, byte for byte.
"""

from __future__ import annotations

MAX_HELD = 64 * 1024  # the line splitter's bound: a longer line is cut there anyway
IDLE_S = 1.0
_LINE_ENDS = frozenset(b"\n\r")


class LineMux:
    """`feed(stream, data, now)` returns the bytes to append to the file now, in call order."""

    def __init__(self, streams: int, *, max_held: int = MAX_HELD, idle_s: float = IDLE_S) -> None:
        self._held = [b""] * streams
        self._since = [0.0] * streams  # when each stream last gave bytes
        self._open = [True] * streams
        self._max = max_held
        self._idle = idle_s
        self._tail: int | None = None  # the stream whose unfinished line the file ends in

    def holding(self) -> bool:
        return any(self._held)

    def feed(self, stream: int, data: bytes, now: float) -> bytes:
        if not data:
            return b""
        self._since[stream] = now
        buf = self._held[stream] + data
        self._held[stream] = b""
        if sum(self._open) > 1:
            cut = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
            if len(buf) - cut <= self._max:
                buf, self._held[stream] = buf[:cut], buf[cut:]
        return self._emit(stream, buf)

    def idle(self, now: float) -> bytes:
        """The partial lines of streams quiet for `idle_s` or more."""
        return b"".join(self._release(s) for s in range(len(self._held))
                        if self._held[s] and now - self._since[s] >= self._idle)

    def close(self, stream: int) -> bytes:
        """The stream ended: what it still held."""
        self._open[stream] = False
        return self._release(stream)

    def _release(self, stream: int) -> bytes:
        data, self._held[stream] = self._held[stream], b""
        return self._emit(stream, data)

    def _emit(self, stream: int, data: bytes) -> bytes:
        if not data:
            return b""
        lead = b"\n" if self._tail is not None and self._tail != stream else b""
        self._tail = None if data[-1] in _LINE_ENDS else stream
        return lead + data
