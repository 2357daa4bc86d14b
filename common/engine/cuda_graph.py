"""CUDA graphs for decode steps: two graphs per batch-size bucket, all sharing one memory pool.

A decode step's inputs are copied into static buffers sized for the largest bucket; rows past the real
batch are padding that stores nothing (slot -1) and attends to nothing (seq_len 0). Of a bucket's two
graphs, one attends each sequence in one program, the other follows a decode plan's table (split
contexts plus a reduce, decode_plan.py): the step's plan picks which one replays.
"""
from __future__ import annotations

import logging

import torch

from common.engine.attention.decode_plan import PLAN_ROWS, DecodePlan, plan_capacity
from common.engine.attention.metadata import AttentionMetadata
from common.engine.context import forward_context

log = logging.getLogger(__name__)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(288, 513, 32))
    return [s for s in sizes if s < max_num_seqs] + [max_num_seqs] if max_num_seqs <= 512 else sizes


def block_table_width(max_model_len: int, block_size: int) -> int:
    """Columns of the captured block table: one more than max_model_len needs, for a full-length prompt
    plus its decoded token."""
    return -(-max_model_len // block_size) + 1


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, max_num_seqs: int, max_model_len: int, block_size: int,
                 hidden_size: int, num_kv_heads: int, dtype: torch.dtype, device: torch.device):
        self.model = model
        self.sizes = graph_batch_sizes(max_num_seqs)
        n = self.sizes[-1]
        width = block_table_width(max_model_len, block_size)
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, width, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.hidden = torch.zeros(n, hidden_size, dtype=dtype, device=device)
        self.num_kv_heads = num_kv_heads
        self.plan = torch.zeros(PLAN_ROWS, plan_capacity(n, num_kv_heads, device), dtype=torch.int32, device=device)
        self.plan[0] = -1  # no units: capture runs on an empty plan
        self.max_model_len = max_model_len
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}  # by (batch bucket, split)
        self.pool = None

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def bucket(self, batch: int) -> int:
        """The batch size of the graph that runs `batch` sequences."""
        return next(s for s in self.sizes if s >= batch)

    def _metadata(self, bs: int, split: bool) -> AttentionMetadata:
        plan = DecodePlan(self.plan[:, :plan_capacity(bs, self.num_kv_heads, self.plan.device)], True) if split \
            else DecodePlan(None, False)
        return AttentionMetadata(
            num_decodes=bs, num_decode_tokens=bs, slot_mapping=self.slot_mapping[:bs],
            query_start_loc=self.query_start_loc[:bs + 1], seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs], max_query_len=1, max_seq_len=self.max_model_len,
            prefix_cached=False, decode_plan=plan)

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest first, so the smaller graphs reuse its memory from the shared pool."""
        for bs in reversed(self.sizes):
            for split in (True, False):
                md = self._metadata(bs, split)
                with forward_context(md):  # warm-up outside the graph: lazy init, Triton compilation
                    self.hidden[:bs] = self.model(self.input_ids[:bs], self.positions[:bs])
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool), forward_context(md):
                    self.hidden[:bs] = self.model(self.input_ids[:bs], self.positions[:bs])
                if self.pool is None:
                    self.pool = graph.pool()
                self.graphs[bs, split] = graph
        torch.cuda.synchronize()
        log.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        """`md.decode_plan` must be planned for the bucket's batch size (ModelRunner._decode_plan)."""
        b = input_ids.shape[0]
        bs = self.bucket(b)
        plan = md.decode_plan
        if plan.split:
            assert plan.units.shape[1] == plan_capacity(bs, self.num_kv_heads, self.plan.device)
            self.plan[:, :plan.units.shape[1]] = plan.units
        self.input_ids[:b] = input_ids
        self.positions[:b] = positions
        self.slot_mapping[:b] = md.slot_mapping
        self.slot_mapping[b:bs] = -1
        self.seq_lens[:b] = md.seq_lens
        self.seq_lens[b:bs] = 0
        width = md.block_tables.shape[1]
        self.block_tables[:b, :width] = md.block_tables
        self.graphs[bs, plan.split].replay()
        return self.hidden[:b]
