"""Logging setup: structlog events to journald-friendly stdout, JSON or a readable console.

Every supervisor event is one line: a stable event name plus key=value fields. Under systemd
(`journald` format) each line starts with a syslog priority prefix (`<4>`) that SyslogLevelPrefix=
(on by default) turns into the journal priority, so `journalctl -p warning` works. When the native
journal socket is there, events go to it as datagrams instead, so their fields (PROFILE=, PHASE=,
FAILURE_CLASS=...) become journal fields (`journalctl -o json`, `journalctl PHASE=ready`); any
failed send falls back to the stdout line.

Writing never raises and, in background mode, never blocks the caller: a closed or broken stdout
(journald gone) or a stuck reader (journald busy) must not stall or kill the supervisor. Lines
that cannot be written are counted (`dropped_lines()`).

Known secrets registered with `set_redactions` are replaced by `***` in everything written here,
supervisor events and forwarded engine output alike.

Long because: one process-wide structlog configuration: the three formats (journald with native
fields, JSON, console), the bounded background sink they all write through and the engine-line
forwarding that uses the same sink and redactions; every part reads the module state set by
configure_logging.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import logging
import os
import re
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from json.encoder import encode_basestring
from typing import IO, Any, Literal

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from sglang_supervisor.core.secretforms import expand
from sglang_supervisor.shell.engineproc.batchqueue import BatchQueue

LogFormat = Literal["auto", "journald", "json", "console"]
ResolvedFormat = Literal["journald", "json", "console"]

JOURNAL_SOCKET = "/run/systemd/journal/socket"
# journald cuts stdout lines at LineMax= (48 KiB); a megabyte engine line is kept whole in the
# engine log file, the journal gets its head.
MAX_ENGINE_LINE_CHARS = 16 * 1024
_QUEUE_LINES = 10_000
_COALESCE_S = 0.02
_COALESCE_BELOW = 64  # fewer lines than this pending: a trickle, worth gathering for _COALESCE_S
_REDACTED = "***"
_JOURNAL_SEND_TIMEOUT_S = 0.5
_MIN_SECRET_LEN = 4  # shorter "secrets" would shred ordinary text

# syslog priorities (sd-daemon.h): what SyslogLevelPrefix= and the journal's PRIORITY= mean.
PRIORITY = {
    "critical": 2,
    "exception": 3,
    "error": 3,
    "warning": 4,
    "warn": 4,
    "notice": 5,
    "info": 6,
    "debug": 7,
}
_LEVEL_NUM = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
              "error": logging.ERROR, "critical": logging.CRITICAL}
_PRIORITY_TO_LEVEL = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL, 3: logging.ERROR,
                      4: logging.WARNING, 5: logging.INFO, 6: logging.INFO, 7: logging.DEBUG}


# -- pure rendering ---------------------------------------------------------------------------

def _escape_controls(text: str) -> str:
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif not ch.isprintable() and ch != " ":
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                       else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


_NEEDS_QUOTES = re.compile(r'[ ="\\]')


def logfmt_value(value: object) -> str:
    """One logfmt value: bare when safe, else double-quoted; never contains a line break."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = value if type(value) is str else str(value)
    if text.isprintable():
        # The common case (engine lines, ordinary values) without a second pass over the text.
        if text and _NEEDS_QUOTES.search(text) is None:
            return text
        if "\\" in text:
            text = text.replace("\\", "\\\\")
        if '"' in text:
            text = text.replace('"', '\\"')
        return f'"{text}"'
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if '"' in text:
        text = text.replace('"', '\\"')
    return '"' + _escape_controls(text) + '"'


def _logfmt_key(key: str) -> str:
    return "".join(c if c.isprintable() and c not in ' ="' else "_" for c in key) or "_"


def render_logfmt(event: str, fields: Mapping[str, object]) -> str:
    """`event key=value ...` on one line; the event name comes first, unquoted when it can be."""
    head = _escape_controls(event).replace(" ", "_") or "-"
    parts = [head]
    parts.extend(f"{_logfmt_key(k)}={logfmt_value(v)}" for k, v in fields.items())
    return " ".join(parts)


