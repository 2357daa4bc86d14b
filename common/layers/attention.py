from __future__ import annotations

import torch
from torch import nn

from common.attention.backend import TORCH, AttentionBackend
from common.context import get_attn_metadata


class Attention(nn.Module):
    """Paged attention of one layer. The model runner hands it its cache views and the backend."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.backend: AttentionBackend = TORCH
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.backend.forward(q, k, v, self.k_cache, self.v_cache, get_attn_metadata(), self.scale)
