"""Split-K GEMMs: y = x W^T for a decode batch of up to 64 rows and a projection of few outputs (a small model's
o and down projections: 1,024 outputs from 2,048 or 3,072 inputs).

With few outputs there are few output tiles, so cuBLAS splits K across its programs and sums their parts in a
kernel of its own. This does the same in two Triton kernels launched with programmatic dependent launch
(common/engine/pdl.py): a program per (BLOCK_N outputs, BLOCK_K of K) loads its weight tile before it waits for x,
so the weights stream in while the kernel before still runs, and writes its float32 partial sum; a second kernel
adds the parts into the output, unless the caller takes them as they are (`PartialSums`: the add+RMSNorm after o
and down sums them as it loads its input). Measured in Qwen3-0.6B's batch-64 step: docs/benchmarks.md, stops 41
and 42.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.engine.layers.partial_sums import PartialSums
from common.engine.pdl import launch_kwargs

MAX_ROWS = 64  # one row tile: the dot's rows beyond a batch's are masked (one variant for every decode batch)
MAX_OUTPUTS = 1024  # the widest measured (Qwen3-0.6B's): wider projections keep cuBLAS until measured
BLOCK_N, BLOCK_K = 64, 512  # the tiling measured best with its sum kernel (stop 41's probe)
PARTIAL_WARPS = 8  # the decode step was faster than at Triton's default 4 (docs/benchmarks.md, stop 43)


@triton.jit(do_not_specialize=["M"])
def _partial_kernel(x_ptr, w_ptr, part_ptr, M, stride_x, N: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """Program (n, k): part[k][:M, n tile] = x[:M, k chunk] @ W[n tile, k chunk]^T, in float32."""
    n, k = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, ROWS)
    cols, ks = n * BLOCK_N + tl.arange(0, BLOCK_N), k * BLOCK_K + tl.arange(0, BLOCK_K)
    w = tl.load(w_ptr + cols[:, None].to(tl.int64) * K + ks[None, :])
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    live = rows[:, None] < M
    x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :], mask=live, other=0.0)
    acc = tl.dot(x, tl.trans(w))
    tl.store(part_ptr + (k * ROWS + rows[:, None]) * N + cols[None, :], acc, mask=live)


@triton.jit
def _sum_kernel(part_ptr, out_ptr, stride_o, N: tl.constexpr, ROWS: tl.constexpr, SPLITS: tl.constexpr,
                PDL: tl.constexpr):
    """Program m: out[m] = the sum of row m's parts, rounded once."""
    row = tl.program_id(0)
    cols = tl.arange(0, N)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([N], dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(part_ptr + (s * ROWS + row) * N + cols)
    tl.store(out_ptr + row * stride_o + cols, acc.to(out_ptr.dtype.element_ty))


HALF = (torch.bfloat16, torch.float16)  # a tile pair of 4-byte floats would not fit a program's shared memory


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this serves F.linear(x, weight): a decode batch's rows of 2-byte floats, a weight of few outputs (a
    power of two, the sum kernel's tile) whose inputs split into whole chunks."""
    if x.dim() != 2 or not 0 < x.shape[0] <= MAX_ROWS:  # first: every prompt step of many tokens stops here
        return False
    n, k = weight.shape
    return (x.dtype in HALF and weight.dtype == x.dtype and x.shape[1] == k and x.stride(-1) == 1
            and weight.stride(-1) == 1 and weight.stride(0) == k and BLOCK_N <= n <= MAX_OUTPUTS
            and n & (n - 1) == 0 and k % BLOCK_K == 0)


def linear(x: torch.Tensor, weight: torch.Tensor, summed: bool = True) -> torch.Tensor | PartialSums:
    """F.linear(x, weight) for x [M <= MAX_ROWS, K] (`fits`); without `summed`, the K chunks' parts for the next
    kernel to add."""
    m, (n, k) = x.shape[0], weight.shape
    splits = k // BLOCK_K
    part = torch.empty(splits, MAX_ROWS, n, dtype=torch.float32, device=x.device)
    pdl = launch_kwargs(x.device)
    _partial_kernel[(n // BLOCK_N, splits)](x, weight, part, m, x.stride(0), N=n, K=k, ROWS=MAX_ROWS,
                                            BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=PARTIAL_WARPS, **pdl)
    if not summed:
        return PartialSums(part, m, x.dtype)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _sum_kernel[(m,)](part, out, out.stride(0), N=n, ROWS=MAX_ROWS, SPLITS=splits, **pdl)
    return out
