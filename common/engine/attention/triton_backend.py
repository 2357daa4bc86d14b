"""The triton backend's metadata: the decode plan it ships with each step, and the static buffers its CUDA
graphs are captured on. Its kernels (triton_ops, flash_prefill) come in as AttentionOps, so this module
imports no triton."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common.engine.attention.backend import AttentionBackend, AttentionOps
from common.engine.attention.decode_plan import PLAN_ROWS, DecodePlan, plan_capacity, plan_table
from common.engine.attention.metadata import AttentionInputs, AttentionMetadata

# A bucket's two graphs: the decode kernel follows a plan's table (split contexts, then a reduce), or runs one
# program a sequence (no table, no reduce).
SPLIT, WHOLE = "split", "whole"


@dataclass
class GraphBuffers:
    """The metadata every captured graph reads, sized for the largest bucket; a bucket's graphs read views of
    its first rows."""

    slot_mapping: torch.Tensor  # [N] int64, -1 on padding rows
    seq_lens: torch.Tensor  # [N] int32, 0 on padding rows
    block_tables: torch.Tensor  # [N, width] int32
    query_start_loc: torch.Tensor  # [N+1] int32: 0..N, one query a sequence
    plan: torch.Tensor  # [PLAN_ROWS, plan_capacity(N)] int32
    max_seq_len: int
    rows_in_use: int = 0  # rows past this hold padding already; rows before it, a replayed step's values


class TritonBackend(AttentionBackend):
    """Plans each step's decode attention on the host (decode_plan.py) and runs CUDA graphs: two a bucket, one
    that follows a plan's table and one that runs a program a sequence; the step's plan picks which replays."""

    name = "triton"
    supports_graphs = True

    def __init__(self, ops: AttentionOps, num_kv_heads: int, device: torch.device):
        super().__init__(ops)
        self.num_kv_heads, self.device = num_kv_heads, device
        self.buffers: GraphBuffers | None = None

    def plan_step(self, decode_lens: list[int], batch: int) -> np.ndarray | None:
        """The plan's [PLAN_ROWS, plan_capacity(batch)] table, or None when no context is split."""
        if not decode_lens:
            return None
        return plan_table(decode_lens, self.num_kv_heads, self.device, batch=batch)

    def decode_plan(self, step: AttentionInputs) -> DecodePlan:
        # Always a plan, even an unsplit one: without one the kernel would plan from seq_lens, syncing the device.
        size = step.plan.shape[0]
        if not size:
            return DecodePlan(None, False)
        return DecodePlan(step.plan.view(PLAN_ROWS, size // PLAN_ROWS).int(), True)

    # ---- CUDA graphs --------------------------------------------------------------------------------
    def supports_prefill_graphs(self, dtype: torch.dtype) -> bool:
        # FlashAttention takes half precision only; other prompts fall back to torch's reference, which reads the
        # sequences' offsets on the host.
        return dtype in (torch.float16, torch.bfloat16)

    def graph_variants(self, batch: int) -> tuple[str, ...]:
        return SPLIT, WHOLE

    def init_graph_buffers(self, max_batch: int, table_width: int, max_seq_len: int) -> None:
        n, device = max_batch, self.device
        plan = torch.zeros(PLAN_ROWS, plan_capacity(n, self.num_kv_heads, device), dtype=torch.int32, device=device)
        plan[0] = -1  # no units: capture runs on an empty plan
        self.buffers = GraphBuffers(
            slot_mapping=torch.full((n,), -1, dtype=torch.int64, device=device),
            seq_lens=torch.zeros(n, dtype=torch.int32, device=device),
            block_tables=torch.zeros(n, table_width, dtype=torch.int32, device=device),
            query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=device),
            plan=plan, max_seq_len=max_seq_len)

    def graph_metadata(self, batch: int, variant: str) -> AttentionMetadata:
        buf = self.buffers
        if variant == SPLIT:
            plan = DecodePlan(buf.plan[:, :plan_capacity(batch, self.num_kv_heads, self.device)], True)
        else:
            plan = DecodePlan(None, False)
        return AttentionMetadata(
            num_decodes=batch, num_decode_tokens=batch, slot_mapping=buf.slot_mapping[:batch],
            query_start_loc=buf.query_start_loc[:batch + 1], seq_lens=buf.seq_lens[:batch],
            block_tables=buf.block_tables[:batch], max_query_len=1, max_seq_len=buf.max_seq_len,
            prefix_cached=False, decode_plan=plan)

    def graph_variant(self, step: AttentionInputs) -> str:
        return SPLIT if step.plan.shape[0] else WHOLE

    def fill_graph_buffers(self, step: AttentionInputs, batch: int) -> None:
        """The plan must be planned for `batch` (plan_step was given the bucket). Copies convert int64 to the
        kernels' int32 on the way in."""
        buf, b = self.buffers, step.num_decodes
        size = step.plan.shape[0]
        if size:
            units = size // PLAN_ROWS
            assert units == plan_capacity(batch, self.num_kv_heads, self.device), \
                f"a plan of {units} units for a graph of batch {batch}"
            buf.plan[:, :units].copy_(step.plan.view(PLAN_ROWS, units))
        buf.slot_mapping[:b].copy_(step.slot_mapping)
        buf.seq_lens[:b].copy_(step.seq_lens)
        buf.block_tables[:b, :step.block_tables.shape[1]].copy_(step.block_tables)
        if buf.rows_in_use > b:  # rows an earlier, larger batch filled become padding again
            buf.slot_mapping[b:buf.rows_in_use].fill_(-1)
            buf.seq_lens[b:buf.rows_in_use].fill_(0)
        buf.rows_in_use = b


class FlashAttnBackend(TritonBackend):
    """The flash_attn package's kernels, planned and captured as the triton backend: its decode falls back to
    the Triton kernel (and its plan) for pages flash-attn cannot take."""

    name = "flash_attn"
