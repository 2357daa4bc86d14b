"""Triton fusions of the decoder's elementwise work, one launch each where torch needs five to ten.

At decode batch sizes a layer's GEMMs take microseconds, so kernel count sets the step time: unfused,
RMSNorm, q/k-norm, RoPE and SiLU-and-mul are ~35 of a Qwen3 layer's ~45 kernels. Each function here
matches its torch counterpart's rounding (fp32 math, casts where torch casts), so CPU and GPU agree.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from common.engine.layers.partial_sums import PartialSums
from common.engine.pdl import launch_kwargs


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, stride_x, stride_r, stride_o, stride_part, eps,
                     N: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PARTS: tl.constexpr,
                     PDL: tl.constexpr):
    """Program r: row r. With PARTS > 0, x is that many float32 parts (PartialSums, `stride_part` apart) whose sum,
    rounded once to the model dtype, is the row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    if PARTS > 0:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in range(PARTS):
            acc += tl.load(x_ptr + s * stride_part + row * stride_x + cols, mask=mask, other=0.0)
        x = acc.to(out_ptr.dtype.element_ty)
    else:
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:  # the pre-norm block's residual add, rounded to the model dtype as torch does
        x = (x.to(tl.float32) + tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32))
        x = x.to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    y = (xf * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor | PartialSums, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of [T, N] rows; with `residual`, first `residual += x` in place and norm the sum. `x` may be a
    projection's PartialSums ([T, N] once summed)."""
    if isinstance(x, PartialSums):
        x2, parts, stride_part = x.parts[0], x.parts.shape[0], x.parts.stride(0)
        rows, n, dtype, shape = x.rows, x.parts.shape[-1], x.dtype, x.shape
    else:
        n = x.shape[-1]
        x2, parts, stride_part, dtype, shape = x.view(-1, n), 0, 0, x.dtype, x.shape
        rows = x2.shape[0]
    assert x2.stride(-1) == 1
    out = torch.empty(rows, n, dtype=dtype, device=x2.device)
    res2 = residual.view(-1, n) if residual is not None else x2
    if rows:
        _rms_norm_kernel[(rows,)](x2, res2, weight, out, x2.stride(0), res2.stride(0), out.stride(0), stride_part,
                                  eps, N=n, BLOCK=triton.next_power_of_2(n), HAS_RESIDUAL=residual is not None,
                                  PARTS=parts, **launch_kwargs(x2.device))
    out = out.view(shape)
    return out if residual is None else (out, residual)


@triton.jit
def _load_heads(base, stride_h, w_ptr, H: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                HAS_NORM: tl.constexpr):
    """One token's H heads as two halves [BLOCK_H, D/2], with the norm weight's halves (if any)."""
    heads = tl.arange(0, BLOCK_H)[:, None]
    half = tl.arange(0, HEAD_DIM // 2)[None, :]
    mask = heads < H
    ptr = base + heads * stride_h + half
    x1 = tl.load(ptr, mask=mask, other=0.0)
    x2 = tl.load(ptr + HEAD_DIM // 2, mask=mask, other=0.0)
    w1, w2 = x1, x2  # unused without a norm
    if HAS_NORM:
        w1 = tl.load(w_ptr + half)
        w2 = tl.load(w_ptr + HEAD_DIM // 2 + half)
    return ptr, mask, x1, x2, w1, w2


@triton.jit
def _norm_rope(x1, x2, w1, w2, cos, sin, eps, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr):
    """Optional per-head RMSNorm (Qwen3's, before the rotation), then rotate-half RoPE, rounded as torch does."""
    if HAS_NORM:
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        rstd = 1.0 / tl.sqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / HEAD_DIM + eps)
        x1 = (w1.to(tl.float32) * (f1 * rstd[:, None]).to(x1.dtype).to(tl.float32)).to(x1.dtype)
        x2 = (w2.to(tl.float32) * (f2 * rstd[:, None]).to(x2.dtype).to(tl.float32)).to(x2.dtype)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    return (f1 * cos - f2 * sin).to(x1.dtype), (f2 * cos + f1 * sin).to(x1.dtype)


@triton.jit
def _angles(cos_sin_ptr, pos_ptr, token, HEAD_DIM: tl.constexpr):
    half = tl.arange(0, HEAD_DIM // 2)[None, :]
    pos = tl.load(pos_ptr + token)
    return tl.load(cos_sin_ptr + pos * HEAD_DIM + half), tl.load(cos_sin_ptr + pos * HEAD_DIM + HEAD_DIM // 2 + half)


@triton.jit
def _rope_q(base, stride_h, w_ptr, cos_sin_ptr, pos_ptr, token, eps, H: tl.constexpr, BLOCK_H: tl.constexpr,
            HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr):
    ptr, mask, x1, x2, w1, w2 = _load_heads(base, stride_h, w_ptr, H, BLOCK_H, HEAD_DIM, HAS_NORM)
    cos, sin = _angles(cos_sin_ptr, pos_ptr, token, HEAD_DIM)
    y1, y2 = _norm_rope(x1, x2, w1, w2, cos, sin, eps, HEAD_DIM, HAS_NORM)
    tl.store(ptr, y1, mask=mask)
    tl.store(ptr + HEAD_DIM // 2, y2, mask=mask)


@triton.jit
def _rope_k_store(base, stride_h, w_ptr, cos_sin_ptr, pos_ptr, token, eps, v_base, stride_vh, k_cache_ptr,
                  v_cache_ptr, slot_ptr, stride_ckb, stride_ckt, stride_ckh, stride_cvb, stride_cvt, stride_cvh,
                  H: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                  HAS_NORM: tl.constexpr, STORE: tl.constexpr):
    ptr, mask, x1, x2, w1, w2 = _load_heads(base, stride_h, w_ptr, H, BLOCK_H, HEAD_DIM, HAS_NORM)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, HEAD_DIM)[None, :]
    if STORE:
        slot = tl.load(slot_ptr + token).to(tl.int64)
        v = tl.load(v_base + heads * stride_vh + dims, mask=mask)
    cos, sin = _angles(cos_sin_ptr, pos_ptr, token, HEAD_DIM)
    y1, y2 = _norm_rope(x1, x2, w1, w2, cos, sin, eps, HEAD_DIM, HAS_NORM)
    tl.store(ptr, y1, mask=mask)
    tl.store(ptr + HEAD_DIM // 2, y2, mask=mask)
    if STORE:
        if slot >= 0:
            page, offset = slot // PAGE, slot % PAGE
            half = tl.arange(0, HEAD_DIM // 2)[None, :]
            k_dst = k_cache_ptr + page * stride_ckb + offset * stride_ckt + heads * stride_ckh + half
            tl.store(k_dst, y1, mask=mask)
            tl.store(k_dst + HEAD_DIM // 2, y2, mask=mask)
            tl.store(v_cache_ptr + page * stride_cvb + offset * stride_cvt + heads * stride_cvh + dims, v, mask=mask)


# Positions and slots are read an int a token, from views that start wherever a mixed step's decodes end: their
# alignment is not specialized on, or each step's decode count would pick a variant (warmup.py).
@triton.jit(do_not_specialize_on_alignment=["pos_ptr", "slot_ptr"])
def _qk_norm_rope_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, cos_sin_ptr, qw_ptr, kw_ptr, k_cache_ptr, v_cache_ptr,
                         slot_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                         stride_ckb, stride_ckt, stride_ckh, stride_cvb, stride_cvt, stride_cvh, eps,
                         NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, BLOCK_Q: tl.constexpr,
                         BLOCK_KV: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                         HAS_NORM: tl.constexpr, STORE: tl.constexpr, PDL: tl.constexpr):
    """Grid (tokens, 2): program 0 of a token rotates its q heads, program 1 its k heads and, with STORE,
    writes k and v into the paged cache at the token's slot (slot < 0: not stored). Every load that does not
    wait on the position is issued before the position's angles: a decode step is latency, not bytes."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    token = tl.program_id(0).to(tl.int64)
    if tl.program_id(1) == 0:
        _rope_q(q_ptr + token * stride_qt, stride_qh, qw_ptr, cos_sin_ptr, pos_ptr, token, eps, NUM_Q_HEADS,
                BLOCK_Q, HEAD_DIM, HAS_NORM)
    else:
        _rope_k_store(k_ptr + token * stride_kt, stride_kh, kw_ptr, cos_sin_ptr, pos_ptr, token, eps,
                      v_ptr + token * stride_vt, stride_vh, k_cache_ptr, v_cache_ptr, slot_ptr, stride_ckb,
                      stride_ckt, stride_ckh, stride_cvb, stride_cvt, stride_cvh, NUM_KV_HEADS, BLOCK_KV, HEAD_DIM,
                      PAGE, HAS_NORM, STORE)


def qk_norm_rope_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                  q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                  v: torch.Tensor | None = None, k_cache: torch.Tensor | None = None,
                  v_cache: torch.Tensor | None = None, slot_mapping: torch.Tensor | None = None) -> None:
    """In place on q [T, Hq, D] and k [T, Hkv, D] (views into the qkv projection): optional per-head
    RMSNorm, then the rotate-half RoPE with angles cos_sin[position] ([max_pos, D]: cos | sin halves).
    Given the caches ([num_blocks, block_size, Hkv, D]), `v` and `slot_mapping`, also writes the rotated k
    and v there, as store_kvcache would: one launch instead of two."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin.is_contiguous() and cos_sin.shape[-1] == d
    has_norm = q_weight is not None
    store = k_cache is not None
    if store:
        assert v is not None and slot_mapping is not None and v.stride(-1) == 1 and v.shape == k.shape
        assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (hkv, d) and slot_mapping.shape == (t,)
        assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    if not t:
        return
    cache_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3]) if store else (0,) * 6
    _qk_norm_rope_kernel[(t, 2)](
        q, k, v if store else q, positions, cos_sin, q_weight if has_norm else cos_sin,
        k_weight if has_norm else cos_sin, k_cache if store else q, v_cache if store else q,
        slot_mapping if store else positions, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0) if store else 0, v.stride(1) if store else 0, *cache_strides, eps,
        NUM_Q_HEADS=hq, NUM_KV_HEADS=hkv, BLOCK_Q=triton.next_power_of_2(hq), BLOCK_KV=triton.next_power_of_2(hkv),
        HEAD_DIM=d, PAGE=k_cache.shape[1] if store else 1, HAS_NORM=has_norm, STORE=store, num_warps=4,
        **launch_kwargs(q.device))


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, N: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    """With PDL the next kernel (the down projection's) may load its weights while this one runs."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + N + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up] along the last dim."""
    n = x.shape[-1] // 2
    x2 = x.view(-1, 2 * n)
    out = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(n))
    if x2.shape[0]:
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(n, block))](x2, out, x2.stride(0), out.stride(0), N=n,
                                                                    BLOCK=block, **launch_kwargs(x.device))
    return out.view(*x.shape[:-1], n)


# lg2.approx (one instruction) for the sampler's two logs an entry, which are most of its math; Triton's
# interpreter (the CPU tests) has no libdevice, and takes tl.log2.
_FAST_LOG = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


@triton.jit
def _log2(x):
    if _FAST_LOG:
        return libdevice.fast_log2f(x)
    return tl.log2(x)


@triton.jit
def inverse_temperature(temp):
    """1/T where T > 0; 0 marks a greedy row."""
    return tl.where(temp > 0, 1.0 / tl.where(temp > 0, temp, 1.0), 0.0)


@triton.jit
def gumbel_score(x, u, inv_temp):
    """The Gumbel-max score of logits `x` (float32) with uniforms `u` at 1/T `inv_temp`: x / T + G, G = -ln(-ln u),
    less G's constant ln(ln 2) (only the argmax is read), which samples softmax(x / T)."""
    return x * inv_temp - 0.6931471805599453 * _log2(-_log2(tl.maximum(u, 1e-10)))


@triton.jit
def _gumbel_chunk(logits_ptr, row, stride, offs, u, inv_temp, best, best_idx, V: tl.constexpr):
    """Fold one chunk of the vocabulary into each lane's running (best score, its index): elementwise only."""
    x = tl.load(logits_ptr + row * stride + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    if inv_temp > 0:  # else greedy: the logits themselves
        x = gumbel_score(x, u, inv_temp)
    better = x > best  # strict: a lane keeps its first maximum (chunks come in index order)
    return tl.where(better, x, best), tl.where(better, offs, best_idx)


@triton.jit(do_not_specialize=["stride"], do_not_specialize_on_alignment=["temps_ptr", "seeds_ptr"])
def _gumbel_argmax_kernel(logits_ptr, temps_ptr, seeds_ptr, best_ptr, best_idx_ptr, stride, V: tl.constexpr,
                          SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (rows, splits): the best score and its index within one SPLIT-wide slice of the vocabulary.
    Philox is most of the cost: each call gives four uniforms, for vocabulary entries 4i..4i+3 (counter i), the
    draws head_sampler.py repeats."""
    QUARTER: tl.constexpr = BLOCK // 4
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temp = tl.load(temps_ptr + row)
    inv_temp = inverse_temperature(temp)
    seed = tl.load(seeds_ptr + row)
    q = tl.arange(0, QUARTER)
    best = tl.full([QUARTER], float("-inf"), dtype=tl.float32)
    best_idx = tl.full([QUARTER], V, dtype=tl.int32)
    for start in range(split * SPLIT, tl.minimum(split * SPLIT + SPLIT, V), BLOCK):
        counter = start // 4 + q  # unique per (row, position)
        u0, u1, u2, u3 = tl.rand4x(seed, counter)
        # Each lane's entries come in index order (4i, 4i + 1, ..., then the next chunk's), so a strict > keeps
        # a lane's first maximum.
        best, best_idx = _gumbel_chunk(logits_ptr, row, stride, 4 * counter, u0, inv_temp, best, best_idx, V)
        best, best_idx = _gumbel_chunk(logits_ptr, row, stride, 4 * counter + 1, u1, inv_temp, best, best_idx, V)
        best, best_idx = _gumbel_chunk(logits_ptr, row, stride, 4 * counter + 2, u2, inv_temp, best, best_idx, V)
        best, best_idx = _gumbel_chunk(logits_ptr, row, stride, 4 * counter + 3, u3, inv_temp, best, best_idx, V)
    m = tl.max(best, axis=0)
    # The first maximum: the smallest index among the lanes that hold it (a slice of all -inf keeps its first).
    first = tl.min(tl.where(best == m, best_idx, V), axis=0)
    first = tl.where(first == V, split * SPLIT, first)
    tl.store(best_ptr + row * tl.num_programs(1) + split, m)
    tl.store(best_idx_ptr + row * tl.num_programs(1) + split, first.to(tl.int64))


def gumbel_argmax(logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row in one pass over the logits: argmax where temperature is 0, else a sample of
    softmax(logits / T) drawn with Philox from the row's seed (replaces softmax + noise + argmax). The
    vocabulary is split across programs so that a small batch still fills the GPU. `out`: an int64 tensor of a
    token a row to write them into (a CUDA graph's static output) rather than a new one."""
    assert logits.stride(-1) == 1
    rows, vocab = logits.shape
    block = min(2048, max(64, triton.next_power_of_2(vocab)))
    split = block * max(1, triton.cdiv(vocab, block * 32))  # about 32 slices per row
    splits = triton.cdiv(vocab, split)
    best = torch.empty(rows, splits, dtype=torch.float32, device=logits.device)
    best_idx = torch.empty(rows, splits, dtype=torch.int64, device=logits.device)
    if rows:
        _gumbel_argmax_kernel[(rows, splits)](logits, temperatures, seeds, best, best_idx, logits.stride(0),
                                              V=vocab, SPLIT=split, BLOCK=block, num_warps=4)
    return first_best(best, best_idx, out)


@triton.jit(do_not_specialize=["slices", "stride"])
def _first_best_kernel(best_ptr, best_idx_ptr, out_ptr, slices, stride, BLOCK: tl.constexpr):
    """Program r: row r's index at the first of its slices' best scores."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    best = tl.load(best_ptr + row * stride + offs, mask=offs < slices, other=float("-inf"))
    first = tl.min(tl.where(best == tl.max(best, axis=0), offs, BLOCK), axis=0)
    first = tl.where(first == BLOCK, 0, first)  # a row of NaN scores: its first slice
    tl.store(out_ptr + row, tl.load(best_idx_ptr + row * stride + first))


def first_best(best: torch.Tensor, best_idx: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Per row, the index of the best of its slices' (best score, index): the first where slices tie, as the
    slices come in vocabulary order. One kernel (torch's argmax, then a gather, would be two launches)."""
    rows, slices = best.shape
    assert best_idx.stride() == best.stride() and best.stride(1) == 1
    out = torch.empty(rows, dtype=torch.int64, device=best.device) if out is None else out
    if rows:
        _first_best_kernel[(rows,)](best, best_idx, out, slices, best.stride(0),
                                    BLOCK=max(16, triton.next_power_of_2(slices)))
    return out
