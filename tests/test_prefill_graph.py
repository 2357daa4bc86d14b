"""Prompt-step CUDA graphs without a GPU: each graph is stood in for by a forward on the static buffers and upper
bounds it was captured with, so a replay reads whatever the runner filled in (and whatever an earlier, larger step
left there), as a CUDA graph does. The captures themselves run in tests/test_gpu_engine.py."""
from __future__ import annotations

import pytest
import torch

from common.engine.cuda_graph import block_table_width
from common.engine.llm import LLM
from common.engine.prefill_graph import CACHED, FRESH, PrefillGraphRunner, prefill_graph_sizes
from common.engine.step_inputs import unpack_step
from common.engine.step_sizes import token_buckets
from common.sampling_params import SamplingParams
from tests.test_cuda_graph_shapes import with_graphs


class StandIn:
    """A captured graph on CPU: its replay runs the forward it was captured with."""

    def __init__(self, graphs: PrefillGraphRunner, t: int, md) -> None:
        self.graphs, self.t, self.md = graphs, t, md

    def replay(self) -> None:
        self.graphs._forward(self.t, self.md)


def test_graph_sizes_are_the_padded_step_sizes_up_to_the_limit():
    assert prefill_graph_sizes(8192, 2048) == [n for n in token_buckets(8192) if n <= 2048]
    assert prefill_graph_sizes(8192, 2048)[-1] == 2048 and prefill_graph_sizes(8192, 0) == []
    assert prefill_graph_sizes(300, 4096) == token_buckets(300)  # the budget's own size is a bucket
    assert prefill_graph_sizes(8192, None) == token_buckets(8192)  # the default: every step size ...
    assert prefill_graph_sizes(16384, None) == [n for n in token_buckets(16384) if n <= 8192]  # ... up to 8192


def with_prefill_graphs(llm: LLM, monkeypatch: pytest.MonkeyPatch, max_tokens: int, max_seqs: int) -> list:
    """Gives a CPU engine padded steps and prompt graphs (captured as stand-ins); returns the list its replays are
    recorded in: (tokens, variant, sequences)."""
    runner, cfg = llm.engine.runner, llm.engine.config
    monkeypatch.setattr(PrefillGraphRunner, "_capture", lambda self, t, md: StandIn(self, t, md))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    graphs = PrefillGraphRunner(runner.model, prefill_graph_sizes(cfg.max_num_batched_tokens, max_tokens), max_seqs,
                                block_table_width(cfg.max_model_len, cfg.block_size), cfg.max_model_len,
                                cfg.model_config.hidden_size, runner.dtype, runner.device)
    graphs.capture()
    assert set(graphs.graphs) == {(t, v) for t in graphs.sizes for v in (FRESH, CACHED)}
    replays = []
    replay = graphs.replay

    def recorded(inputs, t):
        replays.append((t, graphs.variant(inputs), inputs.attn.num_seqs))
        return replay(inputs, t)
    graphs.replay = recorded
    runner.prefill_graphs, runner.pads_steps = graphs, True
    return replays


def generate(llm: LLM, arrivals: list[tuple[int, list[int], int]]) -> dict[str, list[int]]:
    """Each request (greedy, its max_tokens) added before the step of its number; the tokens each request got."""
    engine, tokens, step = llm.engine, {}, 0
    while engine.has_unfinished() or any(at >= step for at, _, _ in arrivals):
        for i, (at, prompt, n) in enumerate(arrivals):
            if at == step:
                engine.add_request(str(i), prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        for seq in engine.step():
            tokens.setdefault(seq.request_id, []).append(seq.last_token)
        step += 1
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    return tokens


def arrivals() -> list[tuple[int, list[int], int]]:
    """Four short prompts in one step, then a long one beside their decodes, whose replay meets the four's offsets
    left in the buffers; prompts sharing a cached prefix; five prompts in one step, more than a graph holds; a
    prompt past the largest graph; prompts arriving while others decode (mixed steps)."""
    shared = list(range(100, 148))  # three full 16-token blocks
    return [(0, [1] * 9, 5), (0, [2] * 8, 6), (0, [3] * 7, 4), (0, [4] * 10, 6),
            (2, list(range(1, 120)), 5),
            (5, shared + [1, 2, 3], 3),
            (9, shared + [7, 8], 4), (9, shared + [9] * 10, 3),
            (14, [4] * 9, 2), (14, [8] * 3, 2), (14, [11] * 5, 3), (14, [12] * 7, 2), (14, [13] * 2, 2),
            (18, list(range(200, 400)), 3),
            (19, [21, 22], 6)]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_prefill_graph_replays_give_the_eager_tokens(tiny_qwen3_dir, monkeypatch, overlap):
    """Prompts alone and beside decodes (whose decode graphs stand in too), fresh and over cached prefixes."""
    def run(graphs: bool):
        llm = LLM(str(tiny_qwen3_dir), device="cpu", max_num_seqs=8, overlap_scheduling=overlap,
                  max_num_batched_tokens=256, num_kv_blocks=96)
        try:
            replays = None
            if graphs:
                with_graphs(llm, monkeypatch)
                replays = with_prefill_graphs(llm, monkeypatch, max_tokens=128, max_seqs=4)
            return generate(llm, arrivals()), replays
        finally:
            llm.close()
    eager, _ = run(False)
    graphed, replays = run(True)
    assert graphed == eager and len(graphed) == len(arrivals())
    assert {v for _, v, _ in replays} == {FRESH, CACHED}
    assert {t for t, _, _ in replays} == {64, 128}  # the 200-token prompt ran eagerly, in a 256-token step
    assert all(n <= 4 for _, _, n in replays)  # the five-prompt step ran eagerly
    assert any(n1 < n0 for (_, _, n0), (_, _, n1) in zip(replays, replays[1:]))  # stale rows were met


def test_unused_sequence_slots_and_padding_change_nothing(tiny_qwen3_dir, monkeypatch):
    """A graph's upper bounds (empty sequences, padding tokens, the longest prompt as the bucket) give the logits
    of an unpadded eager forward over the same prompts."""
    llm = LLM(str(tiny_qwen3_dir), device="cpu", max_num_seqs=8, max_num_batched_tokens=256, num_kv_blocks=64,
              enable_prefix_caching=False)
    try:
        engine, runner = llm.engine, llm.engine.runner
        prompts = [[3, 4, 5, 6], list(range(10, 40))]
        for i, p in enumerate(prompts):
            engine.add_request(f"p{i}", p, SamplingParams(max_tokens=1, temperature=0.0))
        batch = engine.scheduler.schedule()
        step = runner.pack(batch)
        plain = runner.execute(unpack_step(step.header, step.payload))
        with_prefill_graphs(llm, monkeypatch, max_tokens=256, max_seqs=8)
        step = runner.pack(batch)
        assert step.header.num_tokens == 64 and step.header.num_seqs == 2
        graphed = runner.execute(unpack_step(step.header, step.payload))
        torch.testing.assert_close(graphed, plain)
    finally:
        llm.close()
