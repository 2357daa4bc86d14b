"""CUDA graphs without a GPU: the shapes capture is planned with (PITFALLS: block-table width, eager fallback),
the buckets steps replay in, and the replay path itself, with each captured graph stood in for by a forward on
the metadata it was captured with (views of the backend's static buffers), so a replay reads whatever the
runner and the backend filled in, as a CUDA graph does. The capture itself runs in tests/test_gpu_engine.py
on a GPU."""
from __future__ import annotations

import random

import pytest
import torch

from common.engine.attention.backend import AttentionOps
from common.engine.attention.torch_backend import TORCH_OPS
from common.engine.attention.triton_backend import SPLIT, WHOLE, TritonBackend
from common.engine.block_manager import BlockManager
from common.engine.cuda_graph import GraphRunner, block_table_width, graph_batch_sizes
from common.engine.llm import LLM
from common.engine.sampler_graph import SamplerGraphs
from common.engine.sequence import Sequence
from common.sampling_params import SamplingParams


@pytest.mark.parametrize("max_model_len, block_size", [(64, 16), (65, 16), (4096, 256), (40960, 16)])
def test_block_table_holds_a_full_length_prompt_plus_its_decoded_token(max_model_len, block_size):
    bm = BlockManager(4 * max_model_len // block_size + 8, block_size, enable_prefix_caching=False)
    seq = Sequence("r", list(range(max_model_len)), SamplingParams())
    assert bm.allocate(seq, max_model_len, use_cache=False)
    seq.token_ids.append(0)  # its first decoded token needs a slot too
    assert bm.allocate(seq, max_model_len + 1, use_cache=False)
    assert len(seq.block_table) <= block_table_width(max_model_len, block_size)


@pytest.mark.parametrize("max_num_seqs", [1, 7, 16, 100, 256, 512])
def test_batch_buckets_cover_every_batch_up_to_max_num_seqs(max_num_seqs):
    sizes = graph_batch_sizes(max_num_seqs)
    assert sizes == sorted(set(sizes)) and sizes[-1] == max_num_seqs
    for b in range(1, max_num_seqs + 1):  # each batch replays the smallest bucket that holds it
        assert any(s >= b for s in sizes)
    assert sizes[0] == 1


def graph_runner(max_num_seqs: int, max_model_len: int = 64) -> GraphRunner:
    backend = TritonBackend(TORCH_OPS, 2, torch.device("cpu"))
    return GraphRunner(torch.nn.Identity(), backend, max_num_seqs, max_model_len, 16, 8, torch.float32,
                       torch.device("cpu"))


def test_batches_past_the_largest_bucket_are_left_to_eager():
    sizes = graph_batch_sizes(1000)  # more than the largest bucket captured
    assert sizes[-1] < 1000
    graphs = graph_runner(1000)
    assert graphs.max_batch_size == sizes[-1] == 512
    assert graphs.bucket(513, True) is None and graphs.bucket(512, True) == 512
    assert graphs.bucket(3, True) == 4 and graphs.bucket(17, True) == 32 and graphs.bucket(1, True) == 1
    assert graphs.bucket(3, False) is None  # a step with prefills runs eagerly
    assert graphs.backend.buffers.block_tables.shape == (512, block_table_width(64, 16))


class StandIn:
    """A captured graph on CPU: its replay runs the forward it was captured with."""

    def __init__(self, graphs: GraphRunner, bs: int, md) -> None:
        self.graphs, self.bs, self.md = graphs, bs, md

    def replay(self) -> None:
        self.graphs._forward(self.bs, self.md)


def use_triton_backend(llm: LLM, ops: AttentionOps) -> TritonBackend:
    """Gives a CPU engine the triton backend's planning and metadata, on `ops`."""
    runner = llm.engine.runner
    backend = TritonBackend(ops, runner.layout.num_kv_heads, runner.device)
    runner.backend = backend
    for layer in runner.model.attention_layers():
        layer.backend = backend
    return backend


def with_graphs(llm: LLM, monkeypatch: pytest.MonkeyPatch, ops: AttentionOps = TORCH_OPS) -> list[tuple[int, str, int]]:
    """Gives a CPU engine the triton backend (on `ops`) and its graphs, captured as stand-ins; returns the list
    its replays are recorded in: (bucket, variant, batch)."""
    runner, config = llm.engine.runner, llm.engine.config
    backend = use_triton_backend(llm, ops)
    monkeypatch.setattr(GraphRunner, "_capture", lambda self, bs, md: StandIn(self, bs, md))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    graphs = GraphRunner(runner.model, backend, config.max_num_seqs, config.max_model_len, config.block_size,
                         config.model_config.hidden_size, runner.dtype, runner.device)
    graphs.capture()
    assert set(graphs.graphs) == {(bs, v) for bs in graphs.sizes for v in (SPLIT, WHOLE)}
    replays = []
    replay = graphs.replay

    def recorded(inputs, bucket):
        replays.append((bucket, backend.graph_variant(inputs.attn), inputs.input_ids.shape[0]))
        return replay(inputs, bucket)
    graphs.replay = recorded
    runner.graphs = graphs
    return replays


def generate(llm: LLM, arrivals: list[tuple[int, list[int], SamplingParams]]) -> dict[str, list[int]]:
    """Each request added before the step of its number; the tokens each request got."""
    engine, tokens, step = llm.engine, {}, 0
    while engine.has_unfinished() or any(at >= step for at, _, _ in arrivals):
        for i, (at, prompt, sampling) in enumerate(arrivals):
            if at == step:
                engine.add_request(str(i), prompt, sampling)
        for seq in engine.step():
            tokens.setdefault(seq.request_id, []).append(seq.last_token)
        step += 1
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    return tokens


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def long_among_short() -> tuple[dict, list]:
    """A long context among short ones makes split plans; requests end at different lengths and one comes late."""
    prompts = [list(range(1, 300)), [5, 6, 7], list(range(40, 60)), [9] * 11, [3, 1, 4, 1, 5]]
    arrivals = [(0 if i < 4 else 3, p, greedy(n)) for i, (p, n) in enumerate(zip(prompts, (9, 12, 4, 7, 2)))]
    return dict(num_kv_blocks=64, max_num_batched_tokens=512), arrivals


def blocks_reused() -> tuple[dict, list]:
    """Many short requests through a small pool of small blocks: a finished request's blocks soon hold another's
    KV, where a padding row left with the finished one's slot would write."""
    rng = random.Random(3)
    arrivals = [(0 if i < 6 else rng.randrange(1, 30), [rng.randrange(1, 500) for _ in range(rng.randrange(3, 30))],
                 greedy(rng.randrange(2, 14))) for i in range(14)]
    return dict(block_size=4, num_kv_blocks=32, max_num_batched_tokens=64), arrivals


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("scenario", [long_among_short, blocks_reused])
def test_graph_replays_give_the_eager_tokens(tiny_qwen3_dir, monkeypatch, overlap, scenario):
    """Decode batches shrink and grow in padded buckets; split plans are made for their graph's bucket (else the
    fill asserts); padding rows store nothing."""
    settings, arrivals = scenario()

    def run(graphs: bool):
        llm = LLM(str(tiny_qwen3_dir), device="cpu", max_num_seqs=8, overlap_scheduling=overlap,
                  enable_prefix_caching=False, **settings)
        try:
            replays = with_graphs(llm, monkeypatch) if graphs else None
            return generate(llm, arrivals), replays
        finally:
            llm.close()
    eager, _ = run(False)
    graphed, replays = run(True)
    assert graphed == eager
    assert {b for b, _, n in replays if n < b}, "no replay had padding rows"
    assert len({b for b, _, _ in replays}) >= 3 and any(n1 < n0 for (_, _, n0), (_, _, n1) in zip(replays, replays[1:]))
    if scenario is long_among_short:
        assert {v for _, v, _ in replays} == {SPLIT, WHOLE}


def with_sampler_graphs(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """`with_graphs`, and the LM head and sampler captured as stand-ins after it, with an argmax for the fused
    sampler (on CPU every one-pass batch is greedy); returns the list the sampler's replays are recorded in:
    (bucket, batch)."""
    with_graphs(llm, monkeypatch)
    runner = llm.engine.runner

    class Stand:
        def __init__(self, bs: int) -> None:
            self.bs = bs

        def replay(self) -> None:
            samplers._forward(self.bs)
    monkeypatch.setattr(SamplerGraphs, "capture", lambda self, pool: self.graphs.update(
        {bs: Stand(bs) for bs in self.sizes}))
    samplers = SamplerGraphs(lambda hidden, temps, seeds, out: out.copy_(runner.model.compute_logits(hidden).float()
                                                                         .argmax(-1)),
                             runner.graphs.hidden, runner.graphs.sizes)
    samplers.capture(None)
    replays = []
    replay = samplers.replay

    def recorded(bucket, batch):
        replays.append((bucket, batch.temperatures.shape[0]))
        return replay(bucket, batch)
    samplers.replay = recorded
    runner.sampler_graphs = samplers
    return replays


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_sampler_graphs_give_the_eager_tokens_and_leave_top_p_to_the_eager_sampler(tiny_qwen3_dir, monkeypatch,
                                                                                  overlap):
    """Decode steps sample from the static token buffer their sampler graph wrote (the next step's pending input
    read from it); a step with a top-p row samples eagerly, and the tokens match a run without graphs."""
    settings, arrivals = long_among_short()
    top_p = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    arrivals = arrivals + [(9, [2, 7, 1, 8, 2, 8], top_p)]  # joins once the others have decoded a while

    def run(graphs: bool):
        llm = LLM(str(tiny_qwen3_dir), device="cpu", max_num_seqs=8, overlap_scheduling=overlap,
                  enable_prefix_caching=False, **settings)
        try:
            replays = with_sampler_graphs(llm, monkeypatch) if graphs else None
            eager_samples = []
            if graphs:
                runner = llm.engine.runner
                execute = runner.execute
                runner.execute = lambda inputs: eager_samples.append(inputs.attn.num_decodes) or execute(inputs)
            return generate(llm, arrivals), replays, eager_samples
        finally:
            llm.close()
    eager, _, _ = run(False)
    graphed, replays, eager_samples = run(True)
    assert graphed == eager
    assert len(replays) >= 5 and {b for b, n in replays if n < b}, "no sampler replay had padding rows"
    assert any(n >= 2 for n in eager_samples), "no decode step with the top-p row sampled eagerly"