def journal_value(value: object) -> str:
    """A field value as the message shows it, unquoted: `KILLED=true` matches `journalctl KILLED=true`."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def journal_field_name(key: str) -> str | None:
    """A structlog key as a journal field name (A-Z, 0-9, _; not starting with _ or a digit)."""
    name = "".join(c if c.isalnum() and c.isascii() else "_" for c in key.upper()).strip("_")
    if not name or name[0].isdigit() or len(name) > 64:
        return None
    return name


def encode_journal_fields(fields: Mapping[str, str]) -> bytes:
    """The native journal protocol: KEY=value lines, or KEY\\n<u64 le length>value for multi-line."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "backslashreplace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


# -- the sink: where rendered lines go --------------------------------------------------------

# A queued item: a plain line, or a native journal entry (its fields, or the datagram already
# encoded) with the line to write if it can't be sent.
_Item = str | tuple[Mapping[str, str] | bytes, str]

class _Sink:
    """Writes lines to a stream (optionally from a background thread) and, when enabled, journal
    datagrams. Never raises."""

    def __init__(self, stream: IO[str], background: bool, journal_socket: str | None) -> None:
        self._stream = stream
        # Raw descriptor writes leave nothing half-written in Python's buffers after an EPIPE (which
        # would otherwise resurface as an exception when the stream is flushed at exit).
        self._fd: int | None
        try:
            self._fd = stream.fileno()
            stream.flush()
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            self._fd = None
        self._lock = threading.Lock()
        self._broken = False
        self.dropped = 0
        self.redactions: tuple[str, ...] = ()
        self._journal: socket.socket | None = None
        self._journal_addr = journal_socket
        if journal_socket is not None:
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                # Datagrams are sent from the writer thread (background mode), so a short blocking
                # wait is harmless there and rides out bursts: the socket's queue can be as short
                # as 10 datagrams (net.unix.max_dgram_qlen) and a non-blocking send would turn
                # every burst into field-less stdout lines, out of order with the rest.
                sock.settimeout(_JOURNAL_SEND_TIMEOUT_S)
                self._journal = sock
            except OSError:
                self._journal = None
        self._queue: BatchQueue[_Item] | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._queue = BatchQueue(_QUEUE_LINES)
            self._thread = threading.Thread(target=self._drain, name="log-writer", daemon=True)
            self._thread.start()

    @property
    def native(self) -> bool:
        return self._journal is not None

    def redact(self, text: str) -> str:
        for secret in self.redactions:
            if secret in text:
                text = text.replace(secret, _REDACTED)
        return text

    def _send_journal(self, fields: Mapping[str, str] | bytes) -> bool:
        if self._journal is None or self._journal_addr is None:
            return False
        data = fields if isinstance(fields, bytes) else encode_journal_fields(fields)
        try:
            self._journal.sendto(data, self._journal_addr)
        except OSError:  # timeout (journald stuck), EMSGSIZE (huge line), ENOENT (journald gone)
            return False
        return True

    def emit(self, line: str, journal: Mapping[str, str] | None = None) -> None:
        """Write `line`, or send `journal` as native journal fields with `line` as the fallback.

        In background mode both go through the one queue, so they reach journald in order and a
        slow journald costs the writer thread a bounded wait, never the caller.
        """
        if self.redactions:
            line = self.redact(line)
            if journal is not None:
                journal = {k: self.redact(v) for k, v in journal.items()}
        item: _Item = line if journal is None or self._journal is None else (journal, line)
        self.emit_items([item])

    def emit_items(self, items: list[_Item]) -> None:
        """Write already redacted items, in order, with one hand-over to the writer thread."""
        q = self._queue
        if q is None:
            with self._lock:
                self._write_items(items)
            return
        self.dropped += q.put(items)

    def _write_items(self, items: list[_Item]) -> None:
        # Consecutive plain lines become one write (what the queue held: bounded by it; each
        # write gives the GIL away, and under a flood taking it back can cost a switch interval);
        # a datagram that cannot be sent becomes its fallback line in the same place.
        lines: list[str] = []
        for item in items:
            if isinstance(item, str):
                lines.append(item)
                continue
            fields, fallback = item
            if lines:  # what came before this datagram goes first
                self._write(lines)
                lines = []
            if not self._send_journal(fields):
                lines.append(fallback)
        if lines:
            self._write(lines)

    def _write(self, lines: list[str]) -> None:
        if self._broken:
            self.dropped += len(lines)
            return
        text = "\n".join(lines) + "\n"
        try:
            if self._fd is not None:
                # Whatever print() left in the stream's buffer goes first, to keep the order.
                with contextlib.suppress(OSError, ValueError):
                    self._stream.flush()
                data = memoryview(text.encode("utf-8", "backslashreplace"))
                while data:
                    data = data[os.write(self._fd, data):]
            else:
                self._stream.write(text)
                self._stream.flush()
        except (OSError, ValueError):  # EPIPE, EBADF, "I/O operation on closed file"
            self._broken = True
            self.dropped += len(lines)

    def _drain(self) -> None:
        q = self._queue  # close() may drop the attribute while a write is still blocked
        assert q is not None
        while True:
            items, closed = q.take()
            if not closed and len(items) < _COALESCE_BELOW:
                # A trickle: let it gather, so a chatty engine costs one wake-up and one write per
                # interval instead of one per line (the lines are only this much later). A burst
                # is written at once: sleeping on it would cap the rate at what one interval holds.
                time.sleep(_COALESCE_S)
                more, closed = q.take(timeout=0)
                items += more
            if items:
                self._write_items(items)
            if closed:
                return

    def close(self, timeout: float = 2.0) -> None:
        if self._queue is not None and self._thread is not None and self._thread.is_alive():
            self._queue.close()
            self._thread.join(timeout)
        self._queue = None  # anything logged after shutdown is written directly
        if self._journal is not None:
            self._journal.close()
            self._journal = None


