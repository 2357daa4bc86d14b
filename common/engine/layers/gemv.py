"""Skinny GEMMs: y = x W^T (+ b) for a few rows of x, the linear layers of a small decode batch.

At a few rows a projection is latency, not bandwidth: cuBLAS spends microseconds on a weight it could stream in
one, and cannot start before the kernel ahead of it ends. Here each program holds a slice of W's rows in
registers, loaded before it waits for x (common/engine/pdl.py), so with programmatic dependent launch the weight
streams in while the previous kernel (a norm, the attention) still runs. With `silu`, x is [gate | up] and the program
applies SiLU-and-mul as it loads it: the MLP's down projection takes the gate_up output directly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.engine.pdl import launch_kwargs

# Rows are done one after another over the slice in registers: cuBLAS's tensor-core kernels catch up by 4 rows
# (docs/benchmarks.md, stop 18).
MAX_ROWS = 2
SLICE_ELEMENTS = 8192  # weight elements a program holds (4 warps: 64 fp32 registers a thread)


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, stride_xm, stride_wn, stride_om,
                 N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SILU: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr):
    """Grid (N / BLOCK_N,): the program's BLOCK_N outputs of each of the M rows."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    n_mask, k_mask = n < N, k < K
    w = tl.load(w_ptr + n[:, None].to(tl.int64) * stride_wn + k[None, :],
                mask=n_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(b_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    for m in range(M):
        row = x_ptr + m * stride_xm
        if SILU:  # rounded as silu_and_mul rounds: the activation, then its product with up
            gate = tl.load(row + k, mask=k_mask, other=0.0).to(tl.float32)
            up = tl.load(row + K + k, mask=k_mask, other=0.0).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
            a = (act * up).to(out_ptr.dtype.element_ty).to(tl.float32)
        else:
            a = tl.load(row + k, mask=k_mask, other=0.0).to(tl.float32)
        acc = tl.sum(w * a[None, :], axis=1)
        if HAS_BIAS:
            acc += b
        tl.store(out_ptr + m * stride_om + n, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether gemv serves F.linear(x, weight): a few rows, and a weight row that fits a program's slice."""
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.stride(-1) == 1 and weight.stride(-1) == 1
            and triton.next_power_of_2(weight.shape[1]) <= SLICE_ELEMENTS)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         silu: bool = False) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [M <= MAX_ROWS, K]; with `silu`, F.linear(silu_and_mul(x), ...) for x
    [M, 2K]."""
    m, k = x.shape[0], weight.shape[1]
    assert weight.stride(-1) == 1 and x.stride(-1) == 1 and x.shape[1] == (2 * k if silu else k)
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_k = triton.next_power_of_2(k)
    block_n = max(1, min(triton.next_power_of_2(n), SLICE_ELEMENTS // block_k))
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, out, m, x.stride(0), weight.stride(0), out.stride(0),
        N=n, K=k, BLOCK_N=block_n, BLOCK_K=block_k, SILU=silu, HAS_BIAS=bias is not None, num_warps=4,
        **launch_kwargs(x.device))
    return out
