"""The pump over the engine's two pipes, with the real line splitter and parser: SGLang's own log
(stderr) is parsed, its request records (stdout, SGLang 0.5.8+) are kept and forwarded but never
give an event, even when a user's dict key forges whole engine lines (tests/unit/
test_logwatch_forged_keys.py), and the file holds whole lines of each."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sglang_supervisor.core.events import (
    CaptureBegan,
    DecodeStats,
    EngineCrashed,
    EngineEvent,
    EngineFailed,
    LogOnStdout,
    ServerReady,
    TracebackLine,
)
from sglang_supervisor.core.logwatch import LineSplitter, LogParser
from sglang_supervisor.shell.engineproc.enginelog import (
    PRIORITY_ERROR,
    PRIORITY_INFO,
    EngineLogPump,
    RotatingByteLog,
)
from sglang_supervisor.simulator import reqlog

pytestmark = pytest.mark.integration

NOW = 1796133196.0
SECRET = "sk-secret-123"
FORGED_KEY = (
    "x': 1})\n"
    "[2026-12-01 10:00:00.123 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "[2026-12-01 10:00:01.000] Decode batch, #running-req: 5, #token: 10, token usage: 0.00, "
    "cuda graph: False, gen throughput (token/s): 0.01, #queue-req: 0\n"
    "[2026-12-01 10:00:02.000] The server is fired up and ready to roll!\n"
    "error: unrecognized arguments: --user\n"
    "b"
)
CAPTURE = (b"[2026-11-29 08:07:55.319] Capture target decode CUDA graph begin. backend=full, "
           b"num_tokens_per_req=1, bs=[1, 2, 4, 8, 12, 16], avail mem=138.67 GB\n")
READY = b"[2026-11-29 08:08:09.436] The server is fired up and ready to roll!\n"


def _record() -> bytes:
    obj = reqlog.generate_req("r1", f"api key {SECRET}", {FORGED_KEY: 1, "max_new_tokens": 8})
    return reqlog.line(reqlog.receive(obj, 2, "text", NOW), NOW).encode()


class _LineByLine:
    """The runner's parser without `feed_run`: the pump reads each line through `feed_line`."""

    def __init__(self, inner: LogParser) -> None:
        self.feed_line = inner.feed_line
        self.finish = inner.finish


def _run(tmp_path: Path, writes: list[tuple[str, bytes]], defer_stats: bool = False,
         line_by_line: bool = False) -> tuple[
        EngineLogPump, list[EngineEvent], list[tuple[str, int, str | None]]]:
    async def main() -> tuple[EngineLogPump, list[EngineEvent], list[tuple[str, int, str | None]]]:
        loop = asyncio.get_running_loop()
        err_r, err_w = os.pipe()
        out_r, out_w = os.pipe()
        events: list[EngineEvent] = []
        forwarded: list[tuple[str, int, str | None]] = []
        done = asyncio.Event()
        parser = LogParser("0.5.17", [SECRET], defer_stats=defer_stats)
        pump = EngineLogPump(err_r, loop=loop, log=RotatingByteLog(tmp_path / "engine.log", 1 << 20, 1),
                             splitter=LineSplitter(), parser=_LineByLine(parser) if line_by_line else parser,
                             echo_fd=out_r, echo_splitter=LineSplitter(),
                             on_output=events.extend, on_eof=done.set, secrets=[SECRET],
                             forward_batch=forwarded.extend)
        pump.start()
        for stream, data in writes:
            os.write(err_w if stream == "err" else out_w, data)
            await asyncio.sleep(0.02)  # one read each: the partial lines really are apart
        os.close(err_w)
        os.close(out_w)
        await asyncio.wait_for(done.wait(), 10)
        assert pump.join(10) and pump.join_forwarder(10)
        return pump, events, forwarded

    return asyncio.run(main())


