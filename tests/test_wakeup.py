"""The worker loop's wake-ups (common/worker/wakeup.py): from another thread, and when a step's event completes."""
from __future__ import annotations

import select
import threading

from common.worker.wakeup import Wakeup


def readable(w: Wakeup, timeout: float = 0.0) -> bool:
    return bool(select.select([w], [], [], timeout)[0])


class Event:
    """A step's CUDA event, stood in for; counts the waits on it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.waits = 0

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        self.waits += 1
        self.done.wait()


def test_a_wake_up_is_pending_until_cleared_and_many_are_one():
    w = Wakeup()
    try:
        assert not readable(w)
        for _ in range(3):
            threading.Thread(target=w.wake).start()
        assert readable(w, timeout=10)
        w.clear()
        assert not readable(w)
        for _ in range(70_000):  # more than a pipe holds: the rest are dropped, one is enough
            w.wake()
        w.clear()
        assert not readable(w)
    finally:
        w.close()


def test_a_watched_event_wakes_the_loop_once_it_has_completed():
    w = Wakeup()
    try:
        event = Event()
        w.watch(event)
        w.watch(event)  # the loop calls it each time it polls: one wait
        assert not readable(w, timeout=0.1)
        event.done.set()
        assert readable(w, timeout=10)
        w.clear()
        second = Event()
        second.done.set()
        w.watch(second)  # the next step's: the same thread waits on it
        assert readable(w, timeout=10)
        assert (event.waits, second.waits) == (1, 1)
    finally:
        w.close()


def test_a_wake_up_after_close_does_nothing():
    w = Wakeup()
    w.watch(Event())  # never completes: close leaves its daemon thread waiting, and returns
    w.close()
    w.wake()


def test_an_event_whose_wait_fails_still_wakes_the_loop_and_the_next_one_is_watched():
    class Failing(Event):
        def synchronize(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access")  # the loop's own wait raises it

    w = Wakeup()
    try:
        w.watch(Failing())
        assert readable(w, timeout=10)
        w.clear()
        done = Event()
        done.done.set()
        w.watch(done)
        assert readable(w, timeout=10) and done.waits == 1
    finally:
        w.close()
