"""One inbox for what arrives from outside the engine: signals, reload requests, timer events.

gunicorn's arbiter queues signals and handles them one at a time in its main loop; so does the
supervisor. A signal handler or a timer callback only puts an item here; the lifecycle loop
(`Supervisor._handle`) takes one item, handles it to the end (a reload awaits the file, the
engine's version and the rendering) and only then takes the next. Two quick SIGHUPs are two
reloads in the order they came, never interleaved; a SIGTERM sent during a reload is handled
after it (a reload still reading its file is given up for it: `Reloader.abandon_read`).

Bounded: a request equal to the last one still waiting adds nothing (a SIGTERM flood is one
stop), and reloads still waiting merge (a reload reads the file when it begins, so one reload
answers every SIGHUP sent before it began; `ReloadRequest.requests` counts them).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sglang_supervisor.core.inputs import StopRequested


@dataclass(frozen=True)
class ReloadRequest:
    """SIGHUP: re-read the configuration file."""

    requests: int = 1  # SIGHUPs this reload answers


@dataclass(frozen=True, eq=False)
class TimerDue:
    """A timer's delay ran out. Whether it fires is decided when the loop takes it (`Timers.due`):
    output meanwhile may have moved its deadline, the lifecycle may have cancelled or re-armed it."""

    name: str
    token: object  # the arming it belongs to


Item = StopRequested | ReloadRequest | TimerDue


class Inbox:
    def __init__(self) -> None:
        self._items: deque[Item] = deque()
        self._wake = asyncio.Event()

    def put(self, item: Item) -> None:
        """From the loop's thread (signal handlers and timer callbacks run there)."""
        last = self._items[-1] if self._items else None
        if isinstance(item, ReloadRequest) and isinstance(last, ReloadRequest):
            self._items[-1] = ReloadRequest(last.requests + item.requests)
            return
        if last is not None and item == last:
            return
        self._items.append(item)
        self._wake.set()

    def pending(self) -> tuple[Item, ...]:
        return tuple(self._items)

    async def serve(self, handle: Callable[[Item], Awaitable[None]]) -> None:
        """The lifecycle loop: one item at a time, each handled to the end. Runs until cancelled."""
        while True:
            while not self._items:
                self._wake.clear()
                await self._wake.wait()
            await handle(self._items.popleft())
