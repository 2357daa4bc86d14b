"""Probe (stop 48): under an MPS SM cap, does a CUDA graph replay what eager computes? cuBLAS GEMMs of a decode
step's shapes, and the engine's split-K and fused kernels, each eager and replayed from a graph; prints the largest
difference and whether the replay holds NaNs.

    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 python docs/gpu_runs/stop48_mps_graph_probe.py
"""
from __future__ import annotations

import torch

from common.engine.layers import splitk


def check(name, fn):
    eager = fn().clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    fn()  # warm-up
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    diff = (out.float() - eager.float()).abs().max().item()
    print(f"{name}: max |graph - eager| {diff:.3g}, NaN in replay: {bool(out.isnan().any())}", flush=True)


def main():
    torch.manual_seed(0)
    print("SMs seen:", torch.cuda.get_device_properties(0).multi_processor_count, flush=True)
    for rows in (1, 8, 64):
        for k, n in ((1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024), (1024, 151936)):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            check(f"cuBLAS {rows}x{k}x{n}", lambda x=x, w=w: torch.nn.functional.linear(x, w))
            if splitk.fits(x, w):
                check(f"split-K {rows}x{k}x{n}", lambda x=x, w=w: splitk.linear(x, w))


if __name__ == "__main__":
    main()
