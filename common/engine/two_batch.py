"""Two-batch overlap: a large decode step as two halves on two CUDA streams, paced so that one half's attention
(reading the KV cache, bound by HBM bandwidth) runs beside the other half's projections and norms (small
GEMMs, bound by their latency), where one batch would run them one after the other.

Each half's forward is a chain of phases of two kinds that alternate: projections (the norm and qkv projection
before a layer's attention; the output projection, norm and MLP after it) and attention. Half 1 runs one phase
behind half 0, and no two phases of one kind run at once:

    stream 0:  proj | attn | proj | attn | ...
    stream 1:         proj | attn | proj | attn | ...

Decode-only CUDA graphs of an unsplit plan use it (cuda_graph.py), from `EngineConfig.decode_overlap_min_batch`
sequences; the graph captures the streams' events as edges, so a replay pays nothing for the pacing.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import torch

from common.engine.attention.metadata import AttentionMetadata
from common.engine.context import forward_context
from common.engine.models.llama import CausalLM, DecoderModel


def halve(md: AttentionMetadata) -> tuple[AttentionMetadata, AttentionMetadata]:
    """The metadata of the batch's first and second halves (views: the graph's buffers stay the ones read)."""
    n = md.num_decodes
    cut = n // 2

    def rows(a: int, b: int) -> AttentionMetadata:
        return replace(md, num_decodes=b - a, num_decode_tokens=b - a, slot_mapping=md.slot_mapping[a:b],
                       query_start_loc=md.query_start_loc[:b - a + 1], seq_lens=md.seq_lens[a:b],
                       block_tables=md.block_tables[a:b])

    return rows(0, cut), rows(cut, n)


def phases(model: DecoderModel, positions: torch.Tensor, x: torch.Tensor, md: AttentionMetadata,
            out: torch.Tensor) -> Iterator[None]:
    """One half's forward, pausing after each phase; the final norm's result goes to `out`."""
    layers = model.layers
    qkv, residual = layers[0].before_attention(x, None)
    yield
    for i, layer in enumerate(layers):
        with forward_context(md):
            attn_out = layer.self_attn.attend(positions, qkv)
        yield
        x, residual = layer.after_attention(attn_out, residual)
        if i + 1 < len(layers):
            qkv, residual = layers[i + 1].before_attention(x, residual)
        else:
            out.copy_(model.norm(x, residual)[0])
        yield


class TwoBatchOverlap:
    """The second stream and the pacing of the two halves; one per graph runner (its stream must be the one
    both the warm-up forward and the capture use)."""

    def __init__(self, device: torch.device, min_batch: int):
        assert min_batch >= 2, min_batch
        self.side, self.min_batch = torch.cuda.Stream(device), min_batch

    def applies(self, md: AttentionMetadata) -> bool:
        """Whether a step with this metadata runs as two halves: decodes only, `min_batch` of them or more,
        attention planned a program a sequence (a split plan's table indexes the whole batch)."""
        plan = md.decode_plan
        return (md.num_decodes >= self.min_batch and md.num_prefills == 0 and plan is not None
                and not plan.split)

    def forward(self, model: CausalLM, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata,
                out: torch.Tensor) -> None:
        """`out` [B, hidden] gets what `model(input_ids, positions)` returns under `md`."""
        halves = halve(md)
        cut = halves[0].num_decodes
        x = model.model.embed_tokens(input_ids)
        spans = ((0, cut), (cut, md.num_decodes))
        main = torch.cuda.current_stream()
        streams = (main, self.side)
        self.side.wait_stream(main)
        chains = [phases(model.model, positions[a:b], x[a:b], h, out[a:b]) for (a, b), h in zip(spans, halves)]
        num_phases = 2 * len(model.model.layers) + 1
        done: list[list[torch.cuda.Event]] = [[], []]

        def run(half: int, phase: int, after: torch.cuda.Event | None) -> None:
            stream = streams[half]
            with torch.cuda.stream(stream):
                if after is not None:
                    stream.wait_event(after)
                next(chains[half])
                event = torch.cuda.Event()
                event.record(stream)
                done[half].append(event)

        for t in range(num_phases + 1):
            if t < num_phases:  # half 0's phase t, once half 1 has left the phase of the same kind (t - 2)
                run(0, t, done[1][t - 2] if t >= 2 else None)
            if t >= 1:  # half 1's phase t - 1, once half 0 has finished it
                run(1, t - 1, done[0][t - 1])
        main.wait_stream(self.side)  # before `x` is freed on the main stream, too
