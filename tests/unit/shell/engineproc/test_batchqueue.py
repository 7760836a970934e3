"""The batch hand-over between threads: bounded in items, drops (and says how many), keeps order."""

from __future__ import annotations

import threading

import pytest

from sglang_supervisor.shell.engineproc.batchqueue import BatchQueue


def test_batches_come_out_as_one_list_in_order() -> None:
    q: BatchQueue[int] = BatchQueue(10)
    assert q.put([1, 2, 3]) == 0
    assert q.put([]) == 0
    assert q.put([4]) == 0
    assert len(q) == 4
    assert q.take() == ([1, 2, 3, 4], False)
    assert q.take(timeout=0) == ([], False)


def test_what_does_not_fit_is_dropped_from_the_end_and_counted() -> None:
    q: BatchQueue[int] = BatchQueue(5)
    assert q.put([1, 2, 3]) == 0
    assert q.put([4, 5, 6, 7]) == 2
    assert q.put([8]) == 1
    assert q.take() == ([1, 2, 3, 4, 5], False)
    assert q.put([9]) == 0  # taking made room again


def test_close_ends_the_consumer_after_what_is_left() -> None:
    q: BatchQueue[str] = BatchQueue(5)
    q.put(["a"])
    q.close()
    assert q.put(["late"]) == 1
    assert q.take() == (["a"], True)
    assert q.take() == ([], True)


def test_take_waits_for_a_producer() -> None:
    q: BatchQueue[int] = BatchQueue(5)
    timer = threading.Timer(0.05, q.put, args=([7],))
    timer.start()
    try:
        assert q.take(timeout=10) == ([7], False)
    finally:
        timer.cancel()


def test_a_queue_must_hold_something() -> None:
    with pytest.raises(ValueError, match="at least 1 item"):
        BatchQueue(0)


def test_a_weight_bound_drops_whole_batches_but_never_starves_an_empty_queue() -> None:
    q: BatchQueue[str] = BatchQueue(100, max_weight=10)
    assert q.put(["big"], weight=50) == 0  # alone it is let through: the producer made progress
    assert q.put(["a", "b"], weight=1) == 2
    assert q.take() == (["big"], False)
    assert q.put(["a", "b"], weight=6) == 0
    assert q.put(["c"], weight=4) == 0
    assert q.put(["d"], weight=1) == 1
    assert q.take() == (["a", "b", "c"], False)
