"""Probe (stop 39): how fast can one projection of the batch-64 decode step be once its weights are in L2?

stop39_persistent_layer_probe.py found each stage of a persistent layer kernel about 6 us with its weights already
in L2, as cuBLAS's GEMMs are at 64 rows: a program walks its tile's K in a chain of dependent loads. This times one
projection at a time, 28 of them back to back in a CUDA graph (distinct weights, `cold`; or one weight, `hot` in
L2), us each:
- cuBLAS (F.linear);
- column tiles, each program walking K (the persistent probe's stage);
- split K: a program per (column tile, K chunk), one load of each and one dot, its partial sum added into a float32
  output with atomics (zeroed by a memset in the graph, counted);
- an empty Triton kernel, for what a launch alone costs in a graph.

    PYTHONPATH=... python docs/gpu_runs/stop39_splitk_stage_probe.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).parent))
from stop39_persistent_layer_probe import _stage  # noqa: E402

ROWS, REPS = 64, 28
SHAPES = {"o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072), "qkv": (4096, 1024)}


@triton.jit
def _tiles_kernel(x_ptr, w_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr):
    _stage(x_ptr, w_ptr, out_ptr, tl.program_id(0), tl.num_programs(0), M, N, K, BN, BK, False)


@triton.jit
def _splitk_kernel(x_ptr, w_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr):
    """Program (n, k): out[:, n tile] += x[:, k chunk] @ W[n tile, k chunk]^T, in float32 with atomics."""
    n, k = tl.program_id(0), tl.program_id(1)
    rows, cols, ks = tl.arange(0, M), n * BN + tl.arange(0, BN), k * BK + tl.arange(0, BK)
    x = tl.load(x_ptr + rows[:, None] * K + ks[None, :])
    w = tl.load(w_ptr + cols[:, None].to(tl.int64) * K + ks[None, :])
    acc = tl.dot(x, tl.trans(w))
    tl.atomic_add(out_ptr + rows[:, None] * N + cols[None, :], acc, sem="relaxed")


@triton.jit
def _empty_kernel(x_ptr):
    pass


def main() -> None:
    from scripts.bench_gpu import graph_us

    torch.manual_seed(0)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    sms = props.multi_processor_count
    print(props.name, f"{sms} SMs", flush=True)
    x = torch.randn(ROWS, 3072, device=dev, dtype=torch.bfloat16)
    us = graph_us(lambda: [_empty_kernel[(sms,)](x) for _ in range(REPS)], reps=50) / REPS
    print(f"empty kernel: {us:.2f} us", flush=True)
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(REPS)]
        xk = x[:, :k].contiguous()
        ref = F.linear(xk, ws[0]).float()
        out = torch.empty(ROWS, n, device=dev, dtype=torch.bfloat16)
        out32 = torch.zeros(ROWS, n, device=dev, dtype=torch.float32)
        for hot in (False, True):
            w_of = (lambda i: ws[0]) if hot else (lambda i: ws[i])
            label = f"{name} ({n}x{k}, {'hot' if hot else 'cold'})"
            us = graph_us(lambda: [F.linear(xk, w_of(i)) for i in range(REPS)], reps=50) / REPS
            print(f"{label}: cuBLAS {us:.2f} us", flush=True)
            for bn, bk in ((16, 128), (32, 128)):
                if n // bn < 16:
                    continue
                us = graph_us(lambda: [_tiles_kernel[(sms,)](xk, w_of(i), out, M=ROWS, N=n, K=k, BN=bn, BK=bk)
                                       for i in range(REPS)], reps=50) / REPS
                _tiles_kernel[(sms,)](xk, ws[0], out, M=ROWS, N=n, K=k, BN=bn, BK=bk)
                err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                print(f"{label}: column tiles {bn}, K step {bk}: {us:.2f} us (error {err:.4f})", flush=True)
            for bn, bk in ((64, 256), (32, 256), (64, 128), (128, 256)):
                grid = (n // bn, k // bk)

                def splitk(i: int) -> None:
                    out32.zero_()
                    _splitk_kernel[grid](xk, w_of(i), out32, M=ROWS, N=n, K=k, BN=bn, BK=bk)

                try:
                    us = graph_us(lambda: [splitk(i) for i in range(REPS)], reps=50) / REPS
                    splitk(0)
                except Exception as e:  # noqa: BLE001 (a tiling Triton cannot compile: say so, go on)
                    print(f"{label}: split K {bn}x{bk}: failed: {type(e).__name__}", flush=True)
                    continue
                err = ((out32 - ref).abs().max() / ref.abs().max()).item()
                print(f"{label}: split K, tiles {bn} x {bk} ({grid[0] * grid[1]} programs), with its memset: {us:.2f} "
                      f"us (error {err:.4f})", flush=True)


if __name__ == "__main__":
    main()
