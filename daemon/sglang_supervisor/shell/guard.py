"""Our own tasks and loop callbacks, watched: a bug in any of them ends the run (exit 1, engine
stopped, no profile blamed) instead of vanishing into "Task exception was never retrieved" while
the lifecycle waits forever for it. What an internal error then does is the supervisor's
(`Supervisor.internal_error`); this module only catches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("sglang_supervisor")

OnError = Callable[[BaseException | None, str | None], None]


class TaskGuard:
    def __init__(self, on_error: OnError) -> None:
        self._on_error = on_error
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, fn: Callable[[], Any]) -> None:
        """Run the coroutine `fn()` as a task of ours: watched, and cancelled by `cancel_all`."""
        task = asyncio.ensure_future(fn())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.supervise(task)

    def supervise(self, task: asyncio.Future[Any]) -> asyncio.Future[Any]:
        task.add_done_callback(self._task_done)
        return task

    def cancel_all(self) -> None:
        for t in list(self._tasks):
            t.cancel()

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._on_error(task.exception(), None)

    def loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio's last resort, in our log. A callback of ours that raised (a timer, a signal,
        engine output fed to the lifecycle) is fatal like a task; other reports are logged only."""
        exc = context.get("exception")
        if exc is not None and "handle" in context and "future" not in context:
            self._on_error(exc, str(context.get("message") or ""))
        else:
            log.warning("supervisor.asyncio", message=str(context.get("message") or ""),
                        error=repr(exc) if exc is not None else None)
