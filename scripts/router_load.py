"""Open-loop load on a router for scripts/bench_router.py: load processes that stay up across steps (connected once),
each sending its share of a Poisson rate of distinct text prompts through router.client.AsyncClient for a number of
seconds, and what one step measured. Latency runs from each request's scheduled send time, so a load process that
falls behind its schedule shows as latency, not as a lower rate."""
from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import os
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

from scripts.router_process import RouterProcess, other_cores

WORDS = ("the quick brown fox jumps over a lazy dog while seven bright stars shine above quiet hills and old "
         "rivers carry small boats past green fields toward distant towns").split()
WARMUP = 20  # requests per load process when it starts


@dataclass
class ShareResult:
    """One load process's part of a step."""

    latencies: list[float]  # seconds, of the requests answered
    failed: int  # errors and requests still unanswered when the step's drain time ran out
    first_send: float
    last_done: float


@dataclass
class StepResult:
    offered_rps: float
    served_rps: float  # answered / (last answer - first send)
    answered: int
    unanswered: int  # failed or not answered in time
    p50_ms: float
    p90_ms: float
    p99_ms: float
    cpu_ms: float  # the router's CPU per answered request over the step (its heartbeats' share included)
    busy: float  # the router's CPU seconds over the step's wall seconds


def prompts(rng: random.Random, words: int, tag: str) -> Iterator[str]:
    for i in range(1 << 62):
        yield f"{tag}{i} " + " ".join(rng.choices(WORDS, k=words))


def load_process(address: str, tokens: int, words: int, seed: int, router_core: int | None, commands: mp.Queue,
                 results: mp.Queue, stream: bool = False) -> None:
    """The entry point: connects, warms up, then runs each (rate, seconds, drain) step it is sent until None.
    `stream`: each request streamed (a delta a token), its latency to the result."""
    import uvloop

    from router.client import AsyncClient

    cores = other_cores(router_core)
    if cores:
        os.sched_setaffinity(0, cores)
    rng = random.Random(seed)
    texts = prompts(rng, words, f"c{seed}-")

    async def request(client) -> None:
        if not stream:
            await client.generate(next(texts), max_tokens=tokens, temperature=0)
            return
        answer = client.stream(next(texts), max_tokens=tokens, temperature=0)
        streamed = 0
        async for delta in answer:
            streamed += len(delta.token_ids)
        if answer.result is None or streamed != tokens:
            raise RuntimeError(f"a stream brought {streamed} of {tokens} tokens")

    async def main() -> None:
        client = AsyncClient(address, timeout=120)
        await client.wait_ready(timeout=60)
        for _ in range(WARMUP):
            await request(client)
        results.put("ready")
        loop = asyncio.get_running_loop()
        while (command := await loop.run_in_executor(None, commands.get)) is not None:
            results.put(await step(client, *command))
        await client.close()

    async def step(client, rate: float, seconds: float, drain: float) -> ShareResult:
        latencies: list[float] = []
        failed = 0
        last_done = 0.0

        async def one(scheduled: float) -> None:
            nonlocal failed, last_done
            try:
                await request(client)
            except Exception:
                failed += 1
                return
            last_done = time.perf_counter()
            latencies.append(last_done - scheduled)

        tasks = []
        start = time.perf_counter()
        due = start
        while (due := due + rng.expovariate(rate)) < start + seconds:
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(due)))
        _, late = await asyncio.wait(tasks, timeout=drain) if tasks else (set(), set())
        for t in late:
            t.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        return ShareResult(latencies, failed + len(late), start, last_done or start)

    uvloop.run(main())


class LoadPool:
    """`clients` load processes, pinned off the router's core."""

    def __init__(self, address: str, clients: int, tokens: int, words: int, router_core: int | None,
                 drain: float = 5.0, stream: bool = False):
        ctx = mp.get_context("spawn")
        self.drain = drain
        self.commands = [ctx.Queue() for _ in range(clients)]
        self.results = [ctx.Queue() for _ in range(clients)]
        self.procs = [ctx.Process(target=load_process, args=(address, tokens, words, i, router_core, c, r, stream))
                      for i, (c, r) in enumerate(zip(self.commands, self.results))]
        for p in self.procs:
            p.start()
        for r in self.results:
            assert r.get(timeout=120) == "ready"

    def step(self, rate: float, seconds: float, router: RouterProcess) -> StepResult:
        cpu0, t0 = router.cpu(), time.monotonic()
        for c in self.commands:
            c.put((rate / len(self.commands), seconds, self.drain))
        shares: list[ShareResult] = [r.get(timeout=seconds + self.drain + 60) for r in self.results]
        cpu, wall = router.cpu() - cpu0, time.monotonic() - t0
        latencies = sorted(x for s in shares for x in s.latencies)
        answered = len(latencies)
        span = max(s.last_done for s in shares) - min(s.first_send for s in shares)
        q = statistics.quantiles(latencies, n=100, method="inclusive") if answered > 1 else [math.nan] * 99
        return StepResult(offered_rps=rate, served_rps=answered / span if span > 0 else 0.0, answered=answered,
                          unanswered=sum(s.failed for s in shares), p50_ms=q[49] * 1e3, p90_ms=q[89] * 1e3,
                          p99_ms=q[98] * 1e3,
                          cpu_ms=cpu / answered * 1e3 if answered else float("inf"), busy=cpu / wall)

    def __enter__(self) -> LoadPool:
        return self

    def __exit__(self, *exc: object) -> None:
        for c in self.commands:
            c.put(None)
        for p in self.procs:
            p.join(timeout=15)
            if p.is_alive():
                p.kill()
                p.join()

