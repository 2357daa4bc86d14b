from __future__ import annotations

from dataclasses import dataclass

import torch

from common.engine.attention.decode_plan import DecodePlan


@dataclass
class AttentionMetadata:
    """What attention needs to know about a step's flat token batch (decodes first, then prefills).

    See docs/design.md. Tensors live on the model's device; the ints are host-side copies so that no
    layer has to synchronize with the device to read them.
    """

    num_decodes: int
    num_decode_tokens: int  # == num_decodes; kept separate for readability at call sites
    slot_mapping: torch.Tensor  # [T] int64
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    max_query_len: int
    max_seq_len: int
    prefix_cached: bool  # a prefill has context beyond its own new tokens
    # the prefill part, rebased to start at 0
    prefill_query_start_loc: torch.Tensor | None = None  # [P+1] int32
    max_prefill_query_len: int = 0
    # the decode part: how the Triton decode kernel cuts the contexts; None: the kernel plans from seq_lens
    decode_plan: DecodePlan | None = None

    @property
    def num_prefills(self) -> int:
        return self.seq_lens.shape[0] - self.num_decodes
