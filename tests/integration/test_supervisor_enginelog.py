"""The engine output pump: file rotation, redaction, events to the loop, non-blocking forwarding."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_supervisor.core.events import (
    CaptureProgress,
    DecodeStats,
    DeprecatedFlag,
    EngineEvent,
    EngineFailed,
    FailureClass,
    ServerReady,
)
from sglang_supervisor.shell.engineproc.enginelog import (
    FORWARD_EVERY_S,
    HAND_OVER_EVERY_S,
    PRIORITY_ERROR,
    PRIORITY_INFO,
    PRIORITY_WARNING,
    PROGRESS_FORWARD_S,
    EngineLogPump,
    RotatingByteLog,
    StreamRedactor,
)

pytestmark = pytest.mark.integration


class Splitter:
    """Minimal stand-in for logwatch.LineSplitter: split on \\n and \\r."""

    def __init__(self) -> None:
        self.buf = ""

    def feed(self, data: bytes) -> list[str]:
        self.buf += data.decode(errors="replace")
        parts = self.buf.replace("\r", "\n").split("\n")
        self.buf = parts.pop()
        return parts

    def flush(self) -> list[str]:
        out, self.buf = ([self.buf] if self.buf else []), ""
        return out


class Parser:
    def __init__(self) -> None:
        self.n = 0

    def feed_line(self, line: str) -> list[EngineEvent]:
        self.n += 1
        if "ready to roll" in line:
            return [ServerReady(self.n, None)]
        if "Error" in line:
            return [EngineFailed(self.n, "TP0", FailureClass.OTHER, line)]
        if line.startswith("Decode batch"):
            return [DecodeStats(self.n, None, 1, 0, 30.0, True, None)]
        return []

    def finish(self) -> list[EngineEvent]:
        return []


@pytest.mark.parametrize("cut", [1, 3, 7, 10, 15])
def test_stream_redactor_across_chunk_boundaries(cut: int) -> None:
    data = b"server_args={'api_key': 'sk-secret-123'} tail sk-secret-123"
    r = StreamRedactor(["sk-secret-123"])
    out = b"".join(r.feed(data[i:i + cut]) for i in range(0, len(data), cut)) + r.flush()
    assert out == b"server_args={'api_key': '***'} tail ***"


def test_stream_redactor_holds_back_only_a_possible_prefix() -> None:
    r = StreamRedactor(["sk-secret-123"])
    assert r.feed(b"hello\n") == b"hello\n"
    assert r.feed(b"key sk-se") == b"key "
    assert r.feed(b"x\n") == b"sk-sex\n"


def test_rotation_keeps_backups(tmp_path: Path) -> None:
    log = RotatingByteLog(tmp_path / "engine.log", max_bytes=100, backups=2)
    for i in range(10):
        log.write(f"{i:02d}".encode() * 20 + b"\n")  # 41 bytes
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["engine.log", "engine.log.1", "engine.log.2"]
    assert all(p.stat().st_size <= 100 for p in tmp_path.iterdir())
    assert (tmp_path / "engine.log").read_bytes().endswith(b"09" * 20 + b"\n")


def test_deleted_file_is_recreated(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "engine.log"
    log = RotatingByteLog(path, max_bytes=10_000, backups=1, clock=lambda: now[0])
    log.write(b"one\n")
    path.unlink()
    log.write(b"two\n")
    log.close()
    assert path.read_bytes() == b"two\n"


def test_write_errors_are_counted_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    log = RotatingByteLog(tmp_path / "engine.log", max_bytes=10_000, backups=1, clock=lambda: now[0])
    real_write = os.write

    def io_error(fd: int, data: bytes) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "write", io_error)
    log.write(b"lost\n")
    log.write(b"lost too\n")  # within the retry pause: dropped without touching the disk
    assert log.errors == 1 and log.dropped_bytes == len(b"lost\nlost too\n")
    monkeypatch.setattr(os, "write", real_write)
    now[0] += 10
    log.write(b"back\n")
    log.close()
    assert (tmp_path / "engine.log").read_bytes() == (
        b"[sglang-supervisor] 14 bytes of engine output are missing here: "
        b"OSError: [Errno 5] Input/output error\nback\n")


async def until(cond: Callable[[], bool], timeout: float = 10) -> None:
    """Poll `cond` on the loop until it holds (a pump's callbacks run there or on its reader)."""
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


async def feed_to_eof(pump: EngineLogPump, w: int, payload: list[bytes], pause_s: float,
                      eof: asyncio.Event) -> None:
    """Write `payload` into the pump's pipe a chunk at a time, `pause_s` apart, close it, and wait
    until the pump saw EOF and its reader ended."""
    for chunk in payload:
        os.write(w, chunk)
        await asyncio.sleep(pause_s)
    os.close(w)
    await asyncio.wait_for(eof.wait(), 10)
    assert pump.join(10)


def run_pump(tmp_path: Path, payload: list[bytes], forward, queue: int = 100) -> tuple[
        EngineLogPump, list[EngineEvent], int]:
    async def main() -> tuple[EngineLogPump, list[EngineEvent], int]:
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        got: list[EngineEvent] = []
        calls = [0]
        done = asyncio.Event()

        def on_output(evs: list[EngineEvent]) -> None:
            calls[0] += 1
            got.extend(evs)

        pump = EngineLogPump(r, loop=loop, log=RotatingByteLog(tmp_path / "e.log", 1 << 20, 1),
                             splitter=Splitter(), parser=Parser(), on_output=on_output,
                             on_eof=done.set, secrets=["sk-secret-123"], forward=forward,
                             forward_queue=queue)
        pump.start()
        await feed_to_eof(pump, w, payload, 0.01, done)
        assert pump.join_forwarder(10)  # the last lines may still be on their way
        return pump, got, calls[0]

    return asyncio.run(main())


def test_pump_file_events_and_forwarding(tmp_path: Path) -> None:
    forwarded: list[tuple[str, int, str | None]] = []
    payload = [b"Loading 10%\rLoading 50%\r", b"api_key=sk-secret-123\nRuntime", b"Error: x\n",
               b"The server is fired up and ready to roll!\nno newline"]
    pump, events, calls = run_pump(tmp_path, payload, lambda *a: forwarded.append(a))
    text = (tmp_path / "e.log").read_bytes()
    assert text == b"".join(payload).replace(b"sk-secret-123", b"***")
    assert [type(e) for e in events] == [EngineFailed, ServerReady]
    assert calls >= 1  # how reads group into calls: test_stat_lines_wait_for_the_next_event_*
    lines = [f[0] for f in forwarded]
    assert "api_key=***" in lines and "no newline" in lines
    assert ("RuntimeError: x", PRIORITY_ERROR, "TP0") in forwarded
    assert ("The server is fired up and ready to roll!", PRIORITY_INFO, None) in forwarded
    assert not any("sk-secret" in line for line in lines)
    assert pump.stats.forward_dropped == 0


def test_slow_forwarding_drops_instead_of_blocking(tmp_path: Path) -> None:
    gate = threading.Event()
    forwarded: list[str] = []

    def slow(text: str, prio: int, rank: str | None) -> None:
        gate.wait(10)
        forwarded.append(text)

    payload = [b"".join(f"line {i}\n".encode() for i in range(500))]
    timer = threading.Timer(1.0, gate.set)
    timer.start()
    pump, _, _ = run_pump(tmp_path, payload, slow, queue=10)
    timer.cancel()
    gate.set()
    assert pump.stats.lines == 500
    assert pump.stats.forward_dropped > 0
    assert (tmp_path / "e.log").read_bytes() == payload[0]  # the file kept everything


class EventfulParser(Parser):
    """Adds progress frames, deprecation warnings and a line with two events to the stand-in."""

    def feed_line(self, line: str) -> list[EngineEvent]:
        self.n += 1
        if line.startswith("Capturing"):
            return [CaptureProgress(self.n, "TP0", line)]
        if "deprecated" in line:
            return [DeprecatedFlag(self.n, None, "--old", None)]
        if "both" in line:
            return [ServerReady(self.n, None), EngineFailed(self.n, "TP1", FailureClass.OTHER, line)]
        return super().feed_line(line)


@pytest.mark.parametrize("how", ["forward_batch", "forward_inline"])
def test_pump_forwards_whole_reads_as_batches_in_order(tmp_path: Path, how: str) -> None:
    """forward_batch runs on the pump's forwarding thread, forward_inline on the reader itself
    (no forwarding thread: one wake-up per read less); both get the same lines in the same order."""
    batches: list[list[tuple[str, int, str | None]]] = []
    threads: set[str] = set()

    def take(batch: list[tuple[str, int, str | None]]) -> None:
        threads.add(threading.current_thread().name)
        batches.append(batch)
    now = [100.0]
    body = [f"GET /metrics {i}" for i in range(300)]
    payload = [
        "\n".join([*body, "   ", "Capturing 10%", "Capturing 20%", "--old is deprecated", "RuntimeError: x",
                   "both at once", "ready to roll"]).encode() + b"\n",
        b"Capturing 30%\n",
    ]

    async def main() -> EngineLogPump:
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        done = asyncio.Event()
        pump = EngineLogPump(r, loop=loop, log=RotatingByteLog(tmp_path / "e.log", 1 << 20, 1),
                             splitter=Splitter(), parser=EventfulParser(), on_output=lambda evs: None,
                             on_eof=done.set, clock=lambda: now[0], name="pump",
                             **{how: take})  # type: ignore[arg-type]
        pump.start()
        os.write(w, payload[0])
        await asyncio.sleep(0.05)
        now[0] += PROGRESS_FORWARD_S  # the next progress frame is due again
        os.write(w, payload[1])
        os.close(w)
        await asyncio.wait_for(done.wait(), 10)
        assert pump.join(10)
        assert pump.join_forwarder(10)
        return pump

    pump = asyncio.run(main())
    forwarded = [item for batch in batches for item in batch]
    assert forwarded == [
        *[(line, PRIORITY_INFO, None) for line in body],
        ("Capturing 10%", PRIORITY_INFO, "TP0"),  # "Capturing 20%": a frame too soon after it
        ("--old is deprecated", PRIORITY_WARNING, None),
        ("RuntimeError: x", PRIORITY_ERROR, "TP0"),
        ("both at once", PRIORITY_ERROR, "TP1"),
        ("ready to roll", PRIORITY_INFO, None),
        ("Capturing 30%", PRIORITY_INFO, "TP0"),
    ]
    assert len(batches) < len(forwarded) / 10  # handed over per read, not per line
    assert threads == {"pump" if how == "forward_inline" else "pump-forward"}
    assert pump.stats.forwarded == len(forwarded)
    assert pump.stats.forward_dropped == 0
    assert pump.stats.lines == len(body) + 8  # the blank line counts, it is just not forwarded
    assert pump.stats.internal_errors == 0
    assert (tmp_path / "e.log").read_bytes() == b"".join(payload)


@pytest.mark.parametrize(("lines", "size"), [(600, 1 << 20), (1 << 20, 8000)], ids=["lines", "bytes"])
def test_slow_batch_forwarding_drops_instead_of_blocking(tmp_path: Path, lines: int, size: int) -> None:
    gate = threading.Event()
    forwarded: list[str] = []

    def slow(batch: list[tuple[str, int, str | None]]) -> None:
        gate.wait(10)
        forwarded.extend(text for text, _, _ in batch)

    payload = [b"".join(f"line {i}\n".encode() for i in range(500))] * 3
    timer = threading.Timer(1.0, gate.set)
    timer.start()

    async def main() -> EngineLogPump:
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        done = asyncio.Event()
        pump = EngineLogPump(r, loop=loop, log=RotatingByteLog(tmp_path / "e.log", 1 << 20, 1),
                             splitter=Splitter(), parser=Parser(), on_output=lambda evs: None,
                             on_eof=done.set, forward_batch=slow, forward_queue=lines,
                             forward_queue_bytes=size)
        pump.start()
        await feed_to_eof(pump, w, payload, 0.01, done)  # the reader finished while forwarding was stuck
        gate.set()
        assert pump.join_forwarder(10)
        return pump

    try:
        pump = asyncio.run(main())
    finally:
        timer.cancel()
        gate.set()
    assert pump.stats.lines == 1500
    assert pump.stats.forward_dropped > 0
    assert pump.stats.forwarded + pump.stats.forward_dropped == 1500
    assert len(forwarded) == pump.stats.forwarded
    remaining = iter([f"line {i}" for i in range(500)] * 3)
    assert all(line in remaining for line in forwarded)  # in order: a subsequence of the output
    assert (tmp_path / "e.log").read_bytes() == b"".join(payload)


@pytest.mark.parametrize("pair", [("forward", "forward_batch"), ("forward", "forward_inline"),
                                  ("forward_batch", "forward_inline")])
def test_forward_forward_batch_and_forward_inline_are_one_or_another(tmp_path: Path,
                                                                      pair: tuple[str, str]) -> None:
    loop = asyncio.new_event_loop()
    given: dict[str, Callable[..., None]] = {name: (lambda *a: None) for name in pair}
    try:
        with pytest.raises(ValueError, match="one of forward, forward_batch or forward_inline"):
            EngineLogPump(-1, loop=loop, log=RotatingByteLog(tmp_path / "e.log", 100, 1),
                          splitter=Splitter(), parser=Parser(), on_output=lambda evs: None,
                          on_eof=lambda: None, **given)  # type: ignore[arg-type]
    finally:
        loop.close()


def test_stat_lines_wait_for_the_next_event_and_arrive_with_it_in_order(tmp_path: Path) -> None:
    """A chatty engine's stat lines and event-less output do not each wake the loop: with the clock
    standing still they are held until an event that matters, then handed over with it, in order;
    what is held at EOF goes before on_eof. However the pipe splits the writes into reads."""
    async def main() -> tuple[list[list[EngineEvent]], list[str]]:
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        calls: list[list[EngineEvent]] = []
        order: list[str] = []
        done = asyncio.Event()

        def on_eof() -> None:
            order.append("eof")
            done.set()

        pump = EngineLogPump(r, loop=loop, log=RotatingByteLog(tmp_path / "e.log", 1 << 20, 1),
                             splitter=Splitter(), parser=Parser(),
                             on_output=lambda evs: (calls.append(list(evs)), order.append("output")),
                             on_eof=on_eof, clock=lambda: 1000.0)
        pump.start()
        os.write(w, b"Decode batch 1\n")  # the first output: nothing handed over yet, so at once
        await until(lambda: len(calls) == 1)
        for chunk in (b"GET /health 200\n", b"Decode batch 2\n", b"Decode batch 3\n",
                      b"The server is fired up and ready to roll!\n"):
            os.write(w, chunk)
            await asyncio.sleep(0.02)
        await until(lambda: any(isinstance(e, ServerReady) for call in calls for e in call))
        os.write(w, b"Decode batch 4\n")
        os.close(w)
        await asyncio.wait_for(done.wait(), 10)
        assert pump.join(10)
        return calls, order

    calls, order = asyncio.run(main())
    assert [[(type(e).__name__, e.line_no) for e in call] for call in calls] == [
        [("DecodeStats", 1)],
        [("DecodeStats", 3), ("DecodeStats", 4), ("ServerReady", 5)],  # held, then with the event
        [("DecodeStats", 6)],  # held at EOF
    ]
    assert order == ["output", "output", "output", "eof"]


def test_held_output_reaches_the_loop_without_more_output(tmp_path: Path) -> None:
    """Output held for its hand-over is not left waiting for the next output: the pump wakes for it
    (a stall timer must hear of the engine's last line even if the engine then goes quiet)."""
    async def main() -> list[EngineEvent]:
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        got: list[EngineEvent] = []
        both = asyncio.Event()

        def on_output(evs: list[EngineEvent]) -> None:
            got.extend(evs)
            if len(got) == 2:
                both.set()

        pump = EngineLogPump(r, loop=loop, log=RotatingByteLog(tmp_path / "e.log", 1 << 20, 1),
                             splitter=Splitter(), parser=Parser(), on_output=on_output,
                             on_eof=lambda: None)
        pump.start()
        os.write(w, b"Decode batch 1\n")
        await asyncio.sleep(HAND_OVER_EVERY_S / 10)
        os.write(w, b"Decode batch 2\n")  # most likely held: the first was just handed over
        try:
            await asyncio.wait_for(both.wait(), 30)  # the pipe stays open: no EOF flushes it
        finally:
            os.close(w)
            assert pump.join(10)
        return got

    got = asyncio.run(main())
    assert [e.line_no for e in got] == [1, 2]


def test_inline_forwarding_of_chatter_waits_its_interval_and_goes_first_with_an_event(
        tmp_path: Path) -> None:
    """forward_inline gets stat-only output at most every FORWARD_EVERY_S (the log writer wakes
    twice a second, not with every read), also when the engine then goes quiet; output with an
    event that matters takes what is held with it at once, before the loop hears of the event."""
    now = [1000.0]
    forwarded: list[str] = []
    handed: list[int] = []
    at_failure: list[list[str]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        done = asyncio.Event()

        def on_output(evs: list[EngineEvent]) -> None:
            handed.extend(e.line_no for e in evs)
            if any(isinstance(e, EngineFailed) for e in evs):
                at_failure.append(list(forwarded))

        pump = EngineLogPump(r, loop=loop, log=RotatingByteLog(tmp_path / "e.log", 1 << 20, 1),
                             splitter=Splitter(), parser=Parser(), on_output=on_output,
                             on_eof=done.set, clock=lambda: now[0],
                             forward_inline=lambda batch: forwarded.extend(t for t, _, _ in batch))
        pump.start()
        os.write(w, b"Decode batch 1\n")  # nothing forwarded yet: at once
        await until(lambda: forwarded == ["Decode batch 1"])
        os.write(w, b"Decode batch 2\n")
        now[0] += HAND_OVER_EVERY_S * 1.5  # the loop hears of it, the forwarder not yet
        await until(lambda: handed == [1, 2])
        assert forwarded == ["Decode batch 1"]
        now[0] += FORWARD_EVERY_S  # due now; the pipe stays quiet, the pump wakes for it itself
        await until(lambda: forwarded == ["Decode batch 1", "Decode batch 2"])
        os.write(w, b"Decode batch 3\n")
        await asyncio.sleep(0.05)
        os.write(w, b"RuntimeError: boom\n")
        await until(lambda: bool(at_failure))
        os.close(w)
        await asyncio.wait_for(done.wait(), 10)
        assert pump.join(10)

    asyncio.run(main())
    expected = ["Decode batch 1", "Decode batch 2", "Decode batch 3", "RuntimeError: boom"]
    assert at_failure == [expected]  # the held line first, then the event's, before the loop heard
    assert forwarded == expected


@pytest.mark.parametrize("leader_exits", [False, True], ids=["running", "leader-exited"])
def test_a_serving_engines_chatter_is_read_in_paced_batches_and_nothing_is_lost(
        tmp_path: Path, leader_exits: bool) -> None:
    """After the ready line a chatty engine is read in paced batches (enginelog `_pace`): every
    byte still reaches the file, every line the forwarder and every event the loop, in order; the
    wake fd (the leader's pidfd in the daemon; a pipe here, readable once the leader 'exited')
    ends the pauses and is closed by the pump."""
    chatter = [f"Decode batch {i}\n".encode() if i % 3 else f"GET /health {i}\n".encode()
               for i in range(120)]
    payload = [b"The server is fired up and ready to roll!\n", *chatter, b"RuntimeError: late\n"]
    forwarded: list[tuple[str, int, str | None]] = []
    wake_r, wake_w = os.pipe()
    if leader_exits:
        os.write(wake_w, b"x")

    async def main() -> tuple[EngineLogPump, list[EngineEvent]]:
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        got: list[EngineEvent] = []
        done = asyncio.Event()
        pump = EngineLogPump(r, loop=loop, log=RotatingByteLog(tmp_path / "e.log", 1 << 20, 1),
                             splitter=Splitter(), parser=Parser(), on_output=got.extend,
                             on_eof=done.set, forward_inline=forwarded.extend, wake_fd=wake_r)
        pump.start()
        await feed_to_eof(pump, w, payload, 0.001, done)
        return pump, got

    try:
        pump, got = asyncio.run(main())
    finally:
        os.close(wake_w)
    assert (tmp_path / "e.log").read_bytes() == b"".join(payload)
    assert [text for text, _, _ in forwarded] == [c.decode().rstrip("\n") for c in payload]
    assert [type(e) for e in got] == [ServerReady] + [DecodeStats] * 80 + [EngineFailed]
    assert [e.line_no for e in got] == sorted(e.line_no for e in got)
    assert pump.stats.internal_errors == 0
    with pytest.raises(OSError):
        os.fstat(wake_r)  # the pump closed it