def test_a_forged_line_behind_a_raw_dict_key_on_stdout_is_no_event(tmp_path: Path) -> None:
    record = _record()
    assert b"\n[2026-12-01 10:00:02.000] The server is fired up" in record  # the forgery is real
    pump, events, forwarded = _run(tmp_path, [("err", CAPTURE), ("out", record), ("err", READY)])
    assert [type(e) for e in events] == [CaptureBegan, ServerReady]  # stderr's, and only those
    assert not [e for e in events if isinstance(e, (EngineFailed, EngineCrashed, DecodeStats))]
    text = (tmp_path / "engine.log").read_bytes()
    assert record.replace(SECRET.encode(), b"***") in text  # the request line is kept, redacted
    assert SECRET.encode() not in text
    assert text.count(b"\n") == CAPTURE.count(b"\n") + record.count(b"\n") + READY.count(b"\n")
    cuda = [f for f in forwarded if "CUDA error" in f[0]]
    assert cuda == [("RuntimeError: CUDA error: an illegal memory access was encountered",
                     PRIORITY_INFO, None)]
    assert pump.stats.internal_errors == 0


def test_a_read_of_stat_lines_is_handed_over_settled_and_forwarded_whole(tmp_path: Path) -> None:
    # As the daemon's runner reads: stat lines parsed only where the runner's fold keeps them.
    def decode(i: int) -> bytes:
        return (f"[2026-12-01 10:00:01.{i:03d} TP1] Decode batch, #running-req: 4, #token: {i}, "
                f"token usage: 0.00, cuda graph: True, gen throughput (token/s): {100 + i}.50, "
                "#queue-req: 0\n").encode()
    burst = b"".join(decode(i) for i in range(50)) + READY + b"".join(decode(i) for i in range(50, 60))
    _, events, forwarded = _run(tmp_path, [("err", burst)], defer_stats=True)
    assert [type(e).__name__ for e in events] == ["DecodeStats", "ServerReady", "DecodeStats"]
    first, _, last = events
    assert isinstance(first, DecodeStats) and first.gen_throughput == 149.5 and first.line_no == 50
    assert isinstance(last, DecodeStats) and last.gen_throughput == 159.5 and last.rank == "TP1"
    assert len(forwarded) == 61  # every line reaches the journal, with its rank
    assert {(prio, rank) for text, prio, rank in forwarded if "Decode batch" in text} == {
        (PRIORITY_INFO, "TP1")}
    assert (tmp_path / "engine.log").read_bytes() == burst


def test_a_read_of_serving_chatter_reaches_the_loop_and_journal_as_read_line_by_line(
        tmp_path: Path) -> None:
    # The seed's chatter (TP0 stat lines between access lines) read at once (LogParser.feed_run),
    # against the same bytes read one line at a time; a ready line between two reads.
    def chatter(i: int) -> bytes:
        return (f'[2026-12-01 10:00:02] INFO:     127.0.0.1:{5000 + i} - "POST /generate HTTP/1.1" 200 OK\n'
                f"[2026-12-01 10:00:02 TP0] Decode batch, #running-req: {i % 3}, #token: {i}, token usage: "
                f"0.00, cuda graph: True, gen throughput (token/s): {100 + i}.50, #queue-req: 0\n"
                f"[2026-12-01 10:00:02 TP0] Prefill batch, #new-seq: 1, #new-token: {i}, #cached-token: 0, "
                f"token usage: 0.00, #running-req: 1, #queue-req: 0, cuda graph: False, input throughput "
                f"(token/s): {i}.25\n").encode()
    writes = [("err", b"".join(chatter(i) for i in range(30))), ("err", READY),
              ("err", b"".join(chatter(i) for i in range(30, 41)))]
    runs = [_run(tmp_path / kind, writes, defer_stats=True, line_by_line=kind == "lines")
            for kind in ("run", "lines")]
    (_, events, forwarded), (_, want_events, want_forwarded) = runs
    assert events == want_events and forwarded == want_forwarded
    assert [type(e).__name__ for e in events] == ["DecodeStats", "PrefillStats", "ServerReady",
                                                  "DecodeStats", "PrefillStats"]
    decode = events[3]
    assert isinstance(decode, DecodeStats) and decode.gen_throughput == 140.5 and decode.rank == "TP0"
    assert len(forwarded) == 41 * 3 + 1
    assert {rank for text, _, rank in forwarded if "batch" in text} == {"TP0"}
    assert {rank for text, _, rank in forwarded if "HTTP/1.1" in text} == {None}


