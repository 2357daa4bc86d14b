"""Probe (stop 49): the fused LM head and sampler's kernel, eager and replayed from a CUDA graph, at the SM share
this process was given under MPS. Its per-tile outputs start as a sentinel, so a program that did not store shows;
variants of stages and warps, and the tokens against the eager ones.

    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 python docs/gpu_runs/stop49_head_sampler_probe.py
"""
from __future__ import annotations

import torch
import triton

from common.engine.layers import head_sampler as hs

SENTINEL = -7
VOCAB, HIDDEN = 151936, 1024


def launch(h, w, temps, seeds, best, best_idx, warps, stages):
    rows = h.shape[0]
    block_m = min(hs.ROW_TILE, max(16, triton.next_power_of_2(rows)))
    tiles = best.shape[1]
    hs._head_sample_kernel[(triton.cdiv(rows, block_m), tiles)](
        h, w, temps, seeds, best, best_idx, rows, h.stride(0), best.stride(0), V=VOCAB, K=HIDDEN,
        BLOCK_M=block_m, BLOCK_N=hs.BLOCK_N, BLOCK_K=hs.BLOCK_K, num_warps=warps, num_stages=stages)


def probe(rows, warps, stages, w, replays=20):
    h = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    temps = torch.zeros(rows, device="cuda")
    seeds = torch.arange(rows, device="cuda", dtype=torch.int64)
    tiles = triton.cdiv(VOCAB, hs.BLOCK_N)
    best = torch.empty(rows, tiles, device="cuda")
    idx = torch.full((rows, tiles), SENTINEL, device="cuda", dtype=torch.int64)
    launch(h, w, temps, seeds, best, idx, warps, stages)
    torch.cuda.synchronize()
    eager_unwritten = int((idx == SENTINEL).sum())
    eager_idx = idx.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(h, w, temps, seeds, best, idx, warps, stages)
    bad_replays, unwritten, differs = 0, 0, 0
    for _ in range(replays):
        idx.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        n = int((idx == SENTINEL).sum())
        unwritten += n
        bad_replays += n > 0
        differs += int((idx != eager_idx).sum())
    print(f"rows {rows:2d} warps {warps} stages {stages}: eager unwritten {eager_unwritten}; graph: {bad_replays} of "
          f"{replays} replays with unwritten entries ({unwritten} in all), {differs} entries unlike eager", flush=True)


def tokens(rows, w):
    """The module's own sample(), eager and from a graph (its buffers from the graph's pool)."""
    h = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    temps = torch.zeros(rows, device="cuda")
    seeds = torch.arange(rows, device="cuda", dtype=torch.int64)
    eager = hs.sample(h, w, temps, seeds)
    out = torch.empty(rows, device="cuda", dtype=torch.int64)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        hs.sample(h, w, temps, seeds, out=out)
    beyond = same = 0
    for _ in range(20):
        out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        beyond += int(((out < 0) | (out >= VOCAB)).sum())
        same += bool(torch.equal(out, eager))
    print(f"sample() rows {rows:2d}: replays equal to eager {same} of 20, tokens outside the vocabulary {beyond}",
          flush=True)


def main():
    torch.manual_seed(0)
    print("SMs seen:", torch.cuda.get_device_properties(0).multi_processor_count, flush=True)
    w = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.bfloat16) / HIDDEN ** 0.5
    for rows in (1, 64):
        tokens(rows, w)
    for rows in (1, 8, 64):
        for warps, stages in ((4, 3), (4, 2), (8, 3), (4, 1)):
            probe(rows, warps, stages, w)


if __name__ == "__main__":
    main()