class _SinkLogger:
    """The structlog "wrapped logger": receives the final renderer's output."""

    def __init__(self, sink: _Sink) -> None:
        self._sink = sink

    def msg(self, line: str, journal: Mapping[str, str] | None = None) -> None:
        self._sink.emit(line, journal)

    log = debug = info = warn = warning = notice = msg
    fatal = failure = err = error = critical = exception = msg


# -- structlog processors ---------------------------------------------------------------------

def _priority(event_dict: EventDict) -> int:
    return PRIORITY.get(str(event_dict.get("level", "info")), 6)


class _JournaldRenderer:
    def __init__(self, native: bool, identifier: str) -> None:
        self._native = native
        self._identifier = identifier

    def __call__(self, _: WrappedLogger, __: str, event_dict: EventDict) -> tuple[tuple[str], dict[str, Any]]:
        prio = _priority(event_dict)
        event = str(event_dict.pop("event", ""))
        event_dict.pop("level", None)
        message = render_logfmt(event, event_dict)
        kwargs: dict[str, Any] = {}
        if self._native:
            # The writer thread sends the datagram a little later; EVENT_TIME_USEC keeps when the
            # event happened (journald's own timestamp is when it arrived).
            fields = {"MESSAGE": message, "PRIORITY": str(prio), "SYSLOG_IDENTIFIER": self._identifier,
                      "EVENT": event, "EVENT_TIME_USEC": str(time.time_ns() // 1000)}
            for key, value in event_dict.items():
                name = journal_field_name(key)
                if name is not None and name not in fields:
                    fields[name] = journal_value(value)
            kwargs["journal"] = fields
        return (f"<{prio}>{message}",), kwargs


def _resolve(fmt: LogFormat, stream: IO[str], environ: Mapping[str, str]) -> ResolvedFormat:
    if fmt != "auto":
        return fmt
    if _is_journal_stream(stream, environ):
        return "journald"
    if _isatty(stream):
        return "console"
    return "json"


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (ValueError, OSError):
        return False


def _is_journal_stream(stream: IO[str], environ: Mapping[str, str]) -> bool:
    # systemd sets JOURNAL_STREAM=<dev>:<ino> of the stream it connected; a match means our stdout
    # really is that stream (not redirected by hand in a unit's shell wrapper).
    value = environ.get("JOURNAL_STREAM")
    if not value:
        return False
    try:
        dev_s, ino_s = value.split(":", 1)
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return True  # no descriptor to compare (e.g. wrapped in tests): trust the variable
    return stat.S_ISSOCK(st.st_mode) and str(st.st_dev) == dev_s and str(st.st_ino) == ino_s


# -- public API -------------------------------------------------------------------------------

class _State:
    fmt: ResolvedFormat = "console"
    sink: _Sink | None = None
    min_level: int = logging.INFO
    colors: bool = False
    identifier: str = "sglang-supervisor"
    # Engine line heads by (priority, rank); they depend on the settings, so those clear it.
    heads: dict[tuple[int, str | None], tuple[str, bytes]] = {}  # noqa: RUF012 - one instance


_state = _State()


def _processors(resolved: ResolvedFormat, sink: _Sink) -> list[Processor]:
    """structlog's processor chain for one output format."""
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
    ]
    if resolved == "journald":
        return [*shared, structlog.processors.format_exc_info,
                _JournaldRenderer(sink.native, _state.identifier)]
    if resolved == "json":
        return [*shared, structlog.processors.TimeStamper(fmt="iso", utc=True),
                # Never show_locals: a frame's locals may hold the API key.
                structlog.processors.ExceptionRenderer(
                    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)),
                structlog.processors.JSONRenderer(default=str)]
    return [*shared, structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(colors=_state.colors)]


