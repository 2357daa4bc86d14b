"""The LM head's GEMM and the one-pass sampler in one kernel: a decode step's logits never reach memory.

Apart, the head writes [rows, vocab] logits and the sampler (fused.gumbel_argmax) reads them back: at a batch of
64 and a vocabulary of 152k, twice 19 MB beside the head's weight, plus a launch. Here each program multiplies its
slice of the vocabulary and folds it straight into (best score, its index), rounding each logit to the model dtype
first, as the logits tensor would hold it, and drawing the same Philox uniform for (row, vocabulary entry) as
fused.gumbel_argmax: the two paths sample the same tokens from the same logits.

The accumulators are four, one for each of the Philox call's four uniforms (entries 4i..4i+3 share counter i),
so the noise costs one call per four logits without regrouping the tile.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.engine.layers import fused

MAX_ROWS = 64  # a decode batch of one row tile, each weight tile read once; larger ones write the logits
ROW_TILE = 64
BLOCK_N = 128  # vocabulary entries a program
BLOCK_K = 64
WARPS, STAGES = 4, 3


@triton.jit
def _scores(acc, u, inv_temp, col, V: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """One accumulator's scores: its logits rounded to the logits' dtype, then fused.gumbel_argmax's."""
    x = acc.to(OUT_DTYPE).to(tl.float32)
    x = tl.where(inv_temp > 0, fused.gumbel_score(x, u, inv_temp), x)
    return tl.where(col < V, x, float("-inf"))


@triton.jit
def _first_of(score, col, m, V: tl.constexpr):
    return tl.min(tl.where(score == m[:, None], col, V), axis=1)


@triton.jit(do_not_specialize=["M", "stride_best"], do_not_specialize_on_alignment=["temps_ptr", "seeds_ptr"])
def _head_sample_kernel(h_ptr, w_ptr, temps_ptr, seeds_ptr, best_ptr, best_idx_ptr, M, stride_h, stride_best,
                        V: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    """Grid (row tiles, vocabulary tiles): each row's best score and its index among the tile's BLOCK_N entries.
    Row tiles vary fastest, so the programs sharing a weight tile run together (it is read once, then from L2)."""
    Q: tl.constexpr = BLOCK_N // 4
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    counter = tl.program_id(1) * Q + tl.arange(0, Q)
    col0 = 4 * counter  # the columns of accumulator j are col0 + j
    ks = tl.arange(0, BLOCK_K)
    h = h_ptr + rows[:, None].to(tl.int64) * stride_h + ks[None, :]
    w = w_ptr + col0[None, :].to(tl.int64) * K + ks[:, None]
    acc0 = tl.zeros([BLOCK_M, Q], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, Q], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, Q], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, Q], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):  # K a multiple of BLOCK_K (`fits`): no mask along K, the loads stay vectorized
        x = tl.load(h + k, mask=row_mask[:, None], other=0.0)
        acc0 = tl.dot(x, tl.load(w + k, mask=(col0 < V)[None, :], other=0.0), acc0)
        acc1 = tl.dot(x, tl.load(w + K + k, mask=(col0 + 1 < V)[None, :], other=0.0), acc1)
        acc2 = tl.dot(x, tl.load(w + 2 * K + k, mask=(col0 + 2 < V)[None, :], other=0.0), acc2)
        acc3 = tl.dot(x, tl.load(w + 3 * K + k, mask=(col0 + 3 < V)[None, :], other=0.0), acc3)
    inv_temp = fused.inverse_temperature(tl.load(temps_ptr + rows, mask=row_mask, other=0.0)[:, None])
    seed = tl.load(seeds_ptr + rows, mask=row_mask, other=0)[:, None]
    u0, u1, u2, u3 = tl.rand4x(seed, counter[None, :])
    s0 = _scores(acc0, u0, inv_temp, col0[None, :], V, h_ptr.dtype.element_ty)
    s1 = _scores(acc1, u1, inv_temp, col0[None, :] + 1, V, h_ptr.dtype.element_ty)
    s2 = _scores(acc2, u2, inv_temp, col0[None, :] + 2, V, h_ptr.dtype.element_ty)
    s3 = _scores(acc3, u3, inv_temp, col0[None, :] + 3, V, h_ptr.dtype.element_ty)
    m = tl.maximum(tl.maximum(tl.max(s0, axis=1), tl.max(s1, axis=1)),
                   tl.maximum(tl.max(s2, axis=1), tl.max(s3, axis=1)))
    first = tl.minimum(tl.minimum(_first_of(s0, col0[None, :], m, V), _first_of(s1, col0[None, :] + 1, m, V)),
                       tl.minimum(_first_of(s2, col0[None, :] + 2, m, V), _first_of(s3, col0[None, :] + 3, m, V)))
    first = tl.where(first == V, tl.program_id(1) * BLOCK_N, first)  # a tile of all -inf keeps its first entry
    tl.store(best_ptr + rows * stride_best + tl.program_id(1), m, mask=row_mask)
    tl.store(best_idx_ptr + rows * stride_best + tl.program_id(1), first.to(tl.int64), mask=row_mask)


def fits(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `sample` serves this head: a decode batch's rows on CUDA, contiguous, a hidden size in whole
    BLOCK_K steps."""
    return (hidden.is_cuda and hidden.dim() == 2 and 0 < hidden.shape[0] <= MAX_ROWS and hidden.stride(-1) == 1
            and weight.is_contiguous() and hidden.dtype == weight.dtype and hidden.shape[1] == weight.shape[1]
            and hidden.shape[1] % BLOCK_K == 0)


def sample(hidden: torch.Tensor, weight: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
           out: torch.Tensor | None = None, vocab_size: int | None = None) -> torch.Tensor:
    """fused.gumbel_argmax(F.linear(hidden, weight)[:, :vocab_size], temperatures, seeds, out) without the logits."""
    rows, k = hidden.shape
    assert k % BLOCK_K == 0, f"hidden size {k} is not a multiple of {BLOCK_K}"
    vocab = vocab_size or weight.shape[0]
    block_m = min(ROW_TILE, max(16, triton.next_power_of_2(rows)))
    tiles = triton.cdiv(vocab, BLOCK_N)
    best = torch.empty(rows, tiles, dtype=torch.float32, device=hidden.device)
    best_idx = torch.empty(rows, tiles, dtype=torch.int64, device=hidden.device)
    _head_sample_kernel[(triton.cdiv(rows, block_m), tiles)](
        hidden, weight, temperatures, seeds, best, best_idx, rows, hidden.stride(0), best.stride(0), V=vocab, K=k,
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=WARPS, num_stages=STAGES)
    return fused.first_best(best, best_idx, out)
