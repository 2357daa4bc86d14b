"""What wakes a worker's loop out of its poll: a pipe it polls beside its sockets, written when something it waits
for happens on another thread. A step's GPU work ending (a thread waits on the step's CUDA event, without the GIL),
a KV transfer ending (the transport's thread), a KV link opened.

Why not poll: a loop that polls a running step holds the GIL but between its calls, and a KV link thread, which
needs the GIL between each of its operations, then gets it back only as often as the loop lets go of it
(docs/benchmarks.md, stops 34, 35 and 37). Blocked in `zmq_poll`, the loop holds nothing.
"""
from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from typing import Protocol

log = logging.getLogger(__name__)


class Event(Protocol):
    """A CUDA event, or anything that can be waited for the same way."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class Wakeup:
    """A readable file descriptor while a wake-up is pending (`fileno`, for a zmq.Poller); `clear` takes them."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._events: queue.SimpleQueue[Event | None] = queue.SimpleQueue()
        self._watched: Event | None = None
        self._waiter: threading.Thread | None = None
        self._lock = threading.Lock()  # a wake-up from another thread never writes to a closed (reused) descriptor
        self._closed = False

    def fileno(self) -> int:
        return self._read

    def wake(self) -> None:
        """From any thread: the loop's poll returns (at once, or as soon as it polls again)."""
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self._write, b"\0")
            except BlockingIOError:  # the pipe is full of wake-ups not yet taken: the loop wakes anyway
                pass

    def watch(self, event: Event) -> None:
        """Wake the loop once `event` has completed. Watching the event watched last does nothing."""
        if event is self._watched:
            return
        self._watched = event
        if self._waiter is None:
            self._waiter = threading.Thread(target=self._wait, args=(_current_cuda_device(),),
                                            name="step-waiter", daemon=True)
            self._waiter.start()
        self._events.put(event)

    def clear(self) -> None:
        """Take the pending wake-ups (the loop then checks what it waits for)."""
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """The waiting thread ends after the event it waits on (a daemon: a hung step does not hold the exit)."""
        self._events.put(None)
        with self._lock:
            self._closed = True
            os.close(self._read)
            os.close(self._write)

    def _wait(self, device: int | None) -> None:
        if device is not None:  # the loop's device: the thread's CUDA calls go to the context the events belong to
            import torch

            torch.cuda.set_device(device)
        while (event := self._events.get()) is not None:
            try:
                event.synchronize()  # a CUDA event's wait lets go of the GIL
            except Exception:  # a failed step: the loop's own wait on the event raises it where it is handled
                log.debug("waiting on a step's event failed", exc_info=True)
            self.wake()


def _current_cuda_device() -> int | None:
    """The calling thread's CUDA device, where CUDA is in use (without starting it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()
