"""Fresh-prompt prefill on torch's own FlashAttention (varlen, causal, GQA).

It calls aten's FlashAttention op itself rather than `torch.nn.attention.varlen.varlen_attn`: the kernel takes fewer
KV heads than query heads as they are (GQA, no expanded copy of K and V), and the call skips that wrapper's custom-op
dispatch, logging and extra allocation, host work an eager prefill step pays once in every layer.
"""
from __future__ import annotations

import torch

from common.engine.attention import torch_ops


def varlen_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
                   scale: float) -> torch.Tensor:
    if q.dtype not in (torch.float16, torch.bfloat16) or not q.is_cuda:  # FlashAttention: CUDA, half precision
        return torch_ops.varlen_attention(q, k, v, cu_seqlens, scale)
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, 0.0, True,
                                                   False, scale=scale)[0]
