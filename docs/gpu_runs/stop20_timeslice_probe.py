"""Probe (stop 20): how two processes share one GPU (no MPS), the case of `serve --gpus-per-worker 0.5`.

Process D plays a decode worker: CUDA-graph replays of ~DECODE_MS of short kernels, one after another with a short
host gap. Process P plays a prefill worker: every ~80 ms one job of W ms of longer kernels (a graph), W from short
prompt to long prompt. Each side times its own work (launch to synchronize) with the other idle and while both run.
Prints, per W: P's job time alone and shared (and shared / alone), and D's step time during P's jobs (p50, p90,
max), against processor sharing's prediction (each side at half pace while both have work).

    PYTHONPATH=... python docs/gpu_runs/stop20_timeslice_probe.py
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

DECODE_MS, GAP_S = 1.5, 100e-6
JOBS_MS = (1, 2, 4, 8, 16, 32, 64)
REPEATS = 12


def chain_graph(n: int, size: int, target_ms: float):
    """A CUDA graph of matmuls of `size` lasting about `target_ms` alone."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, b)  # cuBLAS's handle, outside the capture
    torch.cuda.synchronize()

    def make(k):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(k):
                torch.mm(a, b)
        return g

    g = make(n)
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    per = (time.perf_counter() - t) / 5 / n
    k = max(1, round(target_ms * 1e-3 / per))
    g = make(k)
    g.replay()
    torch.cuda.synchronize()
    return g, (a, b)


def timed(g) -> tuple[float, float]:
    t = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    return t, time.perf_counter()


def decode_side(stop, ready, out):
    g, keep = chain_graph(50, 1024, DECODE_MS)
    ready.wait()
    steps = []
    while not stop.is_set():
        steps.append(timed(g))
        t = time.perf_counter()
        while time.perf_counter() - t < GAP_S:
            pass
    out.put(steps)


def jobs_beside(jobs: dict, ready, stop, queue, repeats: int) -> tuple[list, dict, float]:
    """The decode side (started, waiting for `ready`) alone for a second, then each job of `jobs` (ms -> graph) every
    80 ms beside it, `repeats` rounds. Returns the decode side's steps (start, end), each job's, and when the decode
    side's steps alone ended."""
    ready.set()
    time.sleep(1.0)
    t_alone_end = time.perf_counter()
    shared = {w: [] for w in jobs}
    for _ in range(repeats):
        for w, (graph, _) in jobs.items():
            time.sleep(0.08)
            shared[w].append(timed(graph))
    time.sleep(0.2)
    stop.set()
    return queue.get(), shared, t_alone_end


def main():
    ctx = mp.get_context("spawn")
    stop, ready, q = ctx.Event(), ctx.Event(), ctx.Queue()
    print(torch.cuda.get_device_name(), flush=True)
    jobs = {w: chain_graph(20, 4096, w) for w in JOBS_MS}
    alone = {w: statistics.median(b - a for a, b in (timed(jobs[w][0]) for _ in range(5))) for w in JOBS_MS}
    d = ctx.Process(target=decode_side, args=(stop, ready, q))
    d.start()
    time.sleep(20)  # the other process builds its graph
    steps, shared, t_alone_end = jobs_beside(jobs, ready, stop, q, REPEATS)
    d.join()
    base = [b - a for a, b in steps if b < t_alone_end - 0.05]
    d_alone = statistics.median(base)
    print(f"decode step alone: p50 {1e3 * d_alone:.3f} ms  (steps {len(base)})", flush=True)
    print("job ms | job alone | shared p50 (x alone) | PS predicts | decode steps overlapping: n p50 p90 max (ms)")
    for w in JOBS_MS:
        lat = [b - a for a, b in shared[w]]
        over = [b - a for a, b in steps for (s, e) in shared[w] if a < e and b > s]
        over.sort()
        p = lambda f: 1e3 * over[min(len(over) - 1, int(f * len(over)))] if over else float("nan")
        # PS: while P's job runs, D is busy a share DECODE/(DECODE+GAP) of the time; P goes at half pace then
        duty = d_alone / (d_alone + GAP_S)
        ps = alone[w] * (1 + duty)
        print(f"{w:5d} | {1e3 * alone[w]:8.3f} | {1e3 * statistics.median(lat):8.3f} ({statistics.median(lat) / alone[w]:.2f}x) "
              f"| {1e3 * ps:8.3f} | {len(over)} {p(0.5):.3f} {p(0.9):.3f} {1e3 * over[-1] if over else float('nan'):.3f}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