def configure_logging(
    fmt: LogFormat = "auto",
    stream: IO[str] | None = None,
    *,
    level: str = "info",
    background: bool = False,
    native_journal: bool | None = None,
    environ: Mapping[str, str] | None = None,
    identifier: str | None = None,
    journal_socket: str = JOURNAL_SOCKET,
) -> ResolvedFormat:
    """Configure structlog for the whole process; returns the format actually chosen.

    `background=True` (the daemon) writes from a thread through a bounded queue, so a stuck
    journald can never block the main loop (excess lines are dropped and counted).
    `native_journal=None` uses the journal socket when the format is journald and systemd's journal
    is there; False never does (stdout lines only).
    """
    env = os.environ if environ is None else environ
    out = sys.stdout if stream is None else stream
    resolved = _resolve(fmt, out, env)
    if level not in _LEVEL_NUM:
        raise ValueError(f"log level {level!r} is not one of {', '.join(_LEVEL_NUM)}")
    use_native = (
        resolved == "journald"
        and native_journal is not False
        and (native_journal is True or (bool(env.get("JOURNAL_STREAM")) and os.path.exists(journal_socket)))
    )
    old = _state.sink
    sink = _Sink(out, background, journal_socket if use_native else None)
    if old is not None:
        sink.redactions = old.redactions
        old.close()
    _state.fmt = resolved
    _state.sink = sink
    _state.min_level = _LEVEL_NUM[level]
    _state.colors = resolved == "console" and _isatty(out)
    _state.identifier = identifier or os.path.basename(sys.argv[0] or "") or "sglang-supervisor"
    _state.heads = {}

    processors = _processors(resolved, sink)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_state.min_level),
        logger_factory=lambda *_: _SinkLogger(sink),
        cache_logger_on_first_use=False,
    )
    return resolved


