"""Triton attention kernels with the signatures of torch_ops (see docs/design.md, "Kernel contracts").

All kernels gather K/V through block tables from caches shaped [num_blocks, block_size, Hkv, D] whose
block stride is arbitrary (views into the block-major pool), accumulate in fp32 and work in base 2
(the softmax scale is pre-multiplied by log2(e)). One program serves every query head of one KV head,
so each K/V tile is loaded once per GQA group.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from common.engine.attention.decode_plan import MAX_UNITS_PER_SEQ, PLAN_ROWS, DecodePlan, plan_decode
from common.engine.pdl import launch_kwargs

_LOG2E = 1.4426950408889634
# What changes from step to step is not specialized on, so that warm-up (warmup.py) can make every variant ready:
# the block-table and plan widths (Triton would compile one variant for width 1, one for multiples of 16, one for
# the rest) and the alignment of the metadata the kernels read an int at a time (a mixed step's prefill rows are
# views that start wherever its decodes end).


@triton.jit(do_not_specialize_on_alignment=["slot_ptr"])
def _store_kvcache_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                          stride_kt, stride_kh, stride_vt, stride_vh,
                          stride_ckb, stride_ckt, stride_ckh, stride_cvb, stride_cvt, stride_cvh,
                          NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                          PAGE: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    page, offset = slot // PAGE, slot % PAGE
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, HEAD_DIM)[None, :]
    mask = heads < NUM_HEADS
    k = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(k_cache_ptr + page * stride_ckb + offset * stride_ckt + heads * stride_ckh + dims, k, mask=mask)
    tl.store(v_cache_ptr + page * stride_cvb + offset * stride_cvt + heads * stride_cvh + dims, v, mask=mask)


@triton.jit
def _attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, block_table_ptr, pos, load_mask, score_mask,
                 stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                 HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step of q [M, D] over the keys at context positions `pos` [N]."""
    dims = tl.arange(0, HEAD_DIM)[None, :]
    if MASKED:
        page = tl.load(block_table_ptr + pos // PAGE, mask=load_mask, other=0).to(tl.int64)
    else:
        page = tl.load(block_table_ptr + pos // PAGE).to(tl.int64)
    offset = (pos % PAGE)[:, None]
    k_ptrs = k_ptr + page[:, None] * stride_kb + offset * stride_kt + dims
    v_ptrs = v_ptr + page[:, None] * stride_vb + offset * stride_vt + dims
    if MASKED:
        k = tl.load(k_ptrs, mask=load_mask[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if MASKED:
        s = tl.where(score_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASKED:
        v = tl.load(v_ptrs, mask=load_mask[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["stride_btb", "stride_plan"],
            do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr", "plan_ptr"])
def _decode_kernel(q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr, plan_ptr, out_ptr, part_o_ptr, part_lse_ptr,
                   qk_scale, stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                   stride_btb, stride_ob, stride_oh, stride_plan, stride_pu, stride_ph, stride_lu,
                   GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                   BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    """Grid (units, kv_heads). DIRECT: unit i is all of sequence i. Else the plan (`plan_decode`) names each
    unit's sequence and context range; a unit that is all of its sequence writes the output, the others a
    partial and its lse for the reduce kernel."""
    if PDL:  # before any return: the kernel must not end before the one it follows (common/engine/pdl.py)
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    unit = tl.program_id(0)
    kv_head = tl.program_id(1)
    if DIRECT:
        seq = unit
        start = 0
        end = tl.load(seq_lens_ptr + seq)
        whole = True
    else:
        seq = tl.load(plan_ptr + unit)
        if seq < 0:
            return
        start = tl.load(plan_ptr + stride_plan + unit)
        end = tl.load(plan_ptr + 2 * stride_plan + unit)
        whole = tl.load(plan_ptr + 4 * stride_plan + seq) == 1

    g = tl.arange(0, BLOCK_G)
    head_mask = g < GROUP
    heads = kv_head * GROUP + g
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=head_mask[:, None], other=0.0)
    k_ptr += kv_head * stride_kh
    v_ptr += kv_head * stride_vh
    block_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_btb

    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    full_end = start + (end - start) // BLOCK_N * BLOCK_N
    for n0 in range(start, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, block_table_ptr, n0 + offs_n, None, None,
                                     stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                                     HEAD_DIM, PAGE, False, PRECISION)
    if full_end < end:
        pos = full_end + offs_n
        valid = pos < end
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, block_table_ptr, pos, valid, valid[None, :],
                                     stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                                     HEAD_DIM, PAGE, True, PRECISION)

    # l_i is 0 only for an empty sequence (a padded batch entry), whose output is then 0.
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if whole:
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=head_mask[:, None])
    else:
        part = part_o_ptr + unit * stride_pu + heads[:, None] * stride_ph + dims[None, :]
        tl.store(part, o, mask=head_mask[:, None])
        tl.store(part_lse_ptr + unit * stride_lu + heads, m_i + tl.log2(l_i), mask=head_mask)


@triton.jit(do_not_specialize=["stride_plan"], do_not_specialize_on_alignment=["plan_ptr"])
def _decode_reduce_kernel(part_o_ptr, part_lse_ptr, plan_ptr, out_ptr, stride_plan, stride_pu, stride_ph, stride_lu,
                          stride_ob, stride_oh, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
                          PDL: tl.constexpr):
    """Grid (batch, q_heads): combine a split sequence's partial outputs weighted by their log-sum-exp,
    BLOCK_S units at a time. A sequence of one unit is written already; one of none (padding) gets 0."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_units = tl.load(plan_ptr + 4 * stride_plan + seq)
    if num_units == 1:
        return
    first = tl.load(plan_ptr + 3 * stride_plan + seq)
    s = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    for s0 in range(0, num_units, BLOCK_S):
        units = first + s0 + s
        m = tl.maximum(m, tl.load(part_lse_ptr + units * stride_lu + head, mask=s0 + s < num_units,
                                  other=float("-inf")))
    m_all = tl.max(m, 0)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    total = tl.zeros([BLOCK_S], dtype=tl.float32)
    for s0 in range(0, num_units, BLOCK_S):
        active = s0 + s < num_units
        units = first + s0 + s
        lse = tl.load(part_lse_ptr + units * stride_lu + head, mask=active, other=float("-inf"))
        weight = tl.where(active, tl.exp2(lse - m_all), 0.0)
        part = tl.load(part_o_ptr + units[:, None] * stride_pu + head * stride_ph + dims[None, :],
                       mask=active[:, None], other=0.0)
        acc += tl.sum(weight[:, None] * part, 0)
        total += weight
    denom = tl.sum(total, 0)
    o = acc / tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims, o.to(out_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["stride_btb"],
            do_not_specialize_on_alignment=["block_tables_ptr", "query_start_loc_ptr", "seq_lens_ptr"])
def _prefill_kernel(q_ptr, k_ptr, v_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr, out_ptr, qk_scale,
                    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                    stride_btb, stride_ot, stride_oh,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Grid (query tiles, batch, kv_heads). A tile's BLOCK_M rows are (token, head-in-group) pairs."""
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP
    # Later query tiles attend to more keys: start them first.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    t0 = tile * BLOCK_Q
    if t0 >= q_len:
        return
    context = tl.load(seq_lens_ptr + seq) - q_len

    rows = tl.arange(0, BLOCK_M)
    token = t0 + rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    row_mask = (rows < BLOCK_Q * GROUP) & (token < q_len)
    dims = tl.arange(0, HEAD_DIM)
    q_rows = (q_start + token).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=row_mask[:, None], other=0.0)
    k_ptr += kv_head * stride_kh
    v_ptr += kv_head * stride_vh
    block_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_btb

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    q_pos = context + token
    # Keys before full_end are visible to every row of the tile; end is one past the last row's own key.
    full_end = (context + t0 + 1) // BLOCK_N * BLOCK_N
    end = context + tl.minimum(t0 + BLOCK_Q, q_len)
    for n0 in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, block_table_ptr, n0 + offs_n, None, None,
                                     stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                                     HEAD_DIM, PAGE, False, PRECISION)
    for n0 in range(full_end, end, BLOCK_N):
        pos = n0 + offs_n
        valid = pos < end
        causal = (pos[None, :] <= q_pos[:, None]) & valid[None, :]
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, block_table_ptr, pos, valid, causal,
                                     stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                                     HEAD_DIM, PAGE, True, PRECISION)

    o = acc / l_i[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    assert k_cache.shape == v_cache.shape and k_cache.dim() == 4, (k_cache.shape, v_cache.shape)
    for cache in (k_cache, v_cache):
        assert cache.stride(-1) == 1 and cache.stride(-2) == cache.shape[-1], cache.stride()
    head_dim = k_cache.shape[-1]
    assert head_dim >= 16 and head_dim & (head_dim - 1) == 0, f"head_dim {head_dim} must be a power of 2 >= 16"


def _precision(dtype: torch.dtype) -> str:
    # TF32 would cost fp32 inputs ~3 decimal digits; 16-bit inputs ignore the setting.
    return "ieee" if dtype == torch.float32 else "tf32"


def store_kvcache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    _check_cache(k_cache, v_cache)
    num_tokens, num_heads, head_dim = key.shape
    assert value.shape == key.shape and key.stride(-1) == 1 and value.stride(-1) == 1
    assert k_cache.shape[2:] == (num_heads, head_dim) and slot_mapping.shape == (num_tokens,)
    if num_tokens == 0:
        return
    _store_kvcache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(num_heads), PAGE=k_cache.shape[1],
        num_warps=4)


@dataclass(frozen=True)
class DecodeLaunch:
    """How the decode kernel's programs run: keys per tile, warps, pipeline stages."""

    block_n: int
    num_warps: int = 4
    num_stages: int = 2


def decode_launch(dtype: torch.dtype) -> DecodeLaunch:
    return DecodeLaunch(32 if dtype == torch.float32 else 64)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, *,
                           out: torch.Tensor | None = None, plan: DecodePlan | None = None,
                           max_num_splits: int = MAX_UNITS_PER_SEQ,
                           launch: DecodeLaunch | None = None) -> torch.Tensor:
    """Attention of one query per sequence over its `seq_lens[i]` cached keys; seq_len 0 gives 0.

    `plan` (from plan_decode on the same seq_lens) says how the contexts are cut; without one it is made
    here from seq_lens, which waits for the device. A CUDA graph captures a plan's tensor, not its values:
    a replay follows whatever plan table and seq_lens are written in place (same capacity and `split`)."""
    _check_cache(k_cache, v_cache)
    batch, num_heads, head_dim = q.shape
    num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    assert q.stride(-1) == 1 and head_dim == k_cache.shape[-1] and num_heads % num_kv_heads == 0
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(-1) == 1
    if batch == 0:
        return out
    if plan is None:
        plan = plan_decode(seq_lens.tolist(), num_kv_heads, q.device, max_num_splits=max_num_splits)
    launch = launch or decode_launch(q.dtype)
    if plan.split:
        units = plan.units
        assert units.shape[0] == PLAN_ROWS and units.dtype == torch.int32 and units.stride(1) == 1
        part_o = torch.empty(units.shape[1], num_heads, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(units.shape[1], num_heads, dtype=torch.float32, device=q.device)
        grid, strides = units.shape[1], (units.stride(0), part_o.stride(0), part_o.stride(1), part_lse.stride(0))
    else:
        units = part_o = part_lse = seq_lens  # unused
        grid, strides = batch, (0, 0, 0, 0)
    _decode_kernel[(grid, num_kv_heads)](
        q, k_cache, v_cache, block_tables, seq_lens, units, out, part_o, part_lse, scale * _LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), *strides,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, PAGE=page,
        BLOCK_N=launch.block_n, DIRECT=not plan.split, PRECISION=_precision(q.dtype), num_warps=launch.num_warps,
        num_stages=launch.num_stages, **launch_kwargs(q.device))
    if plan.split:
        _decode_reduce_kernel[(batch, num_heads)](
            part_o, part_lse, units, out, *strides, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_S=16, num_warps=4, **launch_kwargs(q.device))
    return out


def _prefill_config(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages), sized to fit shared memory."""
    if device.type != "cuda":
        return 32, 64, 1, 1  # Triton's interpreter: less numpy work on padding rows
    if dtype == torch.float32:
        return 64, 32, 4, 2
    if head_dim <= 64:
        return 128, 64, 4, 3
    return 128, 64, 8, 2


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                            max_query_len: int, scale: float, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its whole (cached prefix + new) context."""
    _check_cache(k_cache, v_cache)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    assert q.stride(-1) == 1 and head_dim == k_cache.shape[-1] and num_heads % num_kv_heads == 0
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(-1) == 1
    batch = seq_lens.shape[0]
    if num_tokens == 0 or batch == 0:
        return out
    block_m, block_n, num_warps, num_stages = _prefill_config(head_dim, q.dtype, q.device)
    assert group <= block_m, f"GQA group {group} exceeds BLOCK_M {block_m}"
    grid = (triton.cdiv(max_query_len, block_m // group), batch, num_kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out, scale * _LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, PAGE=page, BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION=_precision(q.dtype), num_warps=num_warps, num_stages=num_stages)
    return out
