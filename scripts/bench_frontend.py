"""The HTTP front end's cost: latency per request (p50, p99) and the requests/s one router core sustains, through
HTTP (`/v1/completions`) and through the ZMQ client, against a worker that answers at once.

    python -m scripts.bench_frontend --model DIR [--requests 2000] [--concurrency 1,64] [--tokens 16]
    python -m scripts.bench_frontend --model DIR --prompt-tokens 1024 --stream   # aiperf's side against bench's

Three kinds of process: the router (with `--http`), pinned to `--router-core`; an instant colocated worker (it
answers each `generate_task` with `--tokens` tokens in one `token_batch`, no engine); and `--clients` load processes
(the official-API-shaped HTTP client is httpx, the ZMQ one router.client.AsyncClient), each running
`concurrency / clients` requests at a time. The router's CPU time over each run is read from /proc: its CPU per request
is the front end's cost whatever limits the measured req/s, and its inverse the requests/s one router core sustains
(on a machine with few cores the load processes, not the router, may bound the measured req/s). Prints one table;
docs/benchmarks.md keeps the figures.

With --prompt-tokens N each request carries a prompt of N tokens: as text through HTTP (the router tokenizes it, as
for aiperf's requests) and as the same token ids through ZMQ (as `pdcluster bench` sends them). With --stream the
latency is to the first streamed token (a TTFT: the first SSE `data:` line with text, the first ZMQ delta).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import time

from scripts.instant_workers import run_fleet
from scripts.router_process import RouterProcess, RouterSpec, cpu_seconds, free_port, stop_processes

PROMPT = "The quick brown fox jumps over the lazy dog"
WARMUP = 20  # requests per load process before the clock starts


# ---- the load ---------------------------------------------------------------------------------------------------


def prompts(model: str, prompt_tokens: int) -> tuple[str, str | list[int]]:
    """The prompt as HTTP and as ZMQ send it: PROMPT twice, or N tokens' text and its token ids."""
    if not prompt_tokens:
        return PROMPT, PROMPT
    from common.prompt import load_tokenizer

    tokenizer = load_tokenizer(model)
    ids = tokenizer.encode(" ".join([PROMPT] * prompt_tokens), add_special_tokens=False)[:prompt_tokens]
    text = tokenizer.decode(ids)
    return text, tokenizer.encode(text, add_special_tokens=False)


def run_load(kind: str, target: str, model: str, requests: int, concurrency: int, tokens: int, prompt_tokens: int,
             stream: bool, out: mp.Queue) -> None:
    """`requests` requests, `concurrency` at a time; puts (latencies, wall seconds): to the whole answer, or with
    `stream` to its first token."""
    import uvloop

    text, ids = prompts(model, prompt_tokens)

    async def main() -> tuple[list[float], float]:
        latencies: list[float] = []
        left = iter(range(requests))
        if kind == "http":
            import httpx2 as httpx

            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            client = httpx.AsyncClient(base_url=target, limits=limits, timeout=60)
            body = {"model": model, "prompt": text, "max_tokens": tokens, "temperature": 0, "stream": stream}

            async def one() -> float:
                t = time.perf_counter()
                if not stream:
                    r = await client.post("/v1/completions", json=body)
                    assert r.status_code == 200, r.text
                    return time.perf_counter() - t
                first = None
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if first is None and line.startswith("data:") and line[5:].strip() != "[DONE]":
                            choices = json.loads(line[5:]).get("choices") or [{}]
                            if choices[0].get("text"):
                                first = time.perf_counter() - t
                return first
        else:
            from router.client import AsyncClient

            client = AsyncClient(target, timeout=60)

            async def one() -> float:
                t = time.perf_counter()
                if not stream:
                    await client.generate(ids, max_tokens=tokens, temperature=0)
                    return time.perf_counter() - t
                first = None
                async for _ in client.stream(ids, max_tokens=tokens, temperature=0):
                    if first is None:
                        first = time.perf_counter() - t
                return first

        async def lane() -> None:
            for _ in left:
                latencies.append(await one())

        for _ in range(min(WARMUP, requests)):  # warm-up: connections, the router's first requests
            await one()
        start = time.perf_counter()
        await asyncio.gather(*[lane() for _ in range(concurrency)])
        wall = time.perf_counter() - start
        await (client.aclose() if kind == "http" else client.close())
        return latencies, wall

    out.put(uvloop.run(main()))


# ---- the driver -------------------------------------------------------------------------------------------------


def measure(kind: str, target: str, args, concurrency: int, router_pid: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    clients = min(args.clients, concurrency)
    per = [args.requests // clients + (i < args.requests % clients) for i in range(clients)]
    lanes = [concurrency // clients + (i < concurrency % clients) for i in range(clients)]
    procs = [ctx.Process(target=run_load, args=(kind, target, args.model, n, c, args.tokens, args.prompt_tokens,
                                                args.stream, out))
             for n, c in zip(per, lanes)]
    cpu0 = cpu_seconds(router_pid)
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    latencies = sorted(x for lat, _ in results for x in lat)
    wall = max(w for _, w in results)
    served = len(latencies) + sum(min(WARMUP, n) for n in per)
    cpu_ms = (cpu_seconds(router_pid) - cpu0) / served * 1e3  # the router's CPU per request, warm-ups included
    q = statistics.quantiles(latencies, n=100)
    return {"p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "rps": len(latencies) / wall, "cpu_ms": cpu_ms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint folder (its tokenizer; e.g. prepare-model random)")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", default="1,64", help="comma-separated")
    p.add_argument("--tokens", type=int, default=16, help="tokens each answer carries")
    p.add_argument("--prompt-tokens", type=int, default=0, help="tokens each prompt carries (text through HTTP, "
                                                                 "ids through ZMQ); 0: a short sentence")
    p.add_argument("--stream", action="store_true", help="latency to the first streamed token")
    p.add_argument("--clients", type=int, default=2, help="load processes")
    p.add_argument("--router-core", type=int, default=0, help="CPU the router is pinned to (-1: not pinned)")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    http_port = free_port()
    spec = RouterSpec(args.model, "colocated", http_port, None if args.router_core < 0 else args.router_core)
    with RouterProcess(spec) as router:
        stop = ctx.Event()
        worker = ctx.Process(target=run_fleet, args=(router.worker_address, [("c0", "colocated")], args.tokens, stop))
        worker.start()
        time.sleep(1.5)  # the hello and a heartbeat
        try:
            what = "TTFT" if args.stream else "latency"
            print(f"{'client':<6} {'conc':>5} {what + ' p50 ms':>14} {what + ' p99 ms':>14} {'req/s':>8} "
                  f"{'router CPU ms/req':>18} "
                  f"{'req/s per router core':>22}")
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                for kind, target in (("zmq", spec.address), ("http", f"http://127.0.0.1:{http_port}")):
                    r = measure(kind, target, args, concurrency, router.pid)
                    print(f"{kind:<6} {concurrency:>5} {r['p50_ms']:>14.2f} {r['p99_ms']:>14.2f} {r['rps']:>8.0f} "
                          f"{r['cpu_ms']:>18.3f} {1e3 / r['cpu_ms']:>22.0f}", flush=True)
        finally:
            stop.set()
            stop_processes([worker])

if __name__ == "__main__":
    main()
