import asyncio
import gc
import time

from common.stalls import GcPauses, LoopLag


def test_a_blocked_loop_counts_as_a_stall_and_an_idle_one_does_not():
    async def main():
        lag = LoopLag(interval=0.002, threshold=0.03)
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.1)
        idle = lag.stalls
        time.sleep(0.12)  # holds the loop, as a busy router or a pause would
        await asyncio.sleep(0.02)
        task.cancel()
        return idle, lag
    idle, lag = asyncio.run(main())
    assert idle == 0
    assert lag.stalls == 1 and 0.1 <= lag.longest <= lag.stalled_seconds < 0.5


def test_full_collections_are_timed_and_younger_ones_are_not():
    pauses = GcPauses().start()
    try:
        gc.collect(0)
        assert pauses.count == 0
        gc.collect()
        gc.collect(2)
        assert pauses.count == 2 and pauses.seconds >= pauses.longest > 0
    finally:
        pauses.stop()
    gc.collect()
    assert pauses.count == 2
    seen: list[float] = []
    told = GcPauses(on_pause=seen.append).start()
    try:
        gc.collect()
    finally:
        told.stop()
    assert len(seen) == 1 and seen[0] == told.longest > 0


def test_a_frozen_startup_heap_is_not_scanned_by_a_full_collection_while_serving():
    """What the process held before serving is frozen for the span (out of the collector's generations, so a full
    collection does not scan it) and given back after it; garbage made meanwhile is still freed."""
    import weakref

    from common.stalls import startup_heap_frozen

    startup = [[i] for i in range(100_000)]  # a startup heap: 100k tracked objects
    with startup_heap_frozen():
        assert gc.get_freeze_count() >= len(startup)
        assert len(gc.get_objects()) < len(startup)  # what a collection scans: not the startup heap

        class Node:
            pass
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle made while serving: only a full collection frees it
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    assert gc.get_freeze_count() == 0 and len(gc.get_objects()) > len(startup)
    del startup


def test_stall_stacks_name_the_function_that_held_the_loop(caplog):
    from common.stalls import Stalls

    def hold_the_loop_in_a_known_place():
        time.sleep(0.2)

    async def main():
        stalls = Stalls(stacks=True)
        async with stalls.watching():
            await asyncio.sleep(0.05)
            hold_the_loop_in_a_known_place()
            await asyncio.sleep(0.1)  # the loop wakes; the sampler's next look ends the stall
        return stalls
    with caplog.at_level("WARNING", logger="common.stalls"):
        stalls = asyncio.run(main())
    top = stalls.stacks.top(1)
    assert top and "hold_the_loop_in_a_known_place" in top[0][0] and top[0][1] >= 5
    lines = [r.getMessage() for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert len(lines) == 1 and "hold_the_loop_in_a_known_place" in lines[0]
