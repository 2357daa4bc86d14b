"""Probe (stop 48): two processes on one GPU under CUDA MPS, each given a share of the SMs
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), against the same pair time-sliced (stop 20's probe, stop48_mps.sh).

Process D plays a decode worker: a CUDA graph shaped like a Qwen3-0.6B decode step at 64 rows (each of 28 layers:
the four projections' GEMMs on weights of their size, and a read of KV_MB of "cache"), replayed back to back with a
short host gap. Process P plays a prefill worker: every ~80 ms one job of W ms of large matmuls. Each side times its
own work alone (at its own share) and while the other runs. If both stay near their alone figures, a GPU split this
way serves as two smaller GPUs, each costed by a profile measured at its share.

    D_PCT=30 P_PCT=70 python docs/gpu_runs/stop48_mps_share_probe.py   # under a running MPS daemon
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

PCT = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
if __name__ == "__main__":  # before torch loads CUDA (set later, the share was not applied); not in the child
    os.environ[PCT] = os.environ.get("P_PCT", "100")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

_spec = importlib.util.spec_from_file_location("stop20", Path(__file__).with_name("stop20_timeslice_probe.py"))
stop20 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stop20)

GAP_S = 100e-6
JOBS_MS = (2, 8, 32)
REPEATS = 10
KV_MB = 64


def decode_graph():
    rows, layers = 64, 28
    shapes = [(1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024)]
    weights = [[torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for k, n in shapes] for _ in range(layers)]
    xs = [torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for k, _ in shapes]
    kv = [torch.randn(KV_MB << 19, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    torch.mm(xs[0], weights[0][0])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for layer in range(layers):
            for x, w in zip(xs, weights[layer]):
                torch.mm(x, w)
            kv[layer].sum()
    g.replay()
    torch.cuda.synchronize()
    return g, (weights, xs, kv)


def decode_side(stop, ready, built, out):
    g, keep = decode_graph()
    built.set()
    ready.wait()
    steps = []
    while not stop.is_set():
        steps.append(stop20.timed(g))
        t = time.perf_counter()
        while time.perf_counter() - t < GAP_S:
            pass
    out.put(steps)


def main():
    ctx = mp.get_context("spawn")
    stop, ready, built, q = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    print(torch.cuda.get_device_name(), "P", os.environ[PCT], "D", os.environ.get("D_PCT", "100"), "SMs seen by P:",
          torch.cuda.get_device_properties(0).multi_processor_count, flush=True)
    jobs = {w: stop20.chain_graph(20, 4096, w) for w in JOBS_MS}
    alone = {w: statistics.median(b - a for a, b in (stop20.timed(jobs[w][0]) for _ in range(5))) for w in JOBS_MS}
    os.environ[PCT] = os.environ.get("D_PCT", "100")  # the child's context, made after the spawn
    d = ctx.Process(target=decode_side, args=(stop, ready, built, q))
    d.start()
    built.wait()
    steps, shared, t_alone_end = stop20.jobs_beside(jobs, ready, stop, q, REPEATS)
    d.join()
    base = [b - a for a, b in steps if b < t_alone_end - 0.05]
    d_alone = statistics.median(base)
    print(f"decode step alone: p50 {1e3 * d_alone:.3f} ms (steps {len(base)})", flush=True)
    print("job ms | job alone | shared p50 (x alone) | decode steps overlapping: n p50 p90 (x alone)")
    for w in JOBS_MS:
        lat = statistics.median(b - a for a, b in shared[w])
        over = sorted(b - a for a, b in steps for (s, e) in shared[w] if a < e and b > s)
        p50, p90 = (over[min(len(over) - 1, int(f * len(over)))] if over else float("nan") for f in (0.5, 0.9))
        print(f"{w:5d} | {1e3 * alone[w]:8.3f} | {1e3 * lat:8.3f} ({lat / alone[w]:.2f}x) | {len(over)} "
              f"{1e3 * p50:.3f} {1e3 * p90:.3f} ({p50 / d_alone:.2f}x)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