def set_redactions(secrets: Iterable[str]) -> None:
    """Replace these strings by *** in everything written from now on (API keys...)."""
    if _state.sink is None:
        configure_logging()
    assert _state.sink is not None
    _state.sink.redactions = tuple(
        sorted({s for s in expand(secrets) if len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True)
    )
    _state.heads = {}


EngineLine = tuple[str, int, str | None]


def log_engine_line(text: str, priority: int = 6, rank: str | None = None) -> None:
    """Forward one line of engine output (marked source=engine), at syslog `priority`.

    No structlog processor chain. Never raises. Many lines: `log_engine_lines`.
    """
    log_engine_lines(((text, priority, rank),))


def log_engine_lines(lines: Sequence[EngineLine], max_priority: int = 7) -> None:
    """Forward lines of engine output `(text, priority, rank)`, in order, as `log_engine_line`
    does each, but formatted in one pass and handed to the writer at once (one lock, one queue
    put, one write; native journal: one datagram per line, as the protocol wants). Never raises.

    Lines of a priority above `max_priority` (less severe) are left out, as are those below the
    configured log level.
    """
    sink = _state.sink
    if sink is None:
        configure_logging()
        sink = _state.sink
        assert sink is not None
    if not lines:
        return
    if _state.fmt == "journald":
        items = _journald_items(lines, sink, max_priority)
    else:
        items = _other_items(lines, sink, max_priority)
    if items:
        sink.emit_items(items)


def background_logging() -> bool:
    """Whether a background writer takes what is logged (`configure_logging(background=True)`):
    then handing lines over never blocks the caller (a bounded queue that drops)."""
    sink = _state.sink
    return sink is not None and sink._queue is not None


def log_engine_lines_nowait(lines: Sequence[EngineLine], max_priority: int = 7) -> None:
    """`log_engine_lines` for a caller that must never block (the engine pipe's reader): with no
    background writer running (not configured so, or after `shutdown_logging`) the lines are
    dropped, and counted in `dropped_lines`, instead of written on the caller's thread."""
    sink = _state.sink
    if sink is None or sink._queue is None:
        if sink is not None:
            sink.dropped += len(lines)
        return
    log_engine_lines(lines, max_priority)


def _truncated(text: str) -> str:
    return f"{text[:MAX_ENGINE_LINE_CHARS]}… [truncated, {len(text)} chars in the engine log]"


def _engine_text(text: str, sink: _Sink) -> str:
    if sink.redactions:
        text = sink.redact(text)
    return _truncated(text) if len(text) > MAX_ENGINE_LINE_CHARS else text


_CONTROL_BYTES = bytes(range(0x20)) + b"\x7f"
_SKIP = ("", b"")  # a (priority, rank) below the configured level


def _plain_ascii(texts: list[str]) -> tuple[bool, bool]:
    """(every text is printable ASCII, some text holds a quote or backslash), for a whole batch.

    One C pass over the joined batch instead of an isprintable() and a regex per line: engine
    output is nearly all plain ASCII, and these checks were most of the cost of forwarding it.
    """
    joined = "".join(texts)
    if not joined.isascii():
        return False, True
    data = joined.encode("ascii")
    return len(data.translate(None, _CONTROL_BYTES)) == len(data), '"' in joined or "\\" in joined


def _journald_items(lines: Sequence[EngineLine], sink: _Sink, max_priority: int) -> list[_Item]:
    native = sink.native
    plain, escapes = _plain_ascii([line[0] for line in lines])
    # What depends only on (priority, rank) is built once, not once per line.
    heads = _state.heads
    if len(heads) > 1000:  # ranks are few; this only bounds a caller that invents them
        heads.clear()
    last_priority, last_rank, head = -1, None, _SKIP
    secrets = sink.redactions
    items: list[_Item] = []
    append = items.append
    for raw, priority, rank in lines:
        if priority != last_priority or rank != last_rank:  # runs of one kind are the rule
            last_priority, last_rank = priority, rank
            got = _SKIP if priority > max_priority else heads.get((priority, rank))
            if got is None:
                got = heads[(priority, rank)] = _journald_head(priority, rank, native, sink)
            head = got
        if head is _SKIP:
            continue
        text = sink.redact(raw) if secrets else raw
        if len(text) > MAX_ENGINE_LINE_CHARS:
            text = _truncated(text)
        # As logfmt_value(text), which the general branch calls, given what _plain_ascii found.
        if not plain:
            value = logfmt_value(text)
        elif escapes and ("\\" in text or '"' in text):
            value = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif not text or " " in text or "=" in text:
            value = f'"{text}"'
        else:
            value = text
        if native:
            append((_journal_message(text) + head[1], head[0] + value))
        else:
            append(head[0] + value)
    return items


def _journald_head(priority: int, rank: str | None, native: bool, sink: _Sink) -> tuple[str, bytes]:
    """The stdout line up to the text, and the journal fields after MESSAGE, for one priority/rank."""
    if _PRIORITY_TO_LEVEL.get(priority, logging.INFO) < _state.min_level:
        return _SKIP
    if rank is not None and sink.redactions:
        rank = sink.redact(rank)
    rank_part = "" if rank is None else f" rank={logfmt_value(rank)}"
    line_head = f"<{priority}>engine.output source=engine{rank_part} text="
    if not native:
        return line_head, b""
    fields = {"PRIORITY": str(priority), "SYSLOG_IDENTIFIER": _state.identifier,
              "SOURCE": "engine", "EVENT": "engine.output"}
    if rank is not None:
        fields["ENGINE_RANK"] = rank
    return line_head, encode_journal_fields(fields)


def _other_items(lines: Sequence[EngineLine], sink: _Sink, max_priority: int) -> list[_Item]:
    """JSON and console lines: formats for people and log shippers, not for floods."""
    now = time.time()
    stamp = f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(now))}.{int(now % 1 * 1e6):06d}Z"
    if _state.fmt == "json":
        return _json_items(lines, sink, max_priority, stamp)
    min_level = _state.min_level
    items: list[_Item] = []
    for raw, priority, raw_rank in lines:
        if priority > max_priority or _PRIORITY_TO_LEVEL.get(priority, logging.INFO) < min_level:
            continue
        text = _engine_text(raw, sink)
        rank = sink.redact(raw_rank) if raw_rank is not None and sink.redactions else raw_rank
        label = "engine" if rank is None else f"engine {rank}"
        line = f"[{label}] {_escape_controls(text)}"
        if _state.colors:
            color = "\x1b[31m" if priority <= 3 else "\x1b[33m" if priority == 4 else "\x1b[2m"
            line = f"{color}{line}\x1b[0m"
        items.append(line)
    return items


