"""A full disk under the engine log: one spell reported at its start and end, every byte that fits."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sglang_supervisor.shell.engineproc.enginelog import LogWriteState, RotatingByteLog


class Disk:
    """os.write with a capacity: writes what fits (a short write), then ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, free: int) -> None:
        self.free = free
        self._real = os.write
        monkeypatch.setattr(os, "write", self.write)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.free <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = self._real(fd, bytes(data[: self.free]))
        self.free -= n
        return n


def test_a_spell_is_reported_once_at_its_start_and_once_at_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    states: list[LogWriteState] = []
    now = [0.0]
    path = tmp_path / "engine.log"
    log = RotatingByteLog(path, 1 << 20, 1, clock=lambda: now[0], on_state=states.append)
    disk = Disk(monkeypatch, free=10)
    log.write(b"fits\n")
    log.write(b"half-fits\n")  # 5 bytes fit, 5 do not
    for _ in range(3):
        now[0] += 1
        log.write(b"no room\n")
    disk.free = 1 << 20  # an operator freed space
    now[0] += 1
    log.write(b"room again\n")
    log.write(b"more\n")
    log.close()
    assert [s.ok for s in states] == [True, False, True]  # first write, spell begins, spell ends
    began, ended = states[1], states[2]
    assert "No space left on device" in (began.error or "") and began.dropped_bytes == 5
    assert ended.seconds == 4.0 and ended.dropped_bytes == 3 * len(b"no room\n")
    # Every byte that fitted is there, in order; a note marks the gap; nothing after it is lost.
    assert path.read_bytes() == (
        b"fits\nhalf-"
        b"\n[sglang-supervisor] 29 bytes of engine output are missing here: "
        b"OSError: [Errno 28] No space left on device\nroom again\nmore\n")


def test_the_file_is_tried_again_at_once_when_space_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "engine.log"
    log = RotatingByteLog(path, 1 << 20, 1, clock=lambda: 0.0)  # the clock never moves
    disk = Disk(monkeypatch, free=0)
    log.write(b"lost\n")
    disk.free = 1 << 20
    log.write(b"kept\n")  # no retry pause for ENOSPC: the very next output lands
    log.close()
    assert path.read_bytes().endswith(b"kept\n")


def test_drops_still_failing_at_close_are_reported(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    states: list[LogWriteState] = []
    log = RotatingByteLog(tmp_path / "engine.log", 1 << 20, 1, on_state=states.append)
    Disk(monkeypatch, free=0)
    log.write(b"a\n")
    log.write(b"bb\n")
    log.close()
    assert [(s.ok, s.dropped_bytes) for s in states] == [(False, 2), (False, 3)]


def test_a_broken_callback_does_not_stop_the_writer(tmp_path: Path) -> None:
    def broken(state: LogWriteState) -> None:
        raise RuntimeError("bug")

    log = RotatingByteLog(tmp_path / "engine.log", 1 << 20, 1, on_state=broken)
    log.write(b"still written\n")
    log.close()
    assert (tmp_path / "engine.log").read_bytes() == b"still written\n"
