"""Engine output → lines → typed events. Pure: no I/O here.

`LineSplitter` (core/linesplit.py) turns raw bytes (as read from the engine's pipe or log file)
into lines, splitting on `\\n` and `\\r` (tqdm redraws). `LogParser` turns lines into
`events.EngineEvent`s, tolerating what users paste: missing timestamps, ANSI colours, progress
frames glued to real lines, wrapped lines, tracebacks. Log strings live in `engine.patterns`.

Long because: LogParser is one state machine (an open traceback block, a wrapped stats line waiting
for its rest, a request echo's continuation rows, draining) whose methods all read and change that
state; the module-level helpers are its guards. The line splitter, stat-line readers and whole-log
summary live in linesplit.py, logstats.py and logsummary.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    CaptureProgress,
    DecodeStats,
    DeprecatedFlag,
    Draining,
    EngineCrashed,
    EngineEvent,
    EngineFailed,
    FailureClass,
    GraphOwner,
    GraphPhase,
    HttpUp,
    KVCacheAllocated,
    PrefillGraphDisabled,
    PrefillStats,
    SchedulerReady,
    ServerArgsSeen,
    ServerReady,
    TracebackLine,
    WeightsLoadBegan,
    WeightsLoaded,
)
from sglang_supervisor.core.failures import rank as failure_rank
from sglang_supervisor.core.linesplit import MAX_LINE_BYTES, TRUNCATED_MARK, LineSplitter
from sglang_supervisor.core.logframing import unframe
from sglang_supervisor.core.logstats import StatLine, decode_stats, kept_from_end, prefill_stats

# The line splitter and the whole-log summary have their own modules; their names stay importable
# from here (the parser's one entry point for callers and tests that split, parse and summarise).
from sglang_supervisor.core.logsummary import LogSummary, root_failure, summarize
from sglang_supervisor.core.secretforms import expand
from sglang_supervisor.engine import patterns as P

__all__ = ["MAX_LINE_BYTES", "TRUNCATED_MARK", "LineSplitter", "LogParser", "LogSummary", "ServingRun",
           "parse_bytes", "parse_lines", "parse_server_args", "parse_stream", "redact", "root_failure",
           "summarize"]

# --------------------------------------------------------------------------------------------
# Redaction
# --------------------------------------------------------------------------------------------


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Remove API keys and bearer tokens SGLang prints, and any given literal secrets."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    if "api" in text or "API" in text or "Bearer" in text:
        for pattern, repl in P.REDACTIONS:
            text = pattern.sub(repl, text)
    return text


# --------------------------------------------------------------------------------------------
# Lines → events
# --------------------------------------------------------------------------------------------


@dataclass
class _Block:
    """A traceback or multi-line error being read; classified when it ends."""

    first_line: int
    rank: str | None
    scheduler: bool  # opened by "Scheduler hit an exception"
    capture_frames: bool = False
    draft_frames: bool = False
    prefill_frames: bool = False
    oom: bool = False
    # Printed right after a failed request's record (logger.exception): the request failed,
    # the engine did not; its lines are kept, but it never becomes an EngineFailed.
    request: bool = False
    best: tuple[FailureClass, int, str] | None = None
    last_exception: tuple[int, str] | None = None
    cut_frame: str | None = None  # a `File "..."` line a terminal wrapped before its `, in f`
    # Opened by `Traceback (most recent call last):` (not a logged error line), and the frames
    # read: a traceback cut before its exception line (the process killed while printing it, a
    # paste cut short) is still a failure, placed by its frames.
    traceback_start: bool = False
    frames: int = 0
    after_frame: bool = False  # the line before was a `File "..."` line: this one is its source


@dataclass
class _Capturing:
    owner: GraphOwner
    phase: GraphPhase


class LogParser:
    """Stateful parser of one engine run's output, line by line."""

    def __init__(self, version: str | None = None, secrets: Iterable[str] = (), *,
                 defer_stats: bool = False) -> None:
        self.version = version
        # A stat line read the fast way comes out as a `StatLine`, for a caller that settles each
        # batch (`logstats.settle_stats`) before anyone sees it: the engine log pump.
        self._defer_stats = defer_stats
        self._secrets = expand(secrets)  # every escaped spelling too
        self._line_no = 0
        self._block: _Block | None = None
        self._capturing: dict[str | None, _Capturing] = {}
        self._http_up = False
        self._ready = False
        self._draining = False
        self._prev_unmatched: tuple[int, str | None, str] | None = None
        self._echo_left = 0  # lines still read as the rest of an unclosed request echo
        # --log-requests records in a text form seen: their dict keys are printed raw, so in a
        # merged log (logscan) a line after one may be a user's (docs/FAULTS.md, "Residual risk").
        self.text_echoes = 0
        self._request_error_at = -1  # line of the last failed-request record

    @property
    def line_no(self) -> int:
        return self._line_no

    def feed_line(self, text: str) -> list[EngineEvent]:
        """Parse one line (without its line end). Never raises."""
        self._line_no += 1
        try:
            if self._echo_left:
                return self._echo_continuation(text)
            # Fast path for the bulk of a serving engine's output (a timestamped access log or
            # batch stats line outside a traceback): the same result as `_parse`, fewer steps.
            if self._block is None and "\x1b" not in text:
                first = text[:1]
                if first == "[":
                    m = _bracket_header(text)
                elif first.isdigit() or first.isspace():  # the *.timed.log lead
                    m = _header(text)
                else:
                    m = None
                if m is not None:
                    return self._headed(text[m.end() :], m.group(1), self._line_no)
            return self._parse(text, self._line_no)
        except Exception as exc:
            return [TracebackLine(self._line_no, None, f"[logwatch could not parse this line: {exc!r}]")]

    def feed_run(self, lines: list[str]) -> ServingRun | None:
        """A read's lines at once, when each is an access line or a stat line (`P.SERVING_RUN`)
        and no traceback or echo is open: what `feed_line` of each and `settle_stats` of their
        events give, for one regex over the read instead of a parse of each line (issue 26). None
        (nothing read: feed them line by line) otherwise, and for a parser that does not defer."""
        if not lines or not self._defer_stats or self._block is not None or self._echo_left:
            return None
        text = "\n".join(lines) + "\n"
        if text.count("\n") != len(lines) or "\x1b" in text:
            return None
        ranked = _serving_run(text) is None
        if ranked and _serving_run_ranked(text) is None:
            return None
        first = self._line_no + 1
        self._line_no += len(lines)
        last = lines[-1]
        m = _run_header(last)
        assert m is not None  # SERVING_RUN matched it
        self._prev_unmatched = (self._line_no, m.group(1).strip() or None, last[m.end():])
        events = kept_from_end(_stat_lines_back(lines, first))
        return ServingRun(events, _run_ranks(lines) if ranked else None)

    def _headed(self, msg: str, prefix: str, line_no: int) -> list[EngineEvent]:
        """A line with a log header, outside a traceback block (`_parse` → `_message`)."""
        rank = (prefix.strip() or None) if prefix else None
        if msg.startswith(P.ACCESS_LOG_PREFIX) and P.ACCESS_LOG_KEY in msg:
            self._prev_unmatched = (line_no, rank, msg)
            return []
        # A stats line may go on in the next line (a terminal wrapped it): keep it for a join.
        if msg.startswith(P.DECODE_KEY):
            stats: EngineEvent = (StatLine(line_no, rank, msg, False) if self._defer_stats
                                  else decode_stats(msg, rank, line_no))
            self._prev_unmatched = (line_no, rank, msg)
            return [stats]
        if msg.startswith(P.PREFILL_KEY):
            stats = (StatLine(line_no, rank, msg, True) if self._defer_stats
                     else prefill_stats(msg, rank, line_no))
            self._prev_unmatched = (line_no, rank, msg)
            return [stats]
        return self._message(msg, rank, line_no, headed=True)

    def finish(self) -> list[EngineEvent]:
        """End of output: close a pending traceback/error block."""
        return self._close_block()

    # -- internals ------------------------------------------------------------------------
    def _parse(self, text: str, line_no: int) -> list[EngineEvent]:
        if "\x1b" in text:
            text = P.ANSI.sub("", text)
        if not text.startswith("["):
            text = unframe(text)  # a viewer's borders or a wrapper's prefix (logframing)
        events: list[EngineEvent] = []
        m = P.HEADER.match(text)
        if m is None and "[" in text:
            glued = P.EMBEDDED_HEADER.search(text)
            if glued is not None and glued.start() > 0:
                events.extend(self._headerless(text[: glued.start()], line_no))
                text = text[glued.start() :]
                m = P.HEADER.match(text)
        if m is None:
            events.extend(self._headerless(text, line_no))
            return events
        rank = m.group(1).strip() or None
        message = text[m.end() :]
        if self._block is not None and not self._continues_block(message):
            events.extend(self._close_block())
        events.extend(self._message(message, rank, line_no, headed=True))
        return events

    def _continues_block(self, message: str) -> bool:
        # A logged error line right after a traceback belongs to it (breakable prefill errors
        # are logged with a timestamp, then their hint lines follow without one).
        return bool(P.EXCEPTION_LINE.match(message))

    def _headerless(self, text: str, line_no: int) -> list[EngineEvent]:
        stripped = text.strip()
        if not stripped:
            return []
        if _is_echo(stripped):  # an echo printed without a header is an echo all the same
            return self._echo(stripped)
        if stripped == P.KILLED_LINE:
            return self._crash(stripped, None, line_no)
        if self._block is not None:
            return self._in_block(text, stripped, line_no)
        if _is_progress(stripped):
            return [CaptureProgress(line_no, None, stripped[:200])]
        if stripped.startswith(P.TRACEBACK_START) or P.EXCEPTION_LINE.match(stripped):
            return self._message(stripped, None, line_no, headed=False)
        events = self._message(stripped, None, line_no, headed=False)
        prev = self._prev_unmatched
        # An indented line is a traceback's, except after a stats line: there it is the rest of
        # the line, wrapped at a space.
        if not events and prev is not None and (not text[:1].isspace() or _is_stats_line(prev[2])):
            # A long line wrapped by a terminal: parse it joined with the line before.
            prev_no, prev_rank, prev_msg = prev
            self._prev_unmatched = None
            rest = text.rstrip()
            joined = self._message(prev_msg + rest, prev_rank, prev_no, headed=True)
            if not joined:
                joined = self._message(prev_msg + " " + stripped, prev_rank, prev_no, headed=True)
            return joined
        return events

    def _message(self, msg: str, rank: str | None, line_no: int, *, headed: bool) -> list[EngineEvent]:
        if _is_echo(msg):
            return self._echo(msg)
        if msg.startswith(P.REQUEST_ERROR_PREFIXES):
            self._prev_unmatched = None
            self._request_error_at = line_no
            return []
        events = self._recognise(msg, rank, line_no)
        if headed:  # stats lines stay joinable: a terminal may have wrapped them (see _headed)
            self._prev_unmatched = None if events and not _may_go_on(events[0]) else (line_no, rank, msg)
        return events

    def _recognise(self, msg: str, rank: str | None, line_no: int) -> list[EngineEvent]:
        # Most frequent lines first; each branch is guarded by a substring test.
        if msg.startswith(P.ACCESS_LOG_PREFIX) and P.ACCESS_LOG_KEY in msg:
            return []
        if msg.startswith(P.DECODE_KEY):
            return [decode_stats(msg, rank, line_no)]
        if msg.startswith(P.PREFILL_KEY):
            return [prefill_stats(msg, rank, line_no)]
        if P.CAPTURE_KEY in msg:
            ev = self._capture(msg, rank, line_no)
            if ev is not None:
                return [ev]
        tb = self._traceback(msg, rank, line_no)
        if tb is not None:
            return tb
        if msg.startswith(P.CRASH_PREFIXES) or P.CHILD_CRASHED.match(msg):
            return self._crash(msg, rank, line_no)
        for key in P.DRAIN_KEYS:
            if key in msg:
                self._draining = True
                return [Draining(line_no, rank)]
        if msg.startswith(P.SERVER_ARGS_KEY):
            return [ServerArgsSeen(line_no, rank, parse_server_args(msg, self._secrets))]
        milestone = self._milestone(msg, rank, line_no)
        return milestone if milestone is not None else self._signature(msg, rank, line_no)

    def _traceback(self, msg: str, rank: str | None, line_no: int) -> list[EngineEvent] | None:
        """A traceback's first line opens a block (closing the one before); an exception line
        opens one too when none is open. None: not a traceback line."""
        tp_exception = msg.startswith(P.TP_EXCEPTIONS)
        if msg.startswith((P.SCHEDULER_EXCEPTION, P.TRACEBACK_START)) or tp_exception:
            if self._block is not None and msg.startswith(P.TRACEBACK_START):
                return [TracebackLine(line_no, rank, self._redact(msg))]  # a chained traceback
            closed = self._close_block()
            self._block = _Block(line_no, rank,
                                 scheduler=msg.startswith(P.SCHEDULER_EXCEPTION) or tp_exception,
                                 request=self._request_error_at == line_no - 1)
            self._block.traceback_start = msg.startswith(P.TRACEBACK_START)
            self._scan_block_line(msg, line_no)
            return [*closed, TracebackLine(line_no, rank, self._redact(msg))]
        if P.EXCEPTION_LINE.match(msg):
            if self._block is None:
                self._block = _Block(line_no, rank, scheduler=False,
                                     request=self._request_error_at == line_no - 1)
            self._scan_block_line(msg, line_no)
            return [TracebackLine(line_no, rank, self._redact(msg))]
        return None

    def _milestone(self, msg: str, rank: str | None, line_no: int) -> list[EngineEvent] | None:
        """Start-up's milestones (weights, KV cache, scheduler ready, HTTP up, READY) and notices.
        None: none of them."""
        if P.WEIGHTS_BEGIN_KEY in msg:
            m = P.WEIGHTS_BEGIN.search(msg)
            return [WeightsLoadBegan(line_no, rank, _float(m, "avail"))]
        if P.WEIGHTS_END_KEY in msg:
            m = P.WEIGHTS_END.search(msg)
            return [WeightsLoaded(line_no, rank, _float(m, "elapsed"), _float(m, "usage"))]
        if P.KV_KEY in msg:
            m = P.KV.search(msg)
            if m is not None:
                tokens = m.group("tokens")
                return [KVCacheAllocated(line_no, rank, int(tokens) if tokens else None)]
        if P.PREFILL_DISABLED_KEY in msg:
            m = P.PREFILL_DISABLED.search(msg)
            if m is not None:
                reason = m.group("reason") or m.group("incompat") or ""
                return [PrefillGraphDisabled(line_no, rank, reason)]
        if msg.startswith(P.SCHED_READY_KEY):
            m = P.SCHED_READY.search(msg)
            if m is not None:
                return [SchedulerReady(line_no, rank, int(m.group("total")), int(m.group("running")),
                                       int(m.group("ctx")) if m.group("ctx") else None)]
        if P.HTTP_UP_KEY in msg:
            m = P.HTTP_UP.search(msg)
            if m is not None:
                self._http_up = True
                return [HttpUp(line_no, rank, m.group("host").strip("[]"), int(m.group("port")))]
        if msg.startswith(P.READY_LINE):
            self._ready = True
            return [ServerReady(line_no, rank)]
        if P.DEPRECATED_KEY in msg:
            m = P.DEPRECATED.search(msg)
            if m is not None:
                return [DeprecatedFlag(line_no, rank, m.group("flag"), m.group("new"))]
        return None

    def _signature(self, msg: str, rank: str | None, line_no: int) -> list[EngineEvent]:
        if _signature_gate(msg) is None:
            return []
        for key, cls in P.SIGNATURES:
            if key in msg:
                if self._block is not None:
                    self._scan_block_line(msg, line_no)
                    return [TracebackLine(line_no, rank, self._redact(msg))]
                refined = self._refine(cls, msg, None)
                return [TracebackLine(line_no, rank, self._redact(msg)),
                        EngineFailed(line_no, rank, refined, self._redact(msg.strip())[:500])]
        return []

    def _capture(self, msg: str, rank: str | None, line_no: int) -> EngineEvent | None:
        m = P.CAPTURE.match(msg)
        owner: GraphOwner
        phase: GraphPhase
        backend: str | None = None
        if m is not None:
            owner = "draft" if m.group("owner") == "draft" else "target"
            phase = _phase(m.group("phase"))
            backend = m.group("backend")
        else:
            m = P.LEGACY_CAPTURE.match(msg)
            if m is None:
                return None
            legacy_owner, legacy_phase = P.LEGACY_KINDS[m.group("what")]
            owner = "draft" if legacy_owner == "draft" else "target"
            phase = _phase(legacy_phase)
        if m.group("state") == "begin":
            self._capturing[rank] = _Capturing(owner, phase)
            return CaptureBegan(line_no, rank, owner, phase, backend)
        self._capturing.pop(rank, None)
        return CaptureEnded(line_no, rank, owner, phase, _float(m, "elapsed"), _float(m, "usage"))

    def _crash(self, msg: str, rank: str | None, line_no: int) -> list[EngineEvent]:
        events: list[EngineEvent] = [*self._close_block(), EngineCrashed(line_no, rank, msg.strip())]
        m = P.CHILD_CRASHED.search(msg)
        if m is not None and self._ready and not self._draining:
            events.append(EngineFailed(line_no, rank, FailureClass.CHILD_CRASHED, msg.strip()))
        return events

    def _echo(self, msg: str) -> list[EngineEvent]:
        """A request echo: user text from its first character on (see patterns.ECHO_PREFIXES)."""
        self._prev_unmatched = None
        self._echo_left = 0 if _echo_closed(msg) else P.ECHO_CONTINUATION_LINES
        if not msg.startswith("{"):
            self.text_echoes += 1
        return []

    def _echo_continuation(self, text: str) -> list[EngineEvent]:
        """A line of an echo that did not end on its own line: user text, never an event."""
        self._echo_left -= 1
        if _echo_closed(text):
            self._echo_left = 0
        self._prev_unmatched = None
        return []

    # -- traceback blocks --------------------------------------------------------------------
    def _in_block(self, text: str, stripped: str, line_no: int) -> list[EngineEvent]:
        assert self._block is not None
        if _is_progress(stripped) and not text[:1].isspace():
            return [CaptureProgress(line_no, None, stripped[:200])]
        self._scan_block_line(stripped, line_no)
        return [TracebackLine(line_no, self._block.rank, self._redact(text.rstrip()))]

    def _scan_block_line(self, line: str, line_no: int) -> None:
        block = self._block
        assert block is not None
        if block.cut_frame is not None:
            line = block.cut_frame + line  # the rest of a wrapped frame line
            block.cut_frame = None
        if block.after_frame:
            block.after_frame = False
            # The source of the last frame read: a traceback cut short ends on the call into
            # the capture (`self.init_cuda_graphs()`) before that frame's own `File` line.
            if any(w in line for w in P.CAPTURE_CALL_WORDS):
                block.capture_frames = True
        if line.startswith("File "):
            block.frames += 1
            block.after_frame = True
            if ", in " not in line:
                block.cut_frame = line[:2000]
            low = line.lower()
            if any(w in low for w in P.CAPTURE_FRAME_WORDS):
                block.capture_frames = True
            if any(w in low for w in P.DRAFT_FRAME_WORDS):
                block.draft_frames = True
            if any(w in low for w in P.PREFILL_FRAME_WORDS):
                block.prefill_frames = True
            return
        if any(w in line for w in P.OOM_WORDS):
            block.oom = True
        if P.EXCEPTION_LINE.match(line):
            block.last_exception = (line_no, line.strip())
        for key, cls in P.SIGNATURES:
            if key in line:
                self._offer(cls, line_no, line.strip())
                break

    def _offer(self, cls: FailureClass, line_no: int, message: str) -> None:
        block = self._block
        assert block is not None
        if block.best is None or failure_rank(cls) < failure_rank(block.best[0]):
            block.best = (cls, line_no, message)

    def _close_block(self) -> list[EngineEvent]:
        block = self._block
        if block is None:
            return []
        self._block = None
        if block.request:
            return []
        if block.best is not None:
            cls, line_no, message = block.best
        elif block.last_exception is not None:
            line_no, message = block.last_exception
            cls = FailureClass.SCHEDULER_EXCEPTION if block.scheduler else FailureClass.OTHER
        elif block.scheduler:
            line_no, message = block.first_line, P.SCHEDULER_EXCEPTION
            cls = FailureClass.SCHEDULER_EXCEPTION
        elif block.traceback_start and block.frames:
            line_no, message = block.first_line, P.TRACEBACK_START
            cls = FailureClass.OTHER  # refined by its frames (init_cuda_graphs: capture_failed)
        else:
            return []
        cls = self._refine(cls, message, block)
        if self._draining and cls in (FailureClass.OTHER, FailureClass.SCHEDULER_EXCEPTION):
            return []  # noise of a stop we asked for
        return [EngineFailed(line_no, block.rank, cls, self._redact(message)[:500])]

    def _refine(self, cls: FailureClass, message: str, block: _Block | None) -> FailureClass:
        """Use where we are (capturing? warming up?) and what the traceback showed."""
        oom = any(w in message for w in P.OOM_WORDS) or (block is not None and block.oom)
        rank = block.rank if block else None
        own = self._capturing.get(rank)
        capturing = own
        if capturing is None and self._capturing:
            capturing = next(iter(self._capturing.values()))
        draft = (capturing is not None and capturing.owner == "draft") or (
            block is not None and block.draft_frames and block.capture_frames
        )
        in_capture = capturing is not None or (block is not None and block.capture_frames)
        # The JIT rule asks whether the failing rank itself was capturing: under TP the ranks
        # start apart, and a rank that fails its kernel build before any capture of its own is
        # the host's toolchain even while a faster rank has begun capturing (a slow weight load
        # on a busy host used to turn that into capture_failed and walk the ladder).
        jit_capture = own if rank is not None else capturing
        if cls is FailureClass.ENVIRONMENT and jit_capture is not None and any(
                k in message for k in P.JIT_BUILD_FAILED):
            # A kernel build that fails while a graph is captured may be that graph's kernel
            # (a profile's choice); before any capture it is the host's toolchain.
            return FailureClass.CAPTURE_FAILED
        if cls is FailureClass.CAPTURE_FAILED:
            if draft:
                return FailureClass.DRAFT_CAPTURE_FAILED
            return FailureClass.CAPTURE_OOM if oom else cls
        if cls in (FailureClass.SCHEDULER_EXCEPTION, FailureClass.OTHER, FailureClass.CUDA_ERROR):
            if self._http_up and not self._ready:
                return FailureClass.WARMUP_FAILED
            if in_capture:
                prefill = (capturing is not None and capturing.phase in ("prefill", "piecewise")) or (
                    block is not None and block.prefill_frames
                )
                if draft:
                    return FailureClass.DRAFT_CAPTURE_FAILED
                if prefill:
                    return FailureClass.PREFILL_GRAPH_FAILED
                return FailureClass.CAPTURE_OOM if oom else FailureClass.CAPTURE_FAILED
        return cls

    def _redact(self, text: str) -> str:
        return redact(text, self._secrets)


