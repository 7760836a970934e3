"""The lifecycle's named timers (`SetTimer`/`CancelTimer`) on the event loop.

A timer whose delay runs out is put in the inbox (`TimerDue`); the loop asks `due` when it takes
it. Whether it fires then is `liveness.timer_due`'s call: engine output since the timer was armed
moves a stall deadline (re-armed for what is left), and a timer cancelled or re-armed while its
event waited never fires.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from sglang_supervisor.core.actions import SetTimer
from sglang_supervisor.core.liveness import timer_due
from sglang_supervisor.shell.inbox import TimerDue


@dataclass(eq=False)
class _Timer:
    seconds: float
    reset_on_output: bool
    started: float
    handle: asyncio.TimerHandle | None = None


class Timers:
    def __init__(self, put: Callable[[TimerDue], None]) -> None:
        self._put = put
        self._timers: dict[str, _Timer] = {}
        self.last_output = time.monotonic()  # the engine's (or its group's) last output

    def note_output(self, now: float) -> None:
        self.last_output = now

    def set(self, a: SetTimer) -> None:
        self.cancel(a.name)
        timer = _Timer(a.seconds, a.reset_on_output, time.monotonic())
        self._arm(a.name, timer, a.seconds)
        self._timers[a.name] = timer

    def cancel(self, name: str) -> None:
        t = self._timers.pop(name, None)
        if t is not None and t.handle is not None:
            t.handle.cancel()

    def cancel_all(self) -> None:
        for name in list(self._timers):
            self.cancel(name)

    def armed(self) -> frozenset[str]:
        return frozenset(self._timers)

    def due(self, event: TimerDue) -> bool:
        """The loop took `event`: True if the timer fires now (it is then disarmed)."""
        timer = self._timers.get(event.name)
        if timer is None or timer is not event.token:
            return False  # cancelled or re-armed while the event waited
        left = timer_due(started=timer.started, seconds=timer.seconds,
                         reset_on_output=timer.reset_on_output, last_output=self.last_output,
                         now=time.monotonic())
        if left is not None:
            self._arm(event.name, timer, left)
            return False
        del self._timers[event.name]
        return True

    def _arm(self, name: str, timer: _Timer, delay: float) -> None:
        loop = asyncio.get_running_loop()
        timer.handle = loop.call_later(delay, self._put, TimerDue(name, timer))
