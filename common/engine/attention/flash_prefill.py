"""Fresh-prompt prefill on torch's own FlashAttention (varlen, causal, GQA)."""
from __future__ import annotations

import inspect

import torch
from torch.nn.attention.varlen import varlen_attn

from common.engine.attention import torch_ops

_HAS_GQA = "enable_gqa" in inspect.signature(varlen_attn).parameters


def varlen_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
                   scale: float) -> torch.Tensor:
    if q.dtype not in (torch.float16, torch.bfloat16):  # FlashAttention has no float32 kernel
        return torch_ops.varlen_attention(q, k, v, cu_seqlens, scale)
    if _HAS_GQA:
        extra = {"enable_gqa": k.shape[1] != q.shape[1]}
    else:  # older torch: expand the KV heads ourselves
        group = q.shape[1] // k.shape[1]
        k, v, extra = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), {}
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, scale=scale, window_size=(-1, 0), **extra)