_bracket_header = P.BRACKET_HEADER.match
_signature_gate = re.compile("|".join(map(re.escape, P.SIGNATURE_GATE))).search
_secret_key = re.compile("|".join(map(re.escape, P.SECRET_ARG_KEYS))).search
_header = P.HEADER.match


class ServingRun(NamedTuple):
    """`LogParser.feed_run` of a read: its events (the run's stat lines settled) and, per line,
    the rank it is forwarded with (a stat line's, None for an access line); None: no line has one."""

    events: list[EngineEvent]
    ranks: list[str | None] | None


_serving_run = P.SERVING_RUN.fullmatch
_serving_run_ranked = P.SERVING_RUN_RANKED.fullmatch


def _run_header(line: str) -> re.Match[str] | None:
    """The header of a line of a serving run, as `LogParser.feed_line` matches it."""
    return _bracket_header(line) if line[:1] == "[" else _header(line)


def _stat_lines_back(lines: list[str], first: int) -> Iterator[StatLine]:
    """A serving run's stat lines from its end back, unread (`kept_from_end` stops early)."""
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        m = _run_header(line)
        assert m is not None
        msg = line[m.end():]
        if not msg.startswith(P.ACCESS_LOG_PREFIX):
            yield StatLine(first + i, m.group(1).strip() or None, msg, msg.startswith(P.PREFILL_KEY))