# json.dumps(record, ensure_ascii=False) of the record below, with its constant parts built once:
# the dict and the encoder's walk of it were most of the cost of forwarding a line as JSON. The
# strings go through the encoder's own string encoder, so the line is the same, byte for byte
# (tests/unit/shell/telemetry/test_logsetup.py compares the two).
_JSON_HEAD = '{"event": "engine.output", "source": "engine", "text": '


def _json_items(lines: Sequence[EngineLine], sink: _Sink, max_priority: int, stamp: str) -> list[_Item]:
    """Each engine line as the JSON record {event, source, text, [rank], level, timestamp}. What
    follows the text depends only on (priority, rank) within one batch, so it is built once a run of
    them (runs of one kind are the rule), not once a line (issue 26)."""
    min_level = _state.min_level
    secrets = sink.redactions
    stamp_part = f"{encode_basestring(stamp)}}}"
    items: list[_Item] = []
    append = items.append
    last_priority, last_rank, tail = -1, None, ""
    for raw, priority, raw_rank in lines:
        if priority != last_priority or raw_rank != last_rank:
            last_priority, last_rank = priority, raw_rank
            level = _PRIORITY_TO_LEVEL.get(priority, logging.INFO)
            if priority > max_priority or level < min_level:
                tail = ""
            else:
                rank = sink.redact(raw_rank) if raw_rank is not None and secrets else raw_rank
                rank_part = "" if rank is None else f', "rank": {encode_basestring(rank)}'
                name = encode_basestring(logging.getLevelName(level).lower())
                tail = f'{rank_part}, "level": {name}, "timestamp": {stamp_part}'
        if not tail:
            continue
        text = sink.redact(raw) if secrets else raw
        if len(text) > MAX_ENGINE_LINE_CHARS:
            text = _truncated(text)
        append(_JSON_HEAD + encode_basestring(text) + tail)
    return items


def _journal_message(text: str) -> bytes:
    if "\n" in text:
        return encode_journal_fields({"MESSAGE": text})
    return b"MESSAGE=" + text.encode("utf-8", "backslashreplace") + b"\n"


def dropped_lines() -> int:
    """Lines that could not be written (stdout broken, or the background queue full)."""
    return 0 if _state.sink is None else _state.sink.dropped


def shutdown_logging(timeout: float = 2.0) -> None:
    """Flush the background writer (bounded wait). Safe to call more than once."""
    if _state.sink is not None:
        _state.sink.close(timeout)


atexit.register(shutdown_logging)
