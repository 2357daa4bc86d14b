"""Probe (stop 28): the two projections of 1,024 outputs in a Qwen3-0.6B decode step at 64 rows (o_proj, K=2048;
down_proj, K=3072). On an H200 cuBLAS runs them at 0.7-0.9 TB/s, down_proj with a separate split-K reduce kernel
(`bench_engine profile --batch 64`: 146.6 + 55.9 and 163.8 us a step), since 1,024 outputs make few tiles. This
times, for 28 layers of distinct weights in one CUDA graph, cuBLAS against a Triton split-K kernel that reduces in
the same launch (the last program of an output tile to finish sums the tile's partials), launched with programmatic
dependent launch and loading its first weight tile before it waits. Prints us a layer (the two projections) and
the largest difference from cuBLAS.

    PYTHONPATH=... python docs/gpu_runs/stop28_splitk_probe.py
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from scripts.bench_gpu import graph_us

H, Q, I, LAYERS, ROWS = 1024, 2048, 3072, 28, 64
dev = torch.device("cuda")


@triton.jit
def _splitk_kernel(x_ptr, w_ptr, part_ptr, count_ptr, out_ptr, M, stride_x, stride_o,
                   N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   SPLIT: tl.constexpr, SHARE: tl.constexpr):
    """Grid (N / BN, SPLIT): program (n, s) multiplies rows [0, M) by W's rows [n BN, (n+1) BN) over K's s-th
    share, writes the fp32 partial, and the tile's last program to finish sums the SPLIT partials into out."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    k0 = pid_k * SHARE
    w_rows = w_ptr + cols[:, None].to(tl.int64) * K
    w = tl.load(w_rows + (k0 + ks)[None, :])  # the first weight tile, before waiting for x
    tl.extra.cuda.gdc_launch_dependents()
    tl.extra.cuda.gdc_wait()
    rows = tl.arange(0, BM)
    row_ok = rows < M
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_x
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(k0, k0 + SHARE, BK):
        x = tl.load(x_rows + (k + ks)[None, :], mask=row_ok[:, None], other=0.0)
        if k > k0:
            w = tl.load(w_rows + (k + ks)[None, :])
        acc = tl.dot(x, tl.trans(w), acc)
    tile = part_ptr + (pid_n * SPLIT).to(tl.int64) * BM * BN + rows[:, None] * BN + tl.arange(0, BN)[None, :]
    tl.store(tile + pid_k * BM * BN, acc)
    tl.debug_barrier()
    done = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
    if done == SPLIT - 1:
        total = tl.zeros((BM, BN), dtype=tl.float32)
        for s in range(SPLIT):
            total += tl.load(tile + s * BM * BN, cache_modifier=".cg")
        out = out_ptr + rows[:, None].to(tl.int64) * stride_o + cols[None, :]
        tl.store(out, total.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        tl.atomic_xchg(count_ptr + pid_n, 0)


class SplitK:
    def __init__(self, n: int, bn: int, split: int, bk: int = 128, warps: int = 4, stages: int = 2):
        self.n, self.bn, self.split, self.bk, self.warps, self.stages = n, bn, split, bk, warps, stages
        self.part = torch.empty(n // bn * split * ROWS * bn, dtype=torch.float32, device=dev)
        self.count = torch.zeros(n // bn, dtype=torch.int32, device=dev)

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        m, k = x.shape
        out = torch.empty(m, self.n, dtype=x.dtype, device=dev)
        _splitk_kernel[(self.n // self.bn, self.split)](
            x, w, self.part, self.count, out, m, x.stride(0), out.stride(0), N=self.n, K=k, BM=ROWS, BN=self.bn,
            BK=self.bk, SPLIT=self.split, SHARE=k // self.split, num_warps=self.warps, num_stages=self.stages, launch_pdl=True)
        return out


def timed(fn) -> float:
    """us a layer: fn runs all 28 layers, replayed from a CUDA graph."""
    return graph_us(fn, reps=50) / LAYERS


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), flush=True)
    wo = [torch.randn(H, Q, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
    wd = [torch.randn(H, I, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
    xo = torch.randn(ROWS, Q, device=dev, dtype=torch.bfloat16)
    xd = torch.randn(ROWS, I, device=dev, dtype=torch.bfloat16)
    outs = {}

    def cublas():
        for layer in range(LAYERS):
            outs["o"] = F.linear(xo, wo[layer])
            outs["d"] = F.linear(xd, wd[layer])

    base = timed(cublas)
    ref_o, ref_d = F.linear(xo, wo[-1]), F.linear(xd, wd[-1])
    print(f"cuBLAS: {base:.2f} us a layer (o_proj + down_proj, 64 rows)", flush=True)
    results = []
    for bn, split_o, split_d, warps, stages in itertools.product((16, 32, 64), (8, 16), (6, 12), (4,), (2,)):
        if Q // split_o % 128 or I // split_d % 128:
            continue
        ko, kd = SplitK(H, bn, split_o, warps=warps, stages=stages), SplitK(H, bn, split_d, warps=warps, stages=stages)

        def triton_both():
            for layer in range(LAYERS):
                outs["o"] = ko(xo, wo[layer])
                outs["d"] = kd(xd, wd[layer])

        try:
            us = timed(triton_both)
        except Exception as e:  # a launch that does not fit the SM (shared memory, registers)
            print(f"BN {bn} split {split_o}/{split_d} stages {stages}: {type(e).__name__}", flush=True)
            continue
        err = max((ko(xo, wo[-1]) - ref_o).abs().max().item(), (kd(xd, wd[-1]) - ref_d).abs().max().item())
        results.append((us, bn, split_o, split_d, stages, err))
    for us, bn, split_o, split_d, stages, err in sorted(results)[:8]:
        print(f"split-K Triton BN {bn:>2} split o {split_o:>2} down {split_d:>2} stages {stages}: {us:.2f} us a layer "
              f"({us / base:.2f}x cuBLAS), max |diff| {err:.4f}", flush=True)


if __name__ == "__main__":
    main()
