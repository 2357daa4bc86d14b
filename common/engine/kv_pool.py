from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    """Shape of one rank's KV pool; prefill and decode workers must agree on it to exchange blocks."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers, K and V."""
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim * self.dtype.itemsize


class KVPool:
    """The paged KV cache of one rank, block-major: kv[block, layer, k|v, slot, head, dim] (docs/design.md)."""

    def __init__(self, layout: KVLayout, num_blocks: int, device: torch.device | str):
        self.layout = layout
        self.num_blocks = num_blocks
        self.kv = torch.zeros(num_blocks, layout.num_layers, 2, layout.block_size, layout.num_kv_heads,
                              layout.head_dim, dtype=layout.dtype, device=device)

    def k_cache(self, layer: int) -> torch.Tensor:
        return self.kv[:, layer, 0]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.kv[:, layer, 1]

    def read_blocks(self, block_ids: torch.Tensor) -> torch.Tensor:
        """The given blocks, gathered into one contiguous tensor [n, layers, 2, slots, heads, dim]."""
        return self.kv.index_select(0, block_ids.to(self.kv.device))

    def write_blocks(self, block_ids: torch.Tensor, data: torch.Tensor) -> None:
        self.kv.index_copy_(0, block_ids.to(self.kv.device), data.to(self.kv.device, self.kv.dtype))