def _run_ranks(lines: list[str]) -> list[str | None]:
    ranks: list[str | None] = []
    for line in lines:
        m = _run_header(line)
        assert m is not None
        ranks.append(None if line.startswith(P.ACCESS_LOG_PREFIX, m.end())
                     else m.group(1).strip() or None)
    return ranks


def _is_stats_line(msg: str) -> bool:
    return P.DECODE_KEY in msg or P.PREFILL_KEY in msg or P.SERVER_ARGS_KEY in msg


def _may_go_on(event: EngineEvent) -> bool:
    """Read from a line that a terminal may have wrapped: the next rows may complete it."""
    if isinstance(event, ServerArgsSeen):
        return not event.args  # the dump's closing `)` not seen yet
    return isinstance(event, (DecodeStats, PrefillStats))


def _is_echo(msg: str) -> bool:
    """Is this message (after the header) a request echo of --log-requests?"""
    if not msg.startswith(P.ECHO_PREFIXES):
        return False
    if msg[0] == "{":
        return P.JSON_ECHO_EVENT in msg[:120]
    if msg[0] == "i":
        return P.LEGACY_ECHO.match(msg) is not None
    return True


def _echo_closed(text: str) -> bool:
    return text.rstrip().endswith((*P.ECHO_CLOSERS, TRUNCATED_MARK))


