"""CUDA graphs of a decode step's LM head and sampler, replayed right after its decode graph.

Run eagerly, the LM head's GEMM and the sampler's kernels are a handful of Python calls and launches a step, and
at small batches the host's launch work a step is as long as the GPU's. Captured per batch bucket, they are one
replay. Only the one-pass sampler is captured (`SamplingBatch.one_pass`: greedy and Gumbel-max rows, no top-k or
top-p); other steps run the head and the sampler eagerly on the decode graph's hidden states.

The logits, where the head writes them (a batch of up to 64 rows never does: layers/head_sampler.py), stay inside
the graph's memory pool: only the sampled tokens, a static buffer shared by every bucket, outlive a replay. A step
reads them before the next replay overwrites them, in stream order.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from common.engine.layers.sampler import SamplingBatch

log = logging.getLogger(__name__)

# (hidden states, temperatures, seeds, out): writes a token a row into `out` (CausalLM.sample_one_pass)
OnePass = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class SamplerGraphs:
    """Captures and replays `one_pass` (hidden states to tokens: the LM head and the sampler) over the first rows
    of `hidden`, the decode graphs' static output, for each batch bucket of `sizes`."""

    def __init__(self, one_pass: OnePass, hidden: torch.Tensor, sizes: list[int]):
        self.one_pass, self.hidden, self.sizes = one_pass, hidden, sizes
        n, device = sizes[-1], hidden.device
        self.temperatures = torch.zeros(n, dtype=torch.float32, device=device)
        self.seeds = torch.zeros(n, dtype=torch.int64, device=device)
        self.tokens = torch.zeros(n, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    @torch.inference_mode()
    def capture(self, pool) -> None:
        """Into the decode graphs' pool (`pool`): a step replays them one after the other, never side by side."""
        for bs in reversed(self.sizes):
            self._forward(bs)  # warm-up outside the graph: Triton compilation
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._forward(bs)
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        log.info("captured the LM head and sampler for batch sizes %s", self.sizes)

    def _forward(self, bs: int) -> None:
        self.one_pass(self.hidden[:bs], self.temperatures[:bs], self.seeds[:bs], self.tokens[:bs])

    def replay(self, bucket: int, batch: SamplingBatch) -> torch.Tensor:
        """The tokens of a one-pass `batch` (its rows the step's decodes, the first rows of `bucket`), sampled from
        the hidden states the decode graph of `bucket` just wrote. A view of the static buffer: the next replay
        overwrites it."""
        assert batch.one_pass
        b = batch.temperatures.shape[0]
        self.temperatures[:b].copy_(batch.temperatures)
        if batch.seeds is not None:  # greedy rows (temperature 0) read no seed
            self.seeds[:b].copy_(batch.seeds)
        self.graphs[bucket].replay()
        return self.tokens[:b]
