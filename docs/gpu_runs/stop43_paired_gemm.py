"""Stop 43 (issue 20), tried and not in the engine (docs/benchmarks.md, stop 43: slower than cuBLAS + the fused kernel
for qkv; within 0.1-0.4 us a layer for gate_up): the kernels that stop43_paired_probe.py times.

GEMMs of a decode batch whose outputs come in pairs that the next kernel combines, with that combination done in
the GEMM's epilogue: a program accumulates both members of each pair, so the kernel that only read them back is not
launched.

- qkv: a head's two rotary halves (dims i and i + D/2). The epilogue applies the per-head RMSNorm (Qwen3's) and
  RoPE to q and k heads and writes k and v into the paged KV cache: the qkv projection and fused.qk_norm_rope_ in
  one kernel, a program per (head, row tile).
- gate_up: gate column j and up column j. The epilogue applies silu(gate) * up: the gate_up projection and
  fused.silu_and_mul in one kernel.

Each rounds as the two-kernel path does: the products to the model dtype first (the GEMM's output), then the same
math (fused._norm_rope; SiLU in float32), so given the same GEMM output the results are the same to the bit. Launched
with programmatic dependent launch (common/engine/pdl.py): a program loads its first weight chunk before it waits
for x.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from common.engine.layers.fused import _norm_rope as norm_rope
from common.engine.pdl import launch_kwargs

MAX_ROWS = 64  # a decode batch: larger steps are prompts, where cuBLAS's GEMM and the fused kernels serve


@dataclass(frozen=True)
class Tiling:
    block_m: int = 16  # rows a program: a 64-row batch takes 4 row tiles, so 4x the programs of one tile
    block_n: int = 64  # pairs a program (qkv: a head's D/2, whatever this says)
    block_k: int = 128
    warps: int = 4
    stages: int = 3
    splits: int = 1  # K split across this many programs of a tile, the last to finish summing the parts


QKV_TILING = Tiling()
GATE_UP_TILING = Tiling()


@triton.jit
def _paired_dot(x_ptr, w_ptr, stride_x, rows, live, first, second, k_start, K: tl.constexpr, CHUNK: tl.constexpr,
                BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """x[rows, chunk] @ W[first, chunk]^T and x[rows, chunk] @ W[second, chunk]^T in float32 for the K chunk
    [k_start, k_start + CHUNK). The first BLOCK_K of weights are loaded before the PDL wait: only x is written by
    the kernel before."""
    ks = k_start + tl.arange(0, BLOCK_K)
    w1_ptr = w_ptr + first[:, None].to(tl.int64) * K + ks[None, :]
    w2_ptr = w_ptr + second[:, None].to(tl.int64) * K + ks[None, :]
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_x + ks[None, :]
    w1 = tl.load(w1_ptr)
    w2 = tl.load(w2_ptr)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptrs, mask=live, other=0.0)
    acc1 = tl.dot(x, tl.trans(w1))
    acc2 = tl.dot(x, tl.trans(w2))
    for k0 in range(BLOCK_K, CHUNK, BLOCK_K):
        x = tl.load(x_ptrs + k0, mask=live, other=0.0)
        acc1 = tl.dot(x, tl.trans(tl.load(w1_ptr + k0)), acc1)
        acc2 = tl.dot(x, tl.trans(tl.load(w2_ptr + k0)), acc2)
    return acc1, acc2


@triton.jit
def _sum_splits(acc1, acc2, part_ptr, count_ptr, tile, split, rows, cols, SPLITS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """With K split across SPLITS programs of an output tile: each writes its float32 pair of parts, and the last to
    arrive sums them in split order (the same sum whichever arrives last) and returns True with the sums; the
    others return False. The last resets the tile's counter for the next launch."""
    tile_parts = part_ptr + tile.to(tl.int64) * SPLITS * BLOCK_M * 2 * BLOCK_N
    offs = (rows[:, None] % BLOCK_M) * (2 * BLOCK_N) + cols[None, :]
    tl.store(tile_parts + split * BLOCK_M * 2 * BLOCK_N + offs, acc1)
    tl.store(tile_parts + split * BLOCK_M * 2 * BLOCK_N + BLOCK_N + offs, acc2)
    tl.debug_barrier()  # every thread's parts written before the arrival is counted
    last = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") == SPLITS - 1
    if last:
        acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for s in range(SPLITS):
            acc1 += tl.load(tile_parts + s * BLOCK_M * 2 * BLOCK_N + offs, cache_modifier=".cg")
            acc2 += tl.load(tile_parts + s * BLOCK_M * 2 * BLOCK_N + BLOCK_N + offs, cache_modifier=".cg")
        tl.atomic_xchg(count_ptr + tile, 0)
    return last, acc1, acc2


