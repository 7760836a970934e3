"""Bytes → lines: the engine's output split on `\\n` and `\\r` (tqdm redraws), each line bounded. Pure."""

from __future__ import annotations

MAX_LINE_BYTES = 64 * 1024
TRUNCATED_MARK = " [...line cut by sglang-supervisor]"


# --------------------------------------------------------------------------------------------
# Bytes → lines
# --------------------------------------------------------------------------------------------


class LineSplitter:
    """Split a byte stream on `\\n` and `\\r`; empty frames are dropped.

    A line longer than `max_line` bytes is cut (its end marked) and the rest of it discarded up
    to the next line end, so a runaway writer can never make us buffer without limit.
    """

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_line
        self._discarding = False

    def feed(self, data: bytes) -> list[str]:
        # Whole-chunk work in C (replace, find, decode, split) instead of a Python step per line:
        # only the partial lines at the two ends of a chunk go through the buffer.
        out: list[str] = []
        if not data:
            return out
        if b"\r" in data:
            data = data.replace(b"\r", b"\n")
        first = data.find(b"\n")
        if first < 0:
            self._append(data, out)
            return out
        self._append(data[:first], out)
        self._end_line(out)
        last = data.rfind(b"\n")
        if last > first:
            body = data[first + 1 : last]
            if len(body) <= self._max:
                # No line in it can be too long. `\n` never belongs to a UTF-8 sequence, so one
                # decode of the whole body equals a decode of each line.
                out += [line for line in body.decode("utf-8", errors="replace").split("\n") if line]
            else:
                for piece in body.split(b"\n"):
                    if len(piece) > self._max:
                        out.append(piece[: self._max].decode("utf-8", errors="replace") + TRUNCATED_MARK)
                    elif piece:
                        out.append(piece.decode("utf-8", errors="replace"))
        if last + 1 < len(data):
            self._append(data[last + 1 :], out)
        return out

    def flush(self) -> list[str]:
        out: list[str] = []
        self._end_line(out)
        return out

    def _append(self, chunk: bytes, out: list[str]) -> None:
        if self._discarding or not chunk:
            return
        room = self._max - len(self._buf)
        if len(chunk) <= room:
            self._buf += chunk
            return
        self._buf += chunk[:room]
        out.append(self._buf.decode("utf-8", errors="replace") + TRUNCATED_MARK)
        self._buf.clear()
        self._discarding = True

    def _end_line(self, out: list[str]) -> None:
        if self._discarding:
            self._discarding = False
            return
        if self._buf:
            out.append(self._buf.decode("utf-8", errors="replace"))
            self._buf.clear()
