"""A step's attention facts: as the runner ships them to every rank (AttentionInputs), and as a backend shapes
them for its kernels (AttentionMetadata, what the attention layers read from the forward context)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from common.engine.attention.decode_plan import DecodePlan


@dataclass
class AttentionInputs:
    """What attention needs to know of a step's flat token batch (decodes first, then prefills), as every
    tensor-parallel rank receives it: int64 views into the step's payload, on the model's device, and the
    header's ints. A backend turns it into its AttentionMetadata (`prepare_metadata`) or copies it into its
    CUDA-graph buffers (`fill_graph_buffers`)."""

    num_decodes: int
    slot_mapping: torch.Tensor  # [T]
    query_start_loc: torch.Tensor  # [B+1]
    seq_lens: torch.Tensor  # [B]
    block_tables: torch.Tensor  # [B, width]
    max_query_len: int
    max_seq_len: int
    prefix_cached: bool
    max_prefill_query_len: int
    plan: torch.Tensor  # [n]: the backend's own part of the payload (AttentionBackend.plan_step), n may be 0

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def decode_only(self) -> bool:
        return self.num_decodes == self.num_seqs


@dataclass
class AttentionMetadata:
    """What the attention layers read (docs/design.md): tensors on the model's device, ints on the host so
    that no layer has to synchronize with the device to read them."""

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
