"""CUDA graphs of decode steps: `model(input_ids, positions)` captured per batch-size bucket and per variant the
attention backend asks for, all sharing one memory pool.

The graph runner owns the model's static inputs and output; the attention metadata lives in the backend's
static buffers (AttentionBackend.init_graph_buffers), which it fills before each replay.
"""
from __future__ import annotations

import bisect
import logging

import torch

from common.engine.attention.backend import AttentionBackend
from common.engine.attention.metadata import AttentionMetadata
from common.engine.context import forward_context
from common.engine.step_inputs import StepInputs

log = logging.getLogger(__name__)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(288, 513, 32))
    return [s for s in sizes if s < max_num_seqs] + [max_num_seqs] if max_num_seqs <= 512 else sizes


def block_table_width(max_model_len: int, block_size: int) -> int:
    """Columns of the captured block table: one more than max_model_len needs, for a full-length prompt
    plus its decoded token."""
    return -(-max_model_len // block_size) + 1


class GraphRunner:
    """Captures and replays the decode graphs of one model. Generic: what a graph's attention reads, and how many
    graphs a bucket needs, is the backend's to say (AttentionBackend's graph hooks)."""

    def __init__(self, model: torch.nn.Module, backend: AttentionBackend, max_num_seqs: int, max_model_len: int,
                 block_size: int, hidden_size: int, dtype: torch.dtype, device: torch.device):
        self.model, self.backend = model, backend
        self.sizes = graph_batch_sizes(max_num_seqs)
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.hidden = torch.zeros(n, hidden_size, dtype=dtype, device=device)
        backend.init_graph_buffers(n, block_table_width(max_model_len, block_size), max_model_len)
        self.graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}  # by (batch bucket, variant)
        self.pool = None

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def bucket(self, num_decodes: int, decode_only: bool) -> int | None:
        """The batch size of the graph that runs a step of `num_decodes` decodes; None: the step runs eagerly
        (it has prefills, or more sequences than the largest bucket)."""
        if not decode_only or num_decodes > self.sizes[-1]:
            return None
        return self.sizes[bisect.bisect_left(self.sizes, num_decodes)]

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest first, so the smaller graphs reuse its memory from the shared pool."""
        for bs in reversed(self.sizes):
            for variant in self.backend.graph_variants(bs):
                md = self.backend.graph_metadata(bs, variant)
                self._forward(bs, md)  # warm-up outside the graph: lazy init, Triton compilation
                self.graphs[bs, variant] = self._capture(bs, md)
        torch.cuda.synchronize()
        log.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def _capture(self, bs: int, md: AttentionMetadata) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._forward(bs, md)
        if self.pool is None:
            self.pool = graph.pool()
        return graph

    def _forward(self, bs: int, md: AttentionMetadata) -> None:
        with forward_context(md):
            self.hidden[:bs] = self.model(self.input_ids[:bs], self.positions[:bs])

    def replay(self, inputs: StepInputs, bucket: int) -> torch.Tensor:
        """The hidden states of a decode-only step, replayed in the graph of `bucket` (`self.bucket`'s answer, the
        batch the step's plan was made for). Rows past the step's sequences are padding the backend makes inert."""
        b = inputs.input_ids.shape[0]
        self.input_ids[:b].copy_(inputs.input_ids)
        self.positions[:b].copy_(inputs.positions)
        self.backend.fill_graph_buffers(inputs.attn, bucket)
        self.graphs[bucket, self.backend.graph_variant(inputs.attn)].replay()
        return self.hidden[:b]
