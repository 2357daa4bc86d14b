"""Probe (stop 28): how long a short GPU job of one process waits while another process keeps the GPU busy with
work always queued, as a decode worker does with overlapped scheduling (no MPS: the GPU time-slices them).

Stop 20's probe (`stop20_timeslice_probe.py`) left the decode side a 0.1 ms host gap between steps, and a short job
there waited only for the step in flight. A served decode worker launches step N+1 before it waits for step N, so
its context never runs dry. Process D here does the same: it replays a CUDA graph of ~DECODE_MS, keeping one replay
queued behind the one running. Process P submits a job of W ms every ~40 ms and times it from submission to its
end (W = 0.3 ms stands for a prefill worker's KV copy, the rest for prompt steps), alone and beside D.

    PYTHONPATH=... python docs/gpu_runs/stop28_turn_probe.py
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.multiprocessing as mp

DECODE_MS = 1.5
JOBS_MS = (0.3, 1.0, 3.0, 6.0)
REPEATS = 40


def chain(target_ms: float, size: int = 2048) -> tuple[torch.cuda.CUDAGraph, float]:
    """A CUDA graph of matmuls lasting about `target_ms` alone, and its time alone (ms)."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, b)
    torch.cuda.synchronize()

    def make(k: int) -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(k):
                torch.mm(a, b)
        return g

    def timed(g: torch.cuda.CUDAGraph) -> float:
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            g.replay()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times)

    one = timed(make(1))
    k = max(1, round(target_ms / one))
    g = make(k)
    return g, timed(g)


def decode_side(stop, ready, out) -> None:
    graph, ms = chain(DECODE_MS)
    out.put(ms)
    ready.wait()
    prev = None
    ends = []
    while not stop.is_set():
        graph.replay()
        event = torch.cuda.Event()
        event.record()
        if prev is not None:
            prev.synchronize()  # step N's end, with step N+1 already queued behind it
            ends.append(time.perf_counter())
        prev = event
    prev.synchronize()
    out.put(ends)


def main() -> None:
    ctx = mp.get_context("spawn")
    stop, ready, q = ctx.Event(), ctx.Event(), ctx.Queue()
    print(torch.cuda.get_device_name(), flush=True)
    jobs = {w: chain(w) for w in JOBS_MS}

    def run(graph: torch.cuda.CUDAGraph) -> float:
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        return 1e3 * (time.perf_counter() - start)

    alone = {w: statistics.median(run(jobs[w][0]) for _ in range(REPEATS)) for w in JOBS_MS}
    d = ctx.Process(target=decode_side, args=(stop, ready, q))
    d.start()
    decode_ms = q.get()
    ready.set()
    time.sleep(1.0)
    shared = {w: [] for w in JOBS_MS}
    for _ in range(REPEATS):
        for w in JOBS_MS:
            time.sleep(0.04)
            shared[w].append(run(jobs[w][0]))
    stop.set()
    ends = q.get()
    d.join()
    steps = sorted(1e3 * (b - a) for a, b in zip(ends, ends[1:]))
    print(f"decode step (its graph alone {decode_ms:.3f} ms): interval p50 {steps[len(steps) // 2]:.3f} ms, p90 "
          f"{steps[int(0.9 * len(steps))]:.3f}, max {steps[-1]:.3f}", flush=True)
    print("job (graph alone ms) | alone p50 | beside the busy decode side: p10 / p50 / p90 / max | p50 - alone")
    for w in JOBS_MS:
        s = sorted(shared[w])
        p = lambda f: s[min(len(s) - 1, int(f * len(s)))]
        print(f"{w:>5} ({jobs[w][1]:.3f}) | {alone[w]:.3f} | {p(0.1):.3f} / {p(0.5):.3f} / {p(0.9):.3f} / {s[-1]:.3f} | "
              f"{p(0.5) - alone[w]:.3f}", flush=True)


if __name__ == "__main__":
    main()
