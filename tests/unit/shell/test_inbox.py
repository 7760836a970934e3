"""The supervisor's inbox: one item at a time, each handled to the end; floods stay bounded; a
timer event whose timer was cancelled or re-armed meanwhile never fires."""

from __future__ import annotations

import asyncio

from sglang_supervisor.core.actions import SetTimer
from sglang_supervisor.core.inputs import StopRequested
from sglang_supervisor.shell.inbox import Inbox, Item, ReloadRequest, TimerDue
from sglang_supervisor.shell.timers import Timers


def test_items_are_handled_one_at_a_time_each_to_its_end() -> None:
    inbox = Inbox()
    log: list[str] = []
    release = asyncio.Event()

    async def handle(item: Item) -> None:
        log.append(f"begin {item}")
        if isinstance(item, ReloadRequest):
            await release.wait()  # a reload awaiting the file and the engine's version
        log.append(f"end {item}")

    async def scenario() -> None:
        task = asyncio.ensure_future(inbox.serve(handle))
        inbox.put(ReloadRequest())
        await asyncio.sleep(0)
        inbox.put(StopRequested("SIGTERM"))  # arrives while the reload is in progress
        for _ in range(5):
            await asyncio.sleep(0)
        assert log == [f"begin {ReloadRequest()}"]  # the stop waits for the reload
        release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        task.cancel()

    asyncio.run(scenario())
    stop = StopRequested("SIGTERM")
    assert log == [f"begin {ReloadRequest()}", f"end {ReloadRequest()}", f"begin {stop}", f"end {stop}"]


def test_waiting_reloads_merge_and_repeated_signals_add_nothing() -> None:
    inbox = Inbox()
    inbox.put(ReloadRequest())
    inbox.put(ReloadRequest())
    inbox.put(StopRequested("SIGTERM"))
    inbox.put(StopRequested("SIGTERM"))
    inbox.put(StopRequested("SIGINT"))
    inbox.put(ReloadRequest())
    inbox.put(ReloadRequest())
    inbox.put(ReloadRequest())
    assert inbox.pending() == (ReloadRequest(2), StopRequested("SIGTERM"), StopRequested("SIGINT"),
                               ReloadRequest(3))


def test_a_timer_cancelled_or_rearmed_while_its_event_waited_never_fires() -> None:
    async def scenario() -> list[bool]:
        queued: list[TimerDue] = []
        timers = Timers(queued.append)
        timers.set(SetTimer("start", 0.0))
        await asyncio.sleep(0.01)  # the delay runs out: the event is queued, not fired
        [first] = queued
        timers.set(SetTimer("start", 3600.0))  # re-armed before the loop took the event
        stale = timers.due(first)
        timers.set(SetTimer("grace", 0.0))
        await asyncio.sleep(0.01)
        grace = queued[-1]
        timers.cancel("grace")
        cancelled = timers.due(grace)
        timers.set(SetTimer("other", 0.0))
        await asyncio.sleep(0.01)
        fired = timers.due(queued[-1])
        still = timers.armed()
        timers.cancel_all()
        return [stale, cancelled, fired, still == frozenset({"start"})]

    assert asyncio.run(scenario()) == [False, False, True, True]
