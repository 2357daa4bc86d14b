"""The asyncio client's own cost under streamed load: what `pdcluster bench` (one AsyncClient for all its requests)
adds to the TTFT it measures, apart from the cluster.

    python -m scripts.bench_client [--rates 16,32,48,64] [--seconds 8] [--tokens 256] [--step-ms 6]

A stand-in router (its own process) answers each Submit with its first Delta at once, then one Delta a stream every
`--step-ms` (all streams in one tick, as a decode step's token batch comes), then the Result. The client process
sends open-loop Poisson streams at each rate; its TTFT is the client's and the sockets' alone (the router answers at
once), and its CPU a delta is what a streamed token costs it. On one core each (`--cores`), the client's and the
stand-in's, where the machine has two. One line a rate on stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import resource
import time

from common import protocol as P
from scripts.bench_metrics import percentile


def stand_in_router(address: str, step_s: float, core: int | None) -> None:
    """Streams `max_tokens` deltas to each request: the first at once, then one a tick."""
    import zmq

    if core is not None:
        os.sched_setaffinity(0, {core})
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(address)
    streams: dict[str, list] = {}  # request id -> [identity, tokens left, next index]
    tick = time.monotonic() + step_s
    while True:
        if sock.poll(max(0.0, tick - time.monotonic()) * 1e3):
            identity, frame = sock.recv_multipart()
            msg = P.decode(frame)
            if isinstance(msg, P.Ping):
                sock.send_multipart([identity, P.encode(P.Pong(nonce=msg.nonce))])
            elif isinstance(msg, P.Submit):
                sock.send_multipart([identity, P.encode(P.Delta(request_id=msg.request_id, token_ids=[7], text="a",
                                                                index=0))])
                streams[msg.request_id] = [identity, msg.sampling.max_tokens - 1, 1]
        if time.monotonic() < tick:
            continue
        tick += step_s
        for rid, state in list(streams.items()):
            identity, left, index = state
            if left:
                sock.send_multipart([identity, P.encode(P.Delta(request_id=rid, token_ids=[7], text="a",
                                                                index=index))])
                state[1:] = [left - 1, index + 1]
                continue
            usage = P.Usage(prompt_tokens=4, completion_tokens=index, cached_tokens=0)
            sock.send_multipart([identity, P.encode(P.Result(
                request_id=rid, token_ids=[7] * index, text="a" * index, finish_reason="length", usage=usage,
                timings=P.Timings(queued=0.0, ttft=0.0, e2e=0.0, itl=[])))])
            del streams[rid]


async def load(address: str, rate: float, seconds: float, tokens: int) -> str:
    """One rate's Poisson streams; the line that reports them."""
    from router.client import AsyncClient

    rng, ttfts = random.Random(0), []
    async with AsyncClient(address, timeout=60) as client:
        await client.ping()

        async def one() -> None:
            start, first = time.perf_counter(), None
            async for _ in client.stream([1, 2, 3, 4], max_tokens=tokens, ignore_eos=True):
                if first is None:
                    first = time.perf_counter() - start
            ttfts.append(first)

        tasks, at, n = [], 0.0, max(1, round(rate * seconds))
        before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(n):
            at += rng.expovariate(rate)
            if (delay := t0 + at - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    ms = [1e3 * t for t in ttfts]
    return (f"{rate:g} req/s, {n} streams of {tokens} tokens: TTFT p50/p90/p99 {percentile(ms, 50):.2f}/"
            f"{percentile(ms, 90):.2f}/{percentile(ms, 99):.2f} ms; client CPU {100 * cpu / wall:.0f}% of a core, "
            f"{1e6 * cpu / (n * tokens):.1f} us a delta")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="16,32,48,64", help="comma list of requests/s")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds of arrivals at each rate")
    p.add_argument("--tokens", type=int, default=256, help="deltas a stream")
    p.add_argument("--step-ms", type=float, default=6.0, help="between a stream's deltas (a decode step)")
    p.add_argument("--cores", default="0,1", help="the stand-in's core and the client's ('': not pinned)")
    args = p.parse_args(argv)
    cores = [int(c) for c in args.cores.split(",")] if args.cores else [None, None]
    address = f"ipc:///tmp/pdcluster-bench-client-{os.getpid()}"
    router = mp.get_context("spawn").Process(target=stand_in_router, args=(address, args.step_ms / 1e3, cores[0]),
                                             daemon=True)
    router.start()
    try:
        if cores[1] is not None:
            os.sched_setaffinity(0, {cores[1]})
        for rate in (float(r) for r in args.rates.split(",")):
            print(asyncio.run(load(address, rate, args.seconds, args.tokens)), flush=True)
    finally:
        router.terminate()
        router.join()


if __name__ == "__main__":
    main()
