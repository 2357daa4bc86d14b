from __future__ import annotations

import torch
from torch import nn

from common.engine.attention.backend import AttentionBackend
from common.engine.attention.torch_backend import TorchBackend
from common.engine.context import get_attn_metadata
from common.engine.layers.fusion import fused_kernels
from common.engine.layers.norm import RMSNorm
from common.engine.layers.rotary import RotaryEmbedding


class Attention(nn.Module):
    """One layer's attention between the qkv and output projections: the per-head q/k norms (where the model
    has them) and the rotary embedding, the K/V write into the paged cache, then the backend's kernels.
    On CUDA the first three are one fused kernel. The model runner hands the layer its cache views and
    the backend."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.backend: AttentionBackend = TorchBackend()
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                rotary: RotaryEmbedding, q_norm: RMSNorm | None = None,
                k_norm: RMSNorm | None = None) -> torch.Tensor:
        md = get_attn_metadata()
        if q.is_cuda and (fused := fused_kernels()) is not None:
            store = self.k_cache is not None
            fused.qk_norm_rope_(q, k, positions, rotary.cos_sin, q_norm.weight if q_norm else None,
                                k_norm.weight if k_norm else None, q_norm.eps if q_norm else 0.0, v,
                                self.k_cache, self.v_cache, md.slot_mapping if store else None)
            return self.backend.forward(q, k, v, self.k_cache, self.v_cache, md, self.scale, kv_stored=store)
        q, k = rotary(positions, q, k, q_norm, k_norm)
        return self.backend.forward(q, k, v, self.k_cache, self.v_cache, md, self.scale)
