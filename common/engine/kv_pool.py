"""The paged KV cache of one rank: one block-major tensor, kv[block, layer, k|v, slot, head, dim] (docs/design.md)."""
from __future__ import annotations

import torch

from common.engine.device import TORCH_DTYPES
from common.protocol import KVLayout


class KVPool:
    """The pool's memory and its per-layer views; `layout` is the wire record peers compare it by."""

    def __init__(self, layout: KVLayout, num_blocks: int, device: torch.device | str):
        self.layout = layout
        self.num_blocks = num_blocks
        self.dtype = TORCH_DTYPES[layout.dtype]
        self.kv = torch.zeros(num_blocks, layout.num_layers, 2, layout.block_size, layout.num_kv_heads,
                              layout.head_dim, dtype=self.dtype, device=device)

    def k_cache(self, layer: int) -> torch.Tensor:
        return self.kv[:, layer, 0]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.kv[:, layer, 1]

    def read_blocks(self, block_ids: torch.Tensor) -> torch.Tensor:
        """The given blocks, gathered into one contiguous tensor [n, layers, 2, slots, heads, dim]."""
        return self.kv.index_select(0, block_ids.to(self.kv.device))

    def write_blocks(self, block_ids: torch.Tensor, data: torch.Tensor) -> None:
        self.kv.index_copy_(0, block_ids.to(self.kv.device), data.to(self.kv.device, self.kv.dtype))
