"""The `flash_attn` package, for users who have it (it has no wheel for the GPU host's torch, so this
backend is not exercised there; the triton backend is the default)."""
from __future__ import annotations

import torch
from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

from common.engine.attention import triton_ops


def varlen_attention(q, k, v, cu_seqlens, max_len, scale):
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, softmax_scale=scale, causal=True)


def paged_decode_attention(q: torch.Tensor, k_cache, v_cache, block_tables, seq_lens, scale, plan=None):
    if k_cache.shape[1] % 256:  # flash-attn's paged KV wants pages of a multiple of 256 tokens
        return triton_ops.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, plan=plan)
    out = flash_attn_with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=seq_lens, block_table=block_tables,
                                  softmax_scale=scale, causal=True)
    return out.squeeze(1)


paged_prefill_attention = triton_ops.paged_prefill_attention
