"""The engine's output pipes: drained by a dedicated thread that never blocks the engine.

Two pipes: the engine's stderr, where SGLang's own log goes (and the launcher's errors, tracebacks,
argparse, tqdm bars), and its stdout, where SGLang 0.5.8+ writes `--log-requests` records through
a handler of their own and uvicorn its access lines: text API users choose, dict keys unescaped
(docs/FAULTS.md). Only stderr is parsed; stdout is kept and forwarded, never read for an event.

Every byte of both goes (redacted) into the size-rotated engine log file, whole lines at a time
(`logmux`); the text is split into lines (`\\n` and `\\r`, so progress frames count as output),
stderr's parsed into `EngineEvent`s (a read of nothing but access and stat lines at once,
`LogParser.feed_run`) that are handed to the asyncio loop, and forwarded to the
supervisor's own log (journald/stdout) through a bounded queue that drops, and counts, rather than
waits when stdout is slow (the daemon's: the log sink's own queue, `forward_inline`; any other
callee: the pump's queue and forwarding thread). Forwarding works per read, not per line: a flood
of engine output is one hand-over and one write per 64 KiB, so the supervisor keeps up with it
instead of dropping most of it. A serving engine's chatter is read in paced batches (`_pace`).

Nothing here may stop reading either pipe: a full disk, a deleted log file or a stuck journald are
counted, never raised. A full pipe would freeze SGLang mid-capture.

Long because: the pump thread and what only it drives: the redactor of each stream, the rotating
byte log it writes (size rotation, full-disk spells) and its priority for forwarding; they share the
thread's contract of never blocking the engine and are tested together through the pump.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import selectors
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Protocol

from sglang_supervisor.core.events import (
    CaptureProgress,
    DecodeStats,
    DeprecatedFlag,
    EngineCrashed,
    EngineEvent,
    EngineFailed,
    LogOnStdout,
    PrefillStats,
    ServerReady,
    TracebackLine,
)
from sglang_supervisor.core.logmux import LineMux
from sglang_supervisor.core.logstats import settle_stats
from sglang_supervisor.core.logwatch import ServingRun
from sglang_supervisor.core.secretforms import expand
from sglang_supervisor.core.usagefold import USAGE_PREFIX, UsageFold
from sglang_supervisor.engine.patterns import looks_like_own_log
from sglang_supervisor.shell.engineproc.batchqueue import BatchQueue

READ_SIZE = 64 * 1024
REDACTED = b"***"
MIN_SECRET_LEN = 4  # same floor as logsetup: shorter strings would shred ordinary text
RETRY_AFTER_ERROR_S = 5.0  # after a failed write (disk full), try the file again this much later
PROGRESS_FORWARD_S = 5.0  # forward at most one `\r` progress frame this often (file keeps all)
IDLE_FLUSH_S = 0.5  # how often a partial line held for a whole-line log file is looked at (logmux)
# What may wait for the forwarder: enough to ride out a scheduling hiccup under a flood (~50 reads
# of serving output), and a byte cap so that huge lines cannot make it hundreds of megabytes.
FORWARD_QUEUE_LINES = 20_000
FORWARD_QUEUE_BYTES = 4 << 20
# Output that only moves the stall deadline or feeds the throughput window (no event, or only
# stat lines) is handed to the loop at most this often; any other event goes at once, with what
# was held before it, in order. A chatty engine flushes ~200 small writes a second, and a
# call_soon_threadsafe for each cost the supervisor more CPU than parsing the lines. The stall
# timer hears of such output this much late at most: nothing next to its seconds-long deadlines.
HAND_OVER_EVERY_S = 0.1
_PASSIVE = (DecodeStats, PrefillStats)
# A serving engine that writes a little, often (SGLang flushes each log record: stat lines, access
# lines) is read at most every COALESCE_S: one wake-up, one file write and one hand-over per pause
# (what a pause gathered is handed over with its read, so HAND_OVER_EVERY_S never splits a pause
# in two), not one per write. Only once the engine said it is ready (ServerReady passed through the
# pump): up to then each read goes at once, so the startup's events (capture, ready) are never held.
# Then output after a quiet spell is still read at once (a lone crash line is never held); one amid
# the chatter waits COALESCE_S at most: HAND_OVER_EVERY_S less a margin for the read, its parse and
# the hand-over (a paced read is under a quarter of READ_SIZE, ~128 lines: about a millisecond of
# work on a slow core, so 5 ms of margin). The rounds are most of what a chatty engine costs: each
# wakes the reader, writes the file and stats it, hands over and wakes the loop, and after a pause
# the same lines cost the parser ~1.7x what they cost back to back (bench/parse_cost.py: caches
# and the core's clock gone cold), whatever is saved per line (issue 26: 0.05 s cost ~0.2 % of a
# core more than 0.08 s at 1000 lines/s). A read of a quarter of READ_SIZE or more is never paused
# on, and only pipes the kernel let us widen to PIPE_BYTES are paused on at all: the engine must
# never find its pipe full.
COALESCE_S = 0.095
COALESCE_MIN_PIPE = 256 << 10
# forward_inline gets the lines with a hand-over to the loop that carries an event other than stat
# lines (so the journal shows the engine's words before the supervisor's answer to them), at EOF,
# when FORWARD_EVERY_S passed since it last got any, or this many at once under a flood (the log
# writer then writes them at once instead of gathering a trickle itself). A serving engine's
# chatter thus wakes the log writer twice a second, not with every paced read (issue 26): its
# lines reach the journal up to this much late, in order; no event waits for them.
INLINE_BATCH_LINES = 256
FORWARD_EVERY_S = 0.5
PIPE_BYTES = 1 << 20

PRIORITY_ERROR = 3
PRIORITY_WARNING = 4
PRIORITY_INFO = 6


class Splitter(Protocol):
    def feed(self, data: bytes) -> list[str]: ...

    def flush(self) -> list[str]: ...


class Parser(Protocol):
    def feed_line(self, line: str) -> list[EngineEvent]: ...

    def finish(self) -> list[EngineEvent]: ...


# A parser may also read a read's lines at once, when they are all serving chatter (access and stat
# lines): `LogParser.feed_run`, None when they are not (then they go through `feed_line`).
RunFn = Callable[[list[str]], ServingRun | None]


# A forwarded line: (text, syslog priority, rank or None).
ForwardLine = tuple[str, int, str | None]
ForwardFn = Callable[[str, int, str | None], None]
ForwardBatchFn = Callable[[list[ForwardLine]], None]


# ------------------------------------------------------------------------------ redaction

class StreamRedactor:
    """Replaces secrets in a byte stream, even when one straddles two reads.

    Only a tail that could be the start of a secret is held back, so the file is not left
    behind by more than a partial secret when the engine goes quiet.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = sorted(
            {s.encode() for s in expand(secrets) if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        if not self._secrets:
            return data
        buf = self._held + data
        for s in self._secrets:
            buf = buf.replace(s, REDACTED)
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep:] if keep else b""
        return buf[:len(buf) - keep] if keep else buf

    def flush(self) -> bytes:
        out, self._held = self._held, b""
        return out

    def _partial_tail(self, buf: bytes) -> int:
        best = 0
        for s in self._secrets:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best


# ------------------------------------------------------------------------------ the file

# Errors after which the open file is simply tried again with the next output: space may come back
# at any moment, and every byte that fits then must land in the file.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


@dataclass(frozen=True)
class LogWriteState:
    """A change in whether the engine log can be written, reported by `RotatingByteLog`.

    `ok` False starts a spell of failed writes (disk full, quota, a directory gone); True ends it.
    `dropped_bytes`: output not written since the previous report; `seconds`: the length of the
    spell that ended."""

    path: str
    ok: bool
    error: str | None = None
    dropped_bytes: int = 0
    seconds: float = 0.0


class RotatingByteLog:
    """Append-only byte log rotated by size (`path`, `path.1` ... `path.N`). Never raises.

    `on_state(LogWriteState)` is called (on the writing thread) when writes start or stop failing,
    and at close with bytes dropped since the last report. After a spell of failed writes a line
    in the file says how many bytes are missing there."""

    def __init__(self, path: str | Path, max_bytes: int, backups: int,
                 clock: Callable[[], float] = time.monotonic,
                 on_state: Callable[[LogWriteState], None] | None = None) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.errors = 0
        self.dropped_bytes = 0
        self.last_error: str | None = None
        self._clock = clock
        self._fh: int | None = None
        self._size = 0
        self._ident: tuple[int, int] | None = None
        self._retry_at = 0.0
        self._on_state = on_state
        self._ok: bool | None = None  # the last outcome reported; None before the first write
        self._reported_dropped = 0
        self._spell_began = 0.0
        self._spell_dropped = 0
        self._ends_line = True  # the last byte written was a newline (or nothing was written)

    def _open(self) -> bool:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            self._fail(exc)
            return False
        st = os.fstat(fd)
        self._fh, self._size, self._ident = fd, st.st_size, (st.st_dev, st.st_ino)
        return True

    def _close(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                os.close(self._fh)
        self._fh = None

    def _fail(self, exc: OSError) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self._close()
        self._retry_at = self._clock() + RETRY_AFTER_ERROR_S

    def _still_ours(self) -> bool:
        """False when the file was deleted or replaced (logrotate, an operator's rm)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._ident

    def _rotate(self) -> None:
        self._close()
        try:
            if self.backups > 0:
                for i in range(self.backups - 1, 0, -1):
                    older = self.path.with_name(f"{self.path.name}.{i}")
                    if older.exists():
                        os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
                os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
            else:
                os.truncate(self.path, 0)
        except OSError as exc:
            self._fail(exc)

    def write(self, data: bytes) -> None:
        if not data:
            return
        now = self._clock()
        if self._fh is None and now < self._retry_at:
            self.dropped_bytes += len(data)
            return
        before = self.dropped_bytes
        if self._ok is False and self._write_all(self._gap_note()) is not None:
            self.dropped_bytes = before + len(data)  # still no room, not even for the note
            return
        failed = self._write_all(data)
        self._report(failed is None, failed, now, before)

    def _gap_note(self) -> bytes:
        lead = b"" if self._ends_line else b"\n"
        return lead + (f"[sglang-supervisor] {self.dropped_bytes - self._spell_dropped} bytes of "
                       f"engine output are missing here: {self.last_error}\n").encode()

    def _report(self, ok: bool, error: str | None, now: float, dropped_before: int) -> None:
        if ok == self._ok:
            return
        if not ok:
            self._spell_began, self._spell_dropped = now, dropped_before
        seconds = 0.0 if not ok or self._ok is None else round(now - self._spell_began, 3)
        self._ok = ok
        self._emit(LogWriteState(str(self.path), ok, error, self._unreported(), seconds))

    def _unreported(self) -> int:
        dropped, self._reported_dropped = (self.dropped_bytes - self._reported_dropped,
                                           self.dropped_bytes)
        return dropped

    def _emit(self, state: LogWriteState) -> None:
        if self._on_state is not None:
            with contextlib.suppress(Exception):  # a broken callback must not stop the pipe
                self._on_state(state)

    def _write_all(self, data: bytes) -> str | None:
        """Write `data` (all of what fits); None when all of it was written, else the error."""
        # One stat per read (at most 64 KiB) is cheap next to the write, and catches a deletion
        # (logrotate, an operator's rm) on the very next output.
        if self._fh is not None and not self._still_ours():
            self._close()
        if self._fh is not None and self._size > 0 and self._size + len(data) > self.max_bytes:
            self._rotate()
        if self._fh is None and not self._open():
            self.dropped_bytes += len(data)
            return self.last_error or "cannot open"
        assert self._fh is not None
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fh, view)
                if n:
                    self._ends_line = view[n - 1] == 0x0A
                view = view[n:]
                self._size += n
        except OSError as exc:
            self.dropped_bytes += len(view)
            if exc.errno in _NO_SPACE:  # keep the file open: the next output tries again
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
            else:
                self._fail(exc)
            return self.last_error
        return None

    def close(self) -> None:
        if self._ok is False and self.dropped_bytes > self._reported_dropped:
            self._emit(LogWriteState(str(self.path), False, None, self._unreported()))
        self._close()


# ------------------------------------------------------------------------------ the pump

def _pipe_size(fd: int) -> int:
    """Widen pipe `fd` to PIPE_BYTES where allowed; its size now (not a pipe: READ_SIZE)."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    get_size = getattr(fcntl, "F_GETPIPE_SZ", None)
    if set_size is None or get_size is None:
        return READ_SIZE
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, set_size, PIPE_BYTES)  # refused above /proc/sys/fs/pipe-max-size
    try:
        return int(fcntl.fcntl(fd, get_size))
    except OSError:
        return READ_SIZE


@dataclass
class PumpStats:
    bytes: int = 0
    lines: int = 0
    events: int = 0
    forwarded: int = 0
    forward_dropped: int = 0
    internal_errors: int = 0


_ERROR_EVENTS = (EngineFailed, EngineCrashed, TracebackLine)
_PRIORITY_BY_TYPE: dict[type[EngineEvent], int] = {}


def _event_priority(kind: type[EngineEvent]) -> int:
    prio = _PRIORITY_BY_TYPE.get(kind)
    if prio is None:
        prio = (PRIORITY_ERROR if issubclass(kind, _ERROR_EVENTS)
                else PRIORITY_WARNING if issubclass(kind, DeprecatedFlag) else PRIORITY_INFO)
        _PRIORITY_BY_TYPE[kind] = prio
    return prio


def line_priority(events: Sequence[EngineEvent]) -> int:
    """Errors and tracebacks at error priority, deprecation warnings at warning."""
    return min((_event_priority(type(e)) for e in events), default=PRIORITY_INFO)


@dataclass
class _Stream:
    index: int
    fd: int
    splitter: Splitter
    redactor: StreamRedactor
    parsed: bool  # False: the engine's stdout, user text; kept and forwarded, never parsed


class EngineLogPump:
    """Reads `fd` (the engine's stderr) and `echo_fd` (its stdout, if given) until EOF in its own
    thread; see the module docstring. Lines of `echo_fd` are never given to `parser`.

    `on_output(events)` runs on `loop` for output of either (even with no events: any output
    resets the stall timer): at once for a read with an event other than stat lines, else at most
    every HAND_OVER_EVERY_S (or with each paced read, COALESCE_S apart) with everything read
    since, in order; `on_eof()` runs on `loop` after
    the last read of both, and after the last `on_output`. Forwarded lines
    go, in order, to `forward_batch(lines)` once per batch, or to `forward(text, priority, rank)`
    once per line; both run on the pump's forwarding thread, never on the reader. Or they go to
    `forward_inline(lines)` on the reader itself, with no forwarding thread, once per
    FORWARD_EVERY_S at most unless an event other than stat lines or EOF comes first: only for a
    callee that never blocks (the daemon's background log sink, a bounded queue that drops), which
    saves a thread's wake-up per read. `wake_fd` (the pump closes it), readable once the
    engine's leader exited (its pidfd), ends the pauses of a chatty engine's paced reads
    (`_pace`), so that the output's end and EOF are read at once.
    """

    def __init__(
        self,
        fd: int,
        *,
        loop: asyncio.AbstractEventLoop,
        log: RotatingByteLog,
        splitter: Splitter,
        parser: Parser,
        on_output: Callable[[list[EngineEvent]], None],
        on_eof: Callable[[], None],
        echo_fd: int | None = None,
        echo_splitter: Splitter | None = None,
        secrets: Iterable[str] = (),
        forward: ForwardFn | None = None,
        forward_batch: ForwardBatchFn | None = None,
        forward_inline: ForwardBatchFn | None = None,
        wake_fd: int | None = None,
        forward_queue: int = FORWARD_QUEUE_LINES,
        forward_queue_bytes: int = FORWARD_QUEUE_BYTES,
        clock: Callable[[], float] = time.monotonic,
        name: str = "engine-log",
    ) -> None:
        if sum(f is not None for f in (forward, forward_batch, forward_inline)) > 1:
            raise ValueError("give the pump one of forward, forward_batch or forward_inline")
        if (echo_fd is None) != (echo_splitter is None):
            raise ValueError("give the pump echo_fd and echo_splitter together (one splitter a stream)")
        secrets = tuple(secrets)
        self._streams = [_Stream(0, fd, splitter, StreamRedactor(secrets), parsed=True)]
        if echo_fd is not None and echo_splitter is not None:
            self._streams.append(_Stream(1, echo_fd, echo_splitter, StreamRedactor(secrets), parsed=False))
        self._mux = LineMux(len(self._streams))
        self._loop = loop
        self._log = log
        self._parser = parser
        self._feed_run: RunFn | None = getattr(parser, "feed_run", None)
        self._on_output = on_output
        self._on_eof = on_eof
        self._forward_line = forward
        self._forward_batch = forward_batch
        self._forward_inline = forward_inline
        self._forwarding = forward is not None or forward_batch is not None or forward_inline is not None
        self._queue: BatchQueue[ForwardLine] = BatchQueue(forward_queue, forward_queue_bytes)
        self._clock = clock
        self._last_progress = -PROGRESS_FORWARD_S
        # stdout is read for one fact only: SGLang's own lines there while stderr has said
        # nothing we parse (its log was sent to stdout); told once (LogOnStdout)
        self._stderr_spoke = False
        self._told_log_on_stdout = False
        self._usage = UsageFold()  # SGLang's usage text reaches the journal folded (core/usagefold.py)
        self._held: list[EngineEvent] = []  # passive events not handed to the loop yet
        self._holding = False  # output (with or without events) the loop has not heard of
        self._last_hand_over = -HAND_OVER_EVERY_S
        self._inline_held: list[ForwardLine] = []  # for forward_inline (FORWARD_EVERY_S)
        self._last_forward = -FORWARD_EVERY_S
        self._init_pacing([fd] if echo_fd is None else [fd, echo_fd], wake_fd)
        self.stats = PumpStats()
        self._reader = threading.Thread(target=self._read_loop, name=name, daemon=True)
        self._forwarder = threading.Thread(target=self._forward_loop, name=f"{name}-forward",
                                           daemon=True)

    def _init_pacing(self, fds: list[int], wake_fd: int | None) -> None:
        """The state of `_pace`: pipes widened, nothing chatty yet."""
        self._chatty = False  # output comes often and little at a time: read it in batches
        self._last_round = -COALESCE_S
        pipe = min(_pipe_size(f) for f in fds)
        self._coalesce_below = READ_SIZE // 4 if pipe >= COALESCE_MIN_PIPE else 0
        self._serving = False  # ServerReady passed: from now on a chatty engine is read in batches
        self._wake_fd = wake_fd  # readable: the engine is ending, pause no more (the pump closes it)
        self._pause: selectors.BaseSelector | None = None
        self._paced = False  # the last round's reads came out of a coalescing pause

    def start(self) -> None:
        if self._forwarding and self._forward_inline is None:
            self._forwarder.start()
        self._reader.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for EOF to be processed; True when the reader finished."""
        self._reader.join(timeout)
        return not self._reader.is_alive()

    def join_forwarder(self, timeout: float | None = None) -> bool:
        """After `join`: wait until every queued line went to forward; True when it has (a stuck
        forward can hold the last batch for as long as it is stuck)."""
        if not self._forwarder.is_alive():
            return True
        self._forwarder.join(timeout)
        return not self._forwarder.is_alive()

    @property
    def log_errors(self) -> int:
        return self._log.errors

    @property
    def log_dropped_bytes(self) -> int:
        return self._log.dropped_bytes

    # -- threads ------------------------------------------------------------------------

    def _read_loop(self) -> None:
        try:
            if self._wake_fd is not None:
                with contextlib.suppress(OSError, ValueError):
                    pause = selectors.DefaultSelector()
                    pause.register(self._wake_fd, selectors.EVENT_READ)
                    self._pause = pause
            with selectors.DefaultSelector() as sel:
                for st in self._streams:
                    try:
                        sel.register(st.fd, selectors.EVENT_READ, st)
                    except (OSError, ValueError):
                        self._chunk(st, b"", final=True)
                while sel.get_map():
                    got = 0
                    for key, _ in self._select(sel):
                        st = key.data
                        try:
                            data = os.read(st.fd, READ_SIZE)
                        except InterruptedError:
                            continue
                        except OSError:
                            data = b""
                        if not data:
                            sel.unregister(st.fd)
                        got = max(got, len(data))
                        self._chunk(st, data, final=not data)
                    self._pace(got)
                    if self._mux.holding():
                        self._log.write(self._mux.idle(self._clock()))
                    if self._holding and (self._paced
                                          or self._clock() - self._last_hand_over >= HAND_OVER_EVERY_S):
                        self._hand_over()
                    if self._inline_held and self._clock() - self._last_forward >= FORWARD_EVERY_S:
                        self._flush_inline()
        finally:
            if self._holding:
                self._hand_over()
            self._flush_inline()
            self._log.close()
            for st in self._streams:
                with contextlib.suppress(OSError):
                    os.close(st.fd)
            if self._pause is not None:
                self._pause.close()
            if self._wake_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._wake_fd)
            self._queue.close()  # the forwarder writes what is queued, then ends
            self._to_loop(self._on_eof)

    def _select(self, sel: selectors.BaseSelector) -> list[tuple[selectors.SelectorKey, int]]:
        """The streams with output (or EOF). A chatty engine (see `_pace`) is let write for up
        to COALESCE_S first, so that one wake-up reads what several of its writes brought; what
        such a round read is handed over with it (`_paced`)."""
        self._paced = False
        if self._chatty:
            wait = self._wait()
            pause = COALESCE_S if wait is None else min(COALESCE_S, wait)
            if self._pause is None:
                time.sleep(pause)
            elif self._pause.select(pause):  # the leader exited: read on to EOF without pauses
                self._coalesce_below = 0
            ready = sel.select(0)
            if ready:
                self._paced = True
                return ready
            self._chatty = False  # it went quiet: the next output is read the moment it comes
        return sel.select(self._wait())

    def _pace(self, got: int) -> None:
        """After a round of reads of at most `got` bytes each: chatty when this round came less
        than COALESCE_S after the previous one, or out of a coalescing pause, with little in
        it. A flood (a read near the pipe's size) is read at once, never paused on: the pipe
        must not fill. Output after a quiet spell is read at once, an event in it too."""
        now = time.monotonic()
        self._chatty = (self._serving and got < self._coalesce_below
                        and (self._chatty or now - self._last_round < COALESCE_S))
        self._last_round = now

    def _wait(self) -> float | None:
        """How long to wait for output: for ever, unless a partial line waits for a quiet stream
        or held output for its hand-over."""
        waits = [IDLE_FLUSH_S] if self._mux.holding() else []
        if self._holding:
            waits.append(max(0.0, self._last_hand_over + HAND_OVER_EVERY_S - self._clock()))
        if self._inline_held:
            waits.append(max(0.0, self._last_forward + FORWARD_EVERY_S - self._clock()))
        return min(waits, default=None)

    def _note_output(self, events: list[EngineEvent]) -> None:
        """Output was read: hand it (and what is held) to the loop now if it carries an event
        that matters or the last hand-over is old enough, else hold it. The engine's ready line
        starts the paced reads of a serving engine (`_pace`)."""
        self._held += events
        self._holding = True
        if not self._serving and any(isinstance(e, ServerReady) for e in events):
            self._serving = True
        urgent = any(not isinstance(e, _PASSIVE) for e in events)
        if urgent or self._clock() - self._last_hand_over >= HAND_OVER_EVERY_S:
            self._hand_over(urgent)

    def _hand_over(self, urgent: bool = False) -> None:
        """What is held to the loop; the forwarded lines with it when `urgent` (an event other
        than stat lines) or FORWARD_EVERY_S passed."""
        if urgent or self._clock() - self._last_forward >= FORWARD_EVERY_S:
            self._flush_inline()
        held, self._held = self._held, []
        self._holding = False
        self._last_hand_over = self._clock()
        self._to_loop(self._on_output, held)

    def _chunk(self, st: _Stream, raw: bytes, final: bool) -> None:
        try:
            self.stats.bytes += len(raw)
            data = st.redactor.feed(raw) if raw else b""
            if final:
                data += st.redactor.flush()
            out = self._mux.feed(st.index, data, self._clock())
            if final:
                out += self._mux.close(st.index)
            self._log.write(out)
            lines = st.splitter.feed(data) if data else []
            if final:
                lines += st.splitter.flush()
            self.stats.lines += len(lines)
            events = self._parse(lines, len(data), st.parsed)
            if final and st.parsed:  # a traceback block still open at EOF is closed (and classified) now
                events += self._parser.finish()
                if self._forwarding and self._usage.folding:
                    note: list[ForwardLine] = [(text, PRIORITY_INFO, None) for text in self._usage.end()]
                    if note:
                        self._put_forward(note, 0)
            self.stats.events += len(events)
            if raw or events:
                self._note_output(events)
        except Exception:  # a parser bug must not stop the pipe from draining
            self.stats.internal_errors += 1
            if raw:
                self._note_output([])

    def _parse(self, lines: list[str], size: int, parsed: bool = True) -> list[EngineEvent]:
        """Parse one read's lines (not `parsed`: forward them only); queue those to forward as one
        batch."""
        events: list[EngineEvent] = []
        if not parsed:
            if not self._stderr_spoke and not self._told_log_on_stdout and any(
                    looks_like_own_log(line) for line in lines):
                self._told_log_on_stdout = True
                events.append(LogOnStdout(0, None))
            if self._forwarding:
                echoes: list[ForwardLine] = [(line, PRIORITY_INFO, None) for line in lines
                                             if line and not line.isspace()]
                if echoes:
                    self._put_forward(echoes, size)
            return events
        try:
            return self._parse_stderr(lines, size, events)
        finally:
            self._stderr_spoke = self._stderr_spoke or bool(events)

    def _parse_stderr(self, lines: list[str], size: int, events: list[EngineEvent]
                      ) -> list[EngineEvent]:
        run = (self._feed_run(lines) if self._feed_run is not None and not self._usage.folding
               else None)
        if run is not None:  # a serving engine's chatter: one regex, not a parse a line (issue 26)
            events += run.events
            if self._forwarding and lines:
                self._put_forward([(line, PRIORITY_INFO, None) for line in lines] if run.ranks is None
                                  else list(zip(lines, repeat(PRIORITY_INFO), run.ranks)), size)
            return events
        feed_line = self._parser.feed_line
        if not self._forwarding:
            for line in lines:
                events += feed_line(line)
            return settle_stats(events)
        batch: list[ForwardLine] = []
        append = batch.append
        fold = self._usage
        try:
            for line in lines:
                line_events = feed_line(line)
                if not line_events:
                    # Most output (access lines, progress text, warnings SGLang lets through) has
                    # no event: plain info, no rank, no lookups.
                    if line and not line.isspace():
                        if fold.folding or line.startswith(USAGE_PREFIX):
                            batch += [(text, PRIORITY_INFO, None) for text in fold.take(line)]
                            continue
                        append((line, PRIORITY_INFO, None))
                    continue
                if fold.folding:
                    batch += [(text, PRIORITY_INFO, None) for text in fold.end()]
                events += line_events
                if not line or line.isspace():
                    continue
                if len(line_events) == 1:  # the usual case, without the generic walk
                    event = line_events[0]
                    kind = type(event)
                    prio = _PRIORITY_BY_TYPE.get(kind)
                    if prio is not None and kind is not CaptureProgress:
                        append((line, prio, event.rank))
                        continue
                item = self._forward_item(line, line_events)
                if item is not None:
                    append(item)
        finally:  # what was parsed before a parser bug is still forwarded, in order
            if batch:
                self._put_forward(batch, size)
        return settle_stats(events)

    def _forward_item(self, line: str, events: list[EngineEvent]) -> ForwardLine | None:
        if all(isinstance(e, CaptureProgress) for e in events):
            now = self._clock()
            if now - self._last_progress < PROGRESS_FORWARD_S:
                return None
            self._last_progress = now
        rank = next((e.rank for e in events if e.rank is not None), None)
        return line, line_priority(events), rank

    def _put_forward(self, batch: list[ForwardLine], size: int) -> None:
        """One read's forwarded lines: queued for the forwarding thread, or held for `forward_inline`
        (on this thread), which gets them with the next hand-over to the loop (or INLINE_BATCH_LINES
        at a time): one hand-over to the log writer per pause, not one per read."""
        if self._forward_inline is None:
            self.stats.forward_dropped += self._queue.put(batch, size)
            return
        self._inline_held += batch
        if len(self._inline_held) >= INLINE_BATCH_LINES:
            self._flush_inline()

    def _flush_inline(self) -> None:
        batch, self._inline_held = self._inline_held, []
        self._last_forward = self._clock()
        if not batch or self._forward_inline is None:
            return
        try:
            self._forward_inline(batch)
            self.stats.forwarded += len(batch)
        except Exception:
            self.stats.internal_errors += 1

    def _forward_loop(self) -> None:
        while True:
            items, closed = self._queue.take()
            if items:
                self._send(items)
            if closed:
                return

    def _send(self, items: list[ForwardLine]) -> None:
        if self._forward_batch is not None:
            try:
                self._forward_batch(items)
                self.stats.forwarded += len(items)
            except Exception:
                self.stats.internal_errors += 1
            return
        assert self._forward_line is not None
        for item in items:
            try:
                self._forward_line(*item)
                self.stats.forwarded += 1
            except Exception:
                self.stats.internal_errors += 1

    def _to_loop(self, fn: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: we are shutting down
            self._loop.call_soon_threadsafe(fn, *args)
