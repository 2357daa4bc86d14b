"""What stalls a Python process serving on an event loop: the loop running late (other work holding it, or the
process paused), and the garbage collector's full collections. A benchmark reads these to tell the cluster's
latency from its own client's or router's.

`LoopLag` wakes every `interval` seconds and counts each wake-up at least `threshold` late as a stall, with its
lateness; `GcPauses` times every collection of the oldest generation (gc.callbacks). Both only add up, so that a
caller takes differences over a window. `startup_heap_frozen` keeps full collections short while serving (the
router's `serve` and a worker's `run` hold it). `StallStacks` (opt-in) says where the loop was while it stalled.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

log = logging.getLogger(__name__)

INTERVAL_S = 0.005
THRESHOLD_S = 0.02  # a wake-up this late counts as a stall


@dataclass
class LoopLag:
    interval: float = INTERVAL_S
    threshold: float = THRESHOLD_S
    stalls: int = 0
    stalled_seconds: float = 0.0  # lateness of the stalls, summed
    longest: float = 0.0
    last_tick: float = 0.0  # perf_counter of the last wake-up (another thread may read it)

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            t = self.last_tick = time.perf_counter()
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
    """Seconds spent in full (oldest-generation) collections since `start`; `stop` detaches it. `on_pause`, if given,
    is called after each with its seconds."""

    def __init__(self, on_pause: Callable[[float], None] | None = None) -> None:
        self.count = 0
        self.seconds = 0.0
        self.longest = 0.0
        self.on_pause = on_pause
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
            if self.on_pause is not None:
                self.on_pause(pause)
            self._began = None


class StallStacks:
    """A sampling profiler of the stalls alone: a thread of its own looks every `every` seconds, and while the loop's
    last wake-up (`LoopLag.last_tick`) is more than `after` seconds old, records the loop thread's stack (its
    innermost `depth` frames). When the loop wakes again, one log line gives the stall's length and the stack
    sampled most in it; `top` sums the samples over all stalls. A sample costs a stack walk, and only while the loop
    is stalled."""

    def __init__(self, lag: LoopLag, after: float = 0.05, every: float = 0.01, depth: int = 12):
        self.lag, self.after, self.every, self.depth = lag, after, every, depth
        self.samples: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, args=(loop_thread,), name="stall-stacks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def top(self, n: int = 5) -> list[tuple[str, int]]:
        return self.samples.most_common(n)

    def _watch(self, loop_thread: int) -> None:
        stall: Counter[str] = Counter()
        began = 0.0
        while not self._stop.wait(self.every):
            silent = time.perf_counter() - self.lag.last_tick - self.lag.interval
            if silent > self.after:
                began = began or self.lag.last_tick
                frame = sys._current_frames().get(loop_thread)
                if frame is not None:
                    stall[self._format(frame)] += 1
            elif stall:
                stack, n = stall.most_common(1)[0]
                log.warning("event loop stalled for %.0f ms; its stack in %d of %d samples:\n%s",
                            1e3 * (time.perf_counter() - began), n, sum(stall.values()), stack)
                self.samples.update(stall)
                stall, began = Counter(), 0.0

    def _format(self, frame) -> str:
        return "".join(traceback.format_list(traceback.extract_stack(frame, limit=self.depth)))  # innermost, in order


class Stalls:
    """A process's own stalls over a span (`watching`): its loop's lateness and its full collections, summed, and
    its CPU over the span's wall time (`cpu_busy`: a loop busy most of the time queues what it reads, a wait no
    stall shows while it keeps giving its tasks turns); `stacks`: also log where the loop was in each stall longer
    than 50 ms (StallStacks)."""

    def __init__(self, stacks: bool = False) -> None:
        self.loop, self.gc = LoopLag(), GcPauses()
        self.stacks = StallStacks(self.loop) if stacks else None
        self.cpu_seconds = self.wall_seconds = 0.0

    @asynccontextmanager
    async def watching(self):
        task = asyncio.create_task(self.loop.run())
        self.gc.start()
        if self.stacks is not None:
            self.loop.last_tick = time.perf_counter()
            self.stacks.start()
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            yield self
        finally:
            self.cpu_seconds += time.process_time() - cpu
            self.wall_seconds += time.perf_counter() - wall
            if self.stacks is not None:
                self.stacks.stop()
            self.gc.stop()
            task.cancel()

    def totals(self) -> dict[str, float]:
        return {"loop_stalls": self.loop.stalls, "loop_stall_seconds": self.loop.stalled_seconds,
                "longest_loop_stall": self.loop.longest, "gc_pauses": self.gc.count, "gc_seconds": self.gc.seconds,
                "cpu_busy": self.cpu_seconds / self.wall_seconds if self.wall_seconds else 0.0}
