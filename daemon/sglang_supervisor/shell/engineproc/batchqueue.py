"""A hand-over between threads that moves whole batches, is bounded by items, and drops rather
than waits.

The engine pipe's reader and the supervisor's logging callers must never block on a slow consumer
(a stuck journald), and under a flood of engine output a lock round trip per line costs more than
the line itself. So producers hand over a whole batch at once (one lock), the consumer takes
everything pending at once, and what does not fit is dropped and reported to the producer, who
counts it. The bound is in items, not batches, so memory stays bounded however batches are cut;
an optional second bound on the batches' weight (their bytes, say) keeps it bounded when items are
large.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class BatchQueue(Generic[T]):
    """For any number of producers and one consumer."""

    def __init__(self, max_items: int, max_weight: int | None = None) -> None:
        if max_items < 1:
            raise ValueError(f"a batch queue must hold at least 1 item, not {max_items}")
        self.max_items = max_items
        self.max_weight = max_weight
        self._items: list[T] = []
        self._weight = 0
        self._closed = False
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)

    def put(self, batch: Sequence[T], weight: int = 0) -> int:
        """Queue what fits of `batch`, in order; returns how many items (from its end) were dropped.

        A batch whose `weight` would take the queue past `max_weight` is dropped whole (unless the
        queue is empty). Never blocks beyond the lock. After `close()` everything is dropped.
        """
        if not batch:
            return 0
        with self._lock:
            room = 0 if self._closed else self.max_items - len(self._items)
            if (self.max_weight is not None and self._weight
                    and self._weight + weight > self.max_weight):
                room = 0
            if room <= 0:
                return len(batch)
            self._weight += weight
            was_empty = not self._items
            if len(batch) <= room:
                self._items.extend(batch)
                dropped = 0
            else:
                self._items.extend(batch[:room])
                dropped = len(batch) - room
            if was_empty:  # the one consumer waits only on an empty queue
                self._cond.notify()
        return dropped

    def close(self) -> None:
        """No more items: `take` returns what is left, then reports the end."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, timeout: float | None = None) -> tuple[list[T], bool]:
        """Wait (up to `timeout`) for items or the end; returns everything pending and whether the
        queue is closed (then nothing more will come)."""
        with self._cond:
            if not self._items and not self._closed:
                self._cond.wait_for(lambda: self._items or self._closed, timeout)
            items, self._items = self._items, []
            self._weight = 0
            return items, self._closed

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
