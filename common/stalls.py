"""What stalls a Python process serving on an event loop: the loop running late (other work holding it, or the
process paused), and the garbage collector's full collections. A benchmark reads these to tell the cluster's
latency from its own client's or router's.

`LoopLag` wakes every `interval` seconds and counts each wake-up at least `threshold` late as a stall, with its
lateness; `GcPauses` times every collection of the oldest generation (gc.callbacks). Both only add up, so that a
caller takes differences over a window. `startup_heap_frozen` keeps full collections short while serving (the
router's `serve` and a worker's `run` hold it).
"""
from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

INTERVAL_S = 0.005
THRESHOLD_S = 0.02  # a wake-up this late counts as a stall


@dataclass
class LoopLag:
    interval: float = INTERVAL_S
    threshold: float = THRESHOLD_S
    stalls: int = 0
    stalled_seconds: float = 0.0  # lateness of the stalls, summed
    longest: float = 0.0

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval)
            late = time.perf_counter() - t - self.interval
            if late >= self.threshold:
                self.stalls += 1
                self.stalled_seconds += late
                self.longest = max(self.longest, late)


@contextmanager
def startup_heap_frozen() -> Iterator[None]:
    """While serving: what the process allocated to start (modules, the tokenizer, the model's Python objects, the
    Ray driver) is out of the garbage collector's sight, so that a full collection scans only what serving
    allocates. An engine process holds a few hundred thousand such objects, and scanning them all makes each full
    collection a pause in the middle of a decode or of the router's loop (docs/benchmarks.md, stop 21)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class GcPauses:
    """Seconds spent in full (oldest-generation) collections since `start`; `stop` detaches it."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.longest = 0.0
        self._began: float | None = None

    def start(self) -> GcPauses:
        gc.callbacks.append(self._on_gc)
        return self

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            pause = time.perf_counter() - self._began
            self.count += 1
            self.seconds += pause
            self.longest = max(self.longest, pause)
            self._began = None


class Stalls:
    """A process's own stalls over a span (`watching`): its loop's lateness and its full collections, summed."""

    def __init__(self) -> None:
        self.loop, self.gc = LoopLag(), GcPauses()

    @asynccontextmanager
    async def watching(self):
        task = asyncio.create_task(self.loop.run())
        self.gc.start()
        try:
            yield self
        finally:
            self.gc.stop()
            task.cancel()

    def totals(self) -> dict[str, float]:
        return {"loop_stalls": self.loop.stalls, "loop_stall_seconds": self.loop.stalled_seconds,
                "longest_loop_stall": self.loop.longest, "gc_pauses": self.gc.count, "gc_seconds": self.gc.seconds}
