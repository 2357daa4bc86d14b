"""The attention backend interface: four kernels, the metadata they need, and the CUDA-graph buffers that
metadata lives in when a step replays a graph. The model runner and the graph runner know nothing else of a
backend (docs/design.md, "Attention backends")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
import torch

from common.engine.attention.decode_plan import DecodePlan
from common.engine.attention.metadata import AttentionInputs, AttentionMetadata


@dataclass(frozen=True)
class AttentionOps:
    """The kernels of a backend (docs/design.md, "Kernel contracts")."""

    store_kvcache: Callable  # store_kvcache(key, value, k_cache, v_cache, slot_mapping)
    decode: Callable  # paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, plan=None)
    prefill: Callable  # varlen_attention(q, k, v, cu_seqlens, max_len, scale): fresh prompts, no cache read
    prefill_paged: Callable  # paged_prefill_attention(q, k_cache, v_cache, qsl, seq_lens, block_tables, max_q, scale)


class AttentionBackend:
    """Kernels plus the metadata they read. A step goes through three hooks:

    - `plan_step` (host, rank 0): the backend's own part of the step's payload, from the decodes' lengths;
    - `prepare_metadata` (every rank, eager steps): AttentionMetadata from the step's AttentionInputs;
    - with CUDA graphs (`supports_graphs`): `init_graph_buffers` once, `graph_metadata` per captured
      (batch, variant), and per replay `graph_variant` picks the graph and `fill_graph_buffers` copies the
      step into the buffers it captured.

    This base runs no graphs and plans nothing; `forward` routes decodes and prefills to the kernels.
    """

    name: ClassVar[str]
    supports_graphs: ClassVar[bool] = False

    def __init__(self, ops: AttentionOps):
        self.ops = ops

    # ---- one step -----------------------------------------------------------------------------------
    def plan_step(self, decode_lens: list[int], batch: int) -> np.ndarray | None:
        """Host ints every rank gets as `AttentionInputs.plan` (int64, any shape; None: none), for the decodes'
        context lengths as the kernel will see them in a batch of `batch` (a CUDA graph's padded bucket)."""
        return None

    def prepare_metadata(self, step: AttentionInputs) -> AttentionMetadata:
        nd = step.num_decodes
        qsl = step.query_start_loc.int()
        return AttentionMetadata(
            num_decodes=nd, num_decode_tokens=nd, slot_mapping=step.slot_mapping, query_start_loc=qsl,
            seq_lens=step.seq_lens.int(), block_tables=step.block_tables.int(), max_query_len=step.max_query_len,
            max_seq_len=step.max_seq_len, prefix_cached=step.prefix_cached,
            prefill_query_start_loc=(qsl[nd:] - nd) if nd < step.num_seqs else None,
            max_prefill_query_len=step.max_prefill_query_len, decode_plan=self.decode_plan(step))

    def decode_plan(self, step: AttentionInputs) -> DecodePlan | None:
        return None

    # ---- CUDA graphs --------------------------------------------------------------------------------
    def supports_prefill_graphs(self, dtype: torch.dtype) -> bool:
        """Whether its prefill kernels run in a prompt CUDA graph for this dtype: they take the graph's upper bounds
        (empty sequences, a longest prompt as long as the graph) and read no offset on the host."""
        return False

    def graph_variants(self, batch: int) -> tuple[str, ...]:
        """The graphs a batch bucket needs, one per way the step's metadata changes the kernels launched."""
        raise NotImplementedError(f"the {self.name} attention backend runs no CUDA graphs")

    def init_graph_buffers(self, max_batch: int, table_width: int, max_seq_len: int) -> None:
        """Static metadata buffers for decode batches of up to `max_batch` sequences."""
        raise NotImplementedError(f"the {self.name} attention backend runs no CUDA graphs")

    def graph_metadata(self, batch: int, variant: str) -> AttentionMetadata:
        """The metadata a graph of `batch` decodes is captured with: views into the static buffers."""
        raise NotImplementedError(f"the {self.name} attention backend runs no CUDA graphs")

    def graph_variant(self, step: AttentionInputs) -> str:
        """Which of `graph_variants` replays this decode step (decided on the host, without the device)."""
        raise NotImplementedError(f"the {self.name} attention backend runs no CUDA graphs")

    def fill_graph_buffers(self, step: AttentionInputs, batch: int) -> None:
        """Copy a decode step into the static buffers of the `batch` bucket: rows past the step's sequences are
        padding that stores nothing (slot -1) and attends to nothing (seq_len 0)."""
        raise NotImplementedError(f"the {self.name} attention backend runs no CUDA graphs")

    # ---- the layers' call ---------------------------------------------------------------------------
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor | None,
                v_cache: torch.Tensor | None, md: AttentionMetadata, scale: float,
                kv_stored: bool = False) -> torch.Tensor:
        """`kv_stored`: k and v are in the cache already (written by the fused rope kernel)."""
        ops = self.ops
        if k_cache is not None and not kv_stored:
            ops.store_kvcache(k, v, k_cache, v_cache, md.slot_mapping)
        nd = md.num_decodes
        if md.num_prefills == 0:
            return ops.decode(q, k_cache, v_cache, md.block_tables, md.seq_lens, scale, plan=md.decode_plan)
        out = torch.empty_like(q) if nd else None
        if md.prefix_cached:
            pre = ops.prefill_paged(q[nd:], k_cache, v_cache, md.prefill_query_start_loc, md.seq_lens[nd:],
                                    md.block_tables[nd:], md.max_prefill_query_len, scale)
        else:
            pre = ops.prefill(q[nd:], k[nd:], v[nd:], md.prefill_query_start_loc, md.max_prefill_query_len, scale)
        if out is None:
            return pre
        out[nd:] = pre
        out[:nd] = ops.decode(q[:nd], k_cache, v_cache, md.block_tables[:nd], md.seq_lens[:nd], scale,
                              plan=md.decode_plan)
        return out
