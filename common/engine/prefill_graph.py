"""CUDA graphs of prompt steps: the model's forward over prompts alone, captured once per padded token count up to
`prefill_graph_max_tokens` (by default the step budget, up to DEFAULT_MAX_TOKENS), so that a prompt step costs its GPU
time rather than an eager forward's host work (a Python call and a launch for each of a dozen kernels in every layer).

A graph is captured at upper bounds that the attention kernels take as such (docs/design.md, "Kernel contracts"):
T tokens (the bucket, `step_sizes.padded_tokens`), MAX_SEQS sequences, a longest prompt of T tokens. A replayed
step's unused sequences are empty (their query_start_loc repeats the last offset), and its padding tokens belong
to no sequence and store nothing (slot -1), as in an eager step.

Two graphs a bucket: prompts with no cached context (FlashAttention varlen), and prompts over cached prefix blocks
(the paged prefill kernel, which reads the block tables).
"""
from __future__ import annotations

import logging

import torch

from common.engine.attention.metadata import AttentionMetadata
from common.engine.context import forward_context
from common.engine.step_inputs import StepInputs
from common.engine.step_sizes import token_buckets

log = logging.getLogger(__name__)

FRESH, CACHED = "fresh", "cached"
# Sequences a prompt graph holds. The attention kernels' grids grow with it, and every layer launches them in
# full: a larger bound costs each replay more, a smaller one sends more steps to the eager forward.
MAX_SEQS = 32


# Prompt graphs by default: up to this many tokens, or the step budget if smaller. Past the graphs a prompt step runs
# eagerly, its host launching each layer's kernels one by one for longer than a small model's GPU takes to run them,
# and its worker's loop takes no message meanwhile; past this size the GPU's work is longer than that launch on any
# model, while each graph's memory pool grows with its size.
DEFAULT_MAX_TOKENS = 8192


def prefill_graph_sizes(max_num_batched_tokens: int, max_tokens: int | None) -> list[int]:
    """The padded token counts a prompt graph is captured for: every bucket a step with prefills can be padded to,
    up to `max_tokens` (None: DEFAULT_MAX_TOKENS)."""
    limit = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    return [n for n in token_buckets(max_num_batched_tokens) if n <= limit]


class PrefillGraphRunner:
    """Captures and replays the prompt graphs of one model. It owns their static inputs, attention metadata and
    output; the attention backend only supplies kernels that accept the upper bounds (module docstring)."""

    def __init__(self, model: torch.nn.Module, sizes: list[int], max_seqs: int, table_width: int,
                 max_model_len: int, hidden_size: int, dtype: torch.dtype, device: torch.device):
        self.model, self.sizes, self.max_seqs = model, sizes, max_seqs
        self.max_model_len = max_model_len
        n = sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.query_start_loc = torch.zeros(max_seqs + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_seqs, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_seqs, table_width, dtype=torch.int32, device=device)
        self.hidden = torch.zeros(n, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}  # by (token bucket, variant)
        self.pool = None
        self._sizes = set(sizes)

    def bucket(self, inputs: StepInputs) -> int | None:
        """The token count of the graph that runs this prompt step (its padded token count); None: it runs eagerly
        (a count past the largest graph, or more sequences than a graph holds)."""
        t = inputs.input_ids.shape[0]
        return t if t in self._sizes and inputs.attn.num_seqs <= self.max_seqs else None

    @staticmethod
    def variant(inputs: StepInputs) -> str:
        return CACHED if inputs.attn.prefix_cached else FRESH

    def metadata(self, t: int, variant: str) -> AttentionMetadata:
        """What the layers of a `t`-token graph read: views of the static buffers, and upper bounds for the ints."""
        qsl = self.query_start_loc
        return AttentionMetadata(
            num_decodes=0, num_decode_tokens=0, slot_mapping=self.slot_mapping[:t], query_start_loc=qsl,
            seq_lens=self.seq_lens, block_tables=self.block_tables, max_query_len=t, max_seq_len=self.max_model_len,
            prefix_cached=variant == CACHED, prefill_query_start_loc=qsl, max_prefill_query_len=t)

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest first, so the smaller graphs reuse its memory from the shared pool."""
        for t in reversed(self.sizes):
            for variant in (FRESH, CACHED):
                md = self.metadata(t, variant)
                self._forward(t, md)  # warm-up outside the graph: lazy init, Triton compilation
                self.graphs[t, variant] = self._capture(t, md)
        torch.cuda.synchronize()
        log.info("captured prefill CUDA graphs for %d to %d tokens (%d sizes)", self.sizes[0], self.sizes[-1],
                 len(self.sizes))

    def _capture(self, t: int, md: AttentionMetadata) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._forward(t, md)
        if self.pool is None:
            self.pool = graph.pool()
        return graph

    def _forward(self, t: int, md: AttentionMetadata) -> None:
        with forward_context(md):
            self.hidden[:t] = self.model(self.input_ids[:t], self.positions[:t])

    def replay(self, inputs: StepInputs, t: int) -> torch.Tensor:
        """The hidden states of each sequence's last new token, from the graph of `t` tokens (`bucket`'s answer)."""
        a, b = inputs.attn, inputs.attn.num_seqs
        self.input_ids[:t].copy_(inputs.input_ids)
        self.positions[:t].copy_(inputs.positions)
        self.slot_mapping[:t].copy_(a.slot_mapping)
        self.query_start_loc[:b + 1].copy_(a.query_start_loc)
        self.query_start_loc[b + 1:].copy_(a.query_start_loc[b:].expand(self.max_seqs - b))  # empty sequences
        variant = self.variant(inputs)
        if variant == CACHED:  # what only the paged kernel reads (an empty sequence's seq_len is never read)
            self.seq_lens[:b].copy_(a.seq_lens)
            self.block_tables[:b, :a.block_tables.shape[1]].copy_(a.block_tables)
        self.graphs[t, variant].replay()
        return self.hidden[:t][inputs.logits_indices]