def test_the_file_gets_whole_lines_when_the_streams_interleave_inside_a_line(tmp_path: Path) -> None:
    record = b"[2026-12-01 10:00:05] Receive: obj=GenerateReqInput(rid='r2', text='hi')\n"
    access = b'[2026-12-01 10:00:05] INFO:     127.0.0.1:5000 - "POST /generate HTTP/1.1" 200\n'
    writes = [("err", CAPTURE[:40]), ("out", record[:30]), ("err", CAPTURE[40:]), ("out", record[30:]),
              ("out", access), ("err", b"[2026-11-29 08:08:09.436] The server is fired "),
              ("out", access), ("err", b"up and ready to roll!\nRuntimeError: CUDA error: boom\n")]
    _, events, forwarded = _run(tmp_path, writes)
    lines = (tmp_path / "engine.log").read_bytes().splitlines(keepends=True)
    assert sorted(lines) == sorted([CAPTURE, record, access, access, READY,
                                    b"RuntimeError: CUDA error: boom\n"])
    assert lines.index(CAPTURE) < lines.index(READY)  # each stream in its order
    assert [type(e) for e in events if not isinstance(e, TracebackLine)] == [CaptureBegan, ServerReady,
                                                                             EngineFailed]
    assert ("RuntimeError: CUDA error: boom", PRIORITY_ERROR, None) in forwarded


def test_a_partial_line_of_a_stream_that_went_quiet_still_reaches_the_file(tmp_path: Path) -> None:
    # An engine that hangs after half a line: the file must show it before the engine ends.
    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        err_r, err_w = os.pipe()
        out_r, out_w = os.pipe()
        done = asyncio.Event()
        log = tmp_path / "engine.log"
        pump = EngineLogPump(err_r, loop=loop, log=RotatingByteLog(log, 1 << 20, 1),
                             splitter=LineSplitter(), parser=LogParser("0.5.17"), echo_fd=out_r,
                             echo_splitter=LineSplitter(), on_output=lambda evs: None, on_eof=done.set)
        pump.start()
        os.write(err_w, b"[2026-11-29 08:07:55] Loading weights ")
        seen = b""
        for _ in range(200):  # the pump looks at quiet streams every IDLE_FLUSH_S
            await asyncio.sleep(0.05)
            seen = log.read_bytes() if log.exists() else b""
            if seen:
                break
        os.close(err_w)
        os.close(out_w)
        await asyncio.wait_for(done.wait(), 10)
        return seen

    assert asyncio.run(main()) == b"[2026-11-29 08:07:55] Loading weights "


def test_both_pipes_are_drained_under_a_flood_and_every_byte_is_kept(tmp_path: Path) -> None:
    # Blocking writers on both pipes (as the engine's are): they finish only if the pump drains
    # both; the file then holds each stream's lines whole.
    out_lines = [f"[2026-12-01 10:00:00] INFO:     127.0.0.1:{i} - \"GET /health HTTP/1.1\" 200\n".encode()
                 for i in range(30_000)]
    err_lines = [f"[2026-12-01 10:00:00] Decode batch, #running-req: 1, #token: {i}, token usage: 0.00, "
                 f"cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0\n".encode()
                 for i in range(10_000)]

    async def main() -> tuple[list[EngineEvent], EngineLogPump]:
        loop = asyncio.get_running_loop()
        err_r, err_w = os.pipe()
        out_r, out_w = os.pipe()
        events: list[EngineEvent] = []
        done = asyncio.Event()
        pump = EngineLogPump(err_r, loop=loop, log=RotatingByteLog(tmp_path / "engine.log", 64 << 20, 1),
                             splitter=LineSplitter(), parser=LogParser("0.5.17"), echo_fd=out_r,
                             echo_splitter=LineSplitter(), on_output=events.extend, on_eof=done.set)
        pump.start()

        def write_all(fd: int, lines: list[bytes], step: int) -> None:
            for i in range(0, len(lines), step):  # odd-sized writes: lines cut across reads
                os.write(fd, b"".join(lines[i:i + step]))
            os.close(fd)

        await asyncio.gather(asyncio.to_thread(write_all, out_w, out_lines, 7),
                             asyncio.to_thread(write_all, err_w, err_lines, 3))
        await asyncio.wait_for(done.wait(), 30)
        assert pump.join(10)
        return events, pump

    events, pump = asyncio.run(main())
    lines = (tmp_path / "engine.log").read_bytes().splitlines(keepends=True)
    assert sorted(lines) == sorted(out_lines + err_lines)
    assert [ln for ln in lines if b"Decode batch" in ln] == err_lines  # in order
    assert sum(isinstance(e, DecodeStats) for e in events) == len(err_lines)
    assert pump.stats.bytes == sum(map(len, out_lines)) + sum(map(len, err_lines))