def _is_progress(text: str) -> bool:
    if "%|" in text and P.PROGRESS_BAR.search(text):
        return True
    return text.startswith(P.PROGRESS_WORDS)


def _phase(text: str) -> GraphPhase:
    phases: dict[str, GraphPhase] = {
        "prefill": "prefill", "decode": "decode", "verify": "verify", "extend": "extend",
        "legacy": "legacy", "piecewise": "piecewise",
    }
    return phases[text]


def _float(m: re.Match[str] | None, group: str) -> float | None:
    if m is None:
        return None
    value = m.group(group)
    return float(value) if value else None


def parse_server_args(msg: str, secrets: Iterable[str] = ()) -> dict[str, str]:
    """`server_args=ServerArgs(a=1, b='x')` or `server_args={'a': 1, ...}` → {"a": "1", "b": "x"},
    secrets redacted."""
    m = P.SERVER_ARGS.search(msg)
    if m is None:
        return {}
    body = m.group("repr")
    assign = "="
    if body is None:
        body = m.group("dict")
        assign = ":"
    out: dict[str, str] = {}
    for part in _split_top_level(body):
        key, sep, value = part.partition(assign)
        if not sep:
            continue
        key = key.strip().strip("'\"")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if _secret_key(key) is not None and value not in ("None", ""):
            value = "***"
        # `redact` leaves a value without secrets or their markers as it is: skip the call.
        if secrets or "api" in value or "API" in value or "Bearer" in value:
            value = redact(value, secrets)
        out[key] = value
    return out


