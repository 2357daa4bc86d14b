"""The torch backend: the reference kernels (torch_ops), eager only. The CPU engine's backend, and the oracle
the GPU backends are tested against."""
from __future__ import annotations

import torch

from common.engine.attention import torch_ops
from common.engine.attention.backend import AttentionBackend, AttentionOps


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
            scale: float) -> torch.Tensor:
    return torch_ops.varlen_attention(q, k, v, cu_seqlens, scale)


TORCH_OPS = AttentionOps(torch_ops.store_kvcache, torch_ops.paged_decode_attention, _varlen,
                         torch_ops.paged_prefill_attention)


class TorchBackend(AttentionBackend):
    """Reads lengths on the host where it needs them (`.tolist()`), so no CUDA graph can hold it."""

    name = "torch"

    def __init__(self) -> None:
        super().__init__(TORCH_OPS)