def _run_in_order(tmp_path: Path, writes: list[tuple[str, bytes]]) -> list[EngineEvent]:
    """Like `_run`, but each write waits until the pump handed the one before over (an output
    callback), so which stream spoke first is certain, not a matter of scheduling."""
    async def main() -> list[EngineEvent]:
        loop = asyncio.get_running_loop()
        err_r, err_w = os.pipe()
        out_r, out_w = os.pipe()
        events: list[EngineEvent] = []
        outputs = 0
        done = asyncio.Event()

        def on_output(evs: list[EngineEvent]) -> None:
            nonlocal outputs
            outputs += 1
            events.extend(evs)

        pump = EngineLogPump(err_r, loop=loop, log=RotatingByteLog(tmp_path / "engine.log", 1 << 20, 1),
                             splitter=LineSplitter(), parser=LogParser("0.5.17", []),
                             echo_fd=out_r, echo_splitter=LineSplitter(),
                             on_output=on_output, on_eof=done.set)
        pump.start()
        for i, (stream, data) in enumerate(writes):
            os.write(err_w if stream == "err" else out_w, data)
            deadline = loop.time() + 10
            while outputs <= i and loop.time() < deadline:
                await asyncio.sleep(0.01)
            assert outputs > i, "the pump never handed the write over"
        os.close(err_w)
        os.close(out_w)
        await asyncio.wait_for(done.wait(), 10)
        assert pump.join(10)
        return events

    return asyncio.run(main())


def test_sglang_log_on_stdout_with_stderr_silent_is_told_once(tmp_path: Path) -> None:
    events = _run_in_order(tmp_path, [("out", CAPTURE), ("out", READY), ("err", b"a warning\n")])
    assert [type(e) for e in events] == [LogOnStdout]  # and stdout's lines are still no event


def test_sglang_lines_on_stdout_after_stderr_spoke_are_user_text(tmp_path: Path) -> None:
    events = _run_in_order(tmp_path, [("err", CAPTURE), ("out", READY), ("out", _record())])
    assert not any(isinstance(e, LogOnStdout) for e in events)
    assert [type(e) for e in events] == [CaptureBegan]


def test_sglangs_usage_text_reaches_the_journal_folded_and_the_file_whole(tmp_path: Path) -> None:
    real = (Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.17-h200" / "failures"
            / "unknown_flag.log").read_bytes()  # a refused flag on real 0.5.17
    _pump, _events, forwarded = _run(tmp_path, [("err", real)])
    texts = [f[0] for f in forwarded]
    usage = [t for t in texts if t.startswith("usage: ")]
    assert usage == ["usage: sglang serve [-h] --model-path MODEL_PATH"]
    after = texts[texts.index(usage[0]) + 1:]
    assert after[0] == "(419 more lines of the engine's usage text are in the engine log file, not forwarded)"
    assert after[1].startswith("sglang serve: error: unrecognized arguments: --mamba-scheduler-strategyy")
    assert len(texts) < 10
    assert (tmp_path / "engine.log").read_bytes().count(b"\n") == real.count(b"\n")  # the file has all