_TOKENS = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[()\[\]{},]""")


def _split_top_level(body: str) -> list[str]:
    """Split on commas outside quotes and brackets (a regex walks the tokens, not each char)."""
    parts: list[str] = []
    depth = 0
    start = 0
    for tok in _TOKENS.finditer(body):
        ch = tok.group()
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start : tok.start()])
            start = tok.end()
    parts.append(body[start:])
    return [p for p in parts if p.strip()]


def parse_lines(lines: Iterable[str], version: str | None = None) -> list[EngineEvent]:
    parser = LogParser(version)
    events: list[EngineEvent] = []
    for line in lines:
        events.extend(parser.feed_line(line))
    events.extend(parser.finish())
    return events


def parse_bytes(data: bytes, version: str | None = None) -> list[EngineEvent]:
    """Parse a whole saved log."""
    splitter = LineSplitter()
    return parse_lines([*splitter.feed(data), *splitter.flush()], version)


def parse_stream(read: Callable[[int], bytes], version: str | None = None,
                 chunk: int = 1 << 20) -> list[EngineEvent]:
    """Parse everything `read(n)` returns until it returns b"" (a file or stdin, in chunks)."""
    splitter = LineSplitter()
    parser = LogParser(version)
    events: list[EngineEvent] = []
    while True:
        data = read(chunk)
        if not data:
            break
        for line in splitter.feed(data):
            events.extend(parser.feed_line(line))
    for line in splitter.flush():
        events.extend(parser.feed_line(line))
    events.extend(parser.finish())
    return events