@triton.jit
def _rope_epilogue(y1, y2, head, rows, half, pos_ptr, cos_sin_ptr, qw_ptr, kw_ptr, eps, M, Q_HEADS: tl.constexpr,
                   HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr):
    """A q or k head's rows normed (with HAS_NORM) and rotated, as fused.qk_norm_rope_ does."""
    HALF: tl.constexpr = HEAD_DIM // 2
    pos = tl.load(pos_ptr + rows, mask=rows < M, other=0).to(tl.int64)
    angles = cos_sin_ptr + pos[:, None] * HEAD_DIM + half[None, :]
    cos, sin = tl.load(angles), tl.load(angles + HALF)
    w1 = tl.zeros([1, HALF], dtype=qw_ptr.dtype.element_ty)  # unused without a norm
    w2 = w1
    if HAS_NORM:
        is_q = head < Q_HEADS
        w1 = tl.where(is_q, tl.load(qw_ptr + half), tl.load(kw_ptr + half))[None, :]
        w2 = tl.where(is_q, tl.load(qw_ptr + HALF + half), tl.load(kw_ptr + HALF + half))[None, :]
    return norm_rope(y1, y2, w1, w2, cos, sin, eps, HEAD_DIM, HAS_NORM)


# Positions and slots are read an int a row, from views that start wherever a mixed step's decodes end (fused.py).
@triton.jit(do_not_specialize=["M"], do_not_specialize_on_alignment=["pos_ptr", "slot_ptr"])
def _qkv_rope_kernel(x_ptr, w_ptr, out_ptr, part_ptr, count_ptr, pos_ptr, cos_sin_ptr, qw_ptr, kw_ptr, k_cache_ptr,
                     v_cache_ptr, slot_ptr, M, stride_x, stride_o, stride_ckb, stride_ckt, stride_ckh, stride_cvb,
                     stride_cvt, stride_cvh, eps, K: tl.constexpr, Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                     HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, HAS_NORM: tl.constexpr, STORE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr):
    """Program (head, row tile, K split): that head's columns of qkv for its rows (heads: q, then k, then v), q and
    k heads normed and rotated, k and v heads stored at their rows' slots (slot < 0: not stored)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    CHUNK: tl.constexpr = K // SPLITS
    head, row_tile, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    half = tl.arange(0, HALF)
    live = rows[:, None] < M
    acc1, acc2 = _paired_dot(x_ptr, w_ptr, stride_x, rows, live, head * HEAD_DIM + half,
                             head * HEAD_DIM + HALF + half, split * CHUNK, K, CHUNK, BLOCK_K, PDL)
    done = True
    if SPLITS > 1:
        done, acc1, acc2 = _sum_splits(acc1, acc2, part_ptr, count_ptr, head * tl.num_programs(1) + row_tile, split,
                                       rows, half, SPLITS, BLOCK_M, HALF)
    if done:
        y1 = acc1.to(out_ptr.dtype.element_ty)
        y2 = acc2.to(out_ptr.dtype.element_ty)
        if head < Q_HEADS + KV_HEADS:
            y1, y2 = _rope_epilogue(y1, y2, head, rows, half, pos_ptr, cos_sin_ptr, qw_ptr, kw_ptr, eps, M, Q_HEADS,
                                    HEAD_DIM, HAS_NORM)
        out = out_ptr + rows[:, None].to(tl.int64) * stride_o + head * HEAD_DIM + half[None, :]
        tl.store(out, y1, mask=live)
        tl.store(out + HALF, y2, mask=live)
        if STORE and head >= Q_HEADS:
            slot = tl.load(slot_ptr + rows, mask=rows < M, other=-1).to(tl.int64)
            page, offset = slot // PAGE, slot % PAGE
            stored = live & (slot[:, None] >= 0)
            if head < Q_HEADS + KV_HEADS:
                dst = (k_cache_ptr + page[:, None] * stride_ckb + offset[:, None] * stride_ckt
                       + (head - Q_HEADS) * stride_ckh + half[None, :])
            else:
                dst = (v_cache_ptr + page[:, None] * stride_cvb + offset[:, None] * stride_cvt
                       + (head - Q_HEADS - KV_HEADS) * stride_cvh + half[None, :])
            tl.store(dst, y1, mask=stored)
            tl.store(dst + HALF, y2, mask=stored)


@triton.jit(do_not_specialize=["M"])
def _gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, part_ptr, count_ptr, M, stride_x, stride_o, N: tl.constexpr,
                         K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLITS: tl.constexpr, PDL: tl.constexpr):
    """Program (column tile, row tile, K split): silu(x W_gate^T) * (x W_up^T) for its columns, W = [W_gate; W_up]."""
    CHUNK: tl.constexpr = K // SPLITS
    col_tile, row_tile, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows[:, None] < M
    acc_gate, acc_up = _paired_dot(x_ptr, w_ptr, stride_x, rows, live, cols, N + cols, split * CHUNK, K, CHUNK,
                                   BLOCK_K, PDL)
    done = True
    if SPLITS > 1:
        done, acc_gate, acc_up = _sum_splits(acc_gate, acc_up, part_ptr, count_ptr,
                                             col_tile * tl.num_programs(1) + row_tile, split, rows,
                                             tl.arange(0, BLOCK_N), SPLITS, BLOCK_M, BLOCK_N)
    if done:
        gate = acc_gate.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
        out = out_ptr + rows[:, None].to(tl.int64) * stride_o + cols[None, :]
        tl.store(out, (act * up).to(out_ptr.dtype.element_ty), mask=live)


HALF_FLOATS = (torch.bfloat16, torch.float16)  # float32 tile pairs would not fit a program's shared memory


@dataclass(frozen=True)
class Workspace:
    """Where split programs leave their parts and count their arrivals: the counters start at zero, and the last
    program of each tile sets its counter back to zero, so one workspace serves every launch on its stream."""
    parts: torch.Tensor  # float32, at least tiles x splits x block_m x 2 block_n
    counts: torch.Tensor  # int32, at least one per tile

    @staticmethod
    def make(tiles: int, tiling: Tiling, device: torch.device) -> Workspace:
        parts = torch.empty(tiles * tiling.splits * tiling.block_m * 2 * tiling.block_n, dtype=torch.float32,
                            device=device)
        return Workspace(parts, torch.zeros(tiles, dtype=torch.int32, device=device))

    def check(self, tiles: int, tiling: Tiling) -> None:
        assert self.counts.numel() >= tiles
        assert self.parts.numel() >= tiles * tiling.splits * tiling.block_m * 2 * tiling.block_n


def fits(x: torch.Tensor, weight: torch.Tensor, pair: int, tiling: Tiling) -> bool:
    """Whether the paired GEMM serves x [M, K] through `weight`, whose pairs are `pair` columns apart: a head's
    halves (pair = D/2, in blocks of D) or gate and up (pair = half the outputs)."""
    if x.dim() != 2 or not 0 < x.shape[0] <= MAX_ROWS:  # first: every prompt step of many tokens stops here
        return False
    n, k = weight.shape
    return (x.dtype in HALF_FLOATS and weight.dtype == x.dtype and x.shape[1] == k and x.stride(-1) == 1
            and weight.is_contiguous() and k % (tiling.block_k * tiling.splits) == 0 and pair % tiling.block_n == 0
            and n % (2 * pair) == 0)


def qkv_rope(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
             num_heads: int, num_kv_heads: int, head_dim: int, q_weight: torch.Tensor | None,
             k_weight: torch.Tensor | None, eps: float, k_cache: torch.Tensor | None = None,
             v_cache: torch.Tensor | None = None, slot_mapping: torch.Tensor | None = None,
             tiling: Tiling = QKV_TILING, work: Workspace | None = None) -> torch.Tensor:
    """F.linear(x, weight) ([M, (Hq + 2 Hkv) D]: q | k | v) with q and k then treated as fused.qk_norm_rope_
    treats them, k and v stored into the caches at `slot_mapping` where given."""
    m, k = x.shape
    heads = num_heads + 2 * num_kv_heads
    assert weight.shape[0] == heads * head_dim and cos_sin.is_contiguous()
    store = k_cache is not None
    if store:
        assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (num_kv_heads, head_dim)
        assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and slot_mapping.shape == (m,)
    out = torch.empty(m, weight.shape[0], dtype=x.dtype, device=x.device)
    grid = (heads, triton.cdiv(m, tiling.block_m), tiling.splits)
    work = work or Workspace.make(grid[0] * grid[1], dataclasses.replace(tiling, block_n=head_dim // 2), x.device)
    has_norm = q_weight is not None
    strides = (*k_cache.stride()[:3], *v_cache.stride()[:3]) if store else (0,) * 6
    _qkv_rope_kernel[grid](
        x, weight, out, work.parts, work.counts, positions, cos_sin, q_weight if has_norm else cos_sin,
        k_weight if has_norm else cos_sin, k_cache if store else out, v_cache if store else out,
        slot_mapping if store else positions, m, x.stride(0), out.stride(0), *strides, eps, K=k, Q_HEADS=num_heads,
        KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, PAGE=k_cache.shape[1] if store else 1, HAS_NORM=has_norm,
        STORE=store, BLOCK_M=tiling.block_m, BLOCK_K=tiling.block_k, SPLITS=tiling.splits, num_warps=tiling.warps,
        num_stages=tiling.stages, **launch_kwargs(x.device))
    return out


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, tiling: Tiling = GATE_UP_TILING,
                 work: Workspace | None = None) -> torch.Tensor:
    """silu_and_mul(F.linear(x, weight)) for weight = [W_gate; W_up]."""
    m, k = x.shape
    n = weight.shape[0] // 2
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (n // tiling.block_n, triton.cdiv(m, tiling.block_m), tiling.splits)
    work = work or Workspace.make(grid[0] * grid[1], tiling, x.device)
    _gate_up_silu_kernel[grid](x, weight, out, work.parts, work.counts, m, x.stride(0), out.stride(0), N=n, K=k,
                               BLOCK_M=tiling.block_m, BLOCK_N=tiling.block_n, BLOCK_K=tiling.block_k,
                               SPLITS=tiling.splits, num_warps=tiling.warps, num_stages=tiling.stages,
                               **launch_kwargs(x.device))
    return out
