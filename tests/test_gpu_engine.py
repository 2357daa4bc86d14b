"""The engine on a GPU: bf16 against HF, CUDA graphs against eager, Triton against torch, TP=2 against TP=1.

Run on the GPU host: `python -m pytest tests/test_gpu_engine.py -v`. Models: tiny-qwen3 and
qwen3-0.6b-shaped random weights (made here), and SmolLM2 when PDCLUSTER_SMOLLM2_DIR points at it.
"""
from __future__ import annotations

import os
import time

import pytest
import torch

from common.engine.attention.triton_backend import SPLIT
from common.engine.in_flight import InFlight
from common.engine.llm import LLM
from common.engine.llm_engine import LLMEngine
from common.engine.step_inputs import unpack_step
from common.sampling_params import SamplingParams
from tests.test_cuda_graph_shapes import blocks_reused, generate, long_among_short

pytestmark = pytest.mark.gpu

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "1, 2, 3, 4, 5,",
           "Hello, my name is", "The quick brown fox", "In 1492, Columbus", "Water boils at a temperature of"]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def smollm2_shapes_dir(tmp_path_factory):
    from scripts.model_prep import prepare_random

    return prepare_random("smollm2-135m", tmp_path_factory.mktemp("m") / "smollm2-135m", seed=0, dtype="bfloat16")


@pytest.fixture(scope="module", params=["smollm2", "smollm2_shapes", "qwen3_06b"])
def model_dir(request):
    if request.param == "smollm2":
        path = os.environ.get("PDCLUSTER_SMOLLM2_DIR")
        if not path:
            pytest.skip("PDCLUSTER_SMOLLM2_DIR not set")
        return path
    return request.getfixturevalue(f"{request.param}_dir")


def first_step_logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    engine.add_request("probe", ids, SamplingParams(max_tokens=1))
    batch = engine.scheduler.schedule()
    step = engine.runner.pack(batch)
    logits = engine.runner.execute(unpack_step(step.header, step.payload.to(engine.runner.device)))
    engine.abort("probe")
    return logits[0].float()


@torch.inference_mode()
def hf_bf16(model_dir, tokenizer, prompts, max_new_tokens):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).cuda().eval()
    first_logits, tokens, step_logits = [], [], []
    for p in prompts:
        ids = torch.tensor([tokenizer.encode(p)], device="cuda")
        out = hf(ids, use_cache=True)
        first_logits.append(out.logits[0, -1].float())
        seq, logits = [], []
        for _ in range(max_new_tokens):
            logits.append(out.logits[0, -1].float().cpu())
            t = int(out.logits[0, -1].argmax())
            seq.append(t)
            out = hf(torch.tensor([[t]], device="cuda"), past_key_values=out.past_key_values, use_cache=True)
        tokens.append(seq)
        step_logits.append(logits)
    del hf
    torch.cuda.empty_cache()
    return first_logits, tokens, step_logits


NEAR_TIE = 0.05  # of the top logit's size: below bf16's rounding noise of two implementations' sums


def greedy_agrees(ours: list[int], ref: list[int], ref_logits: list[torch.Tensor]) -> bool:
    """The same tokens, or the same until HF itself scored our token within a near-tie of its own pick there
    (random weights give many: two correct bf16 implementations then part ways, and any later token may differ)."""
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            top = ref_logits[i][b]
            return bool(top - ref_logits[i][a] <= NEAR_TIE * max(1.0, abs(float(top))))
    return len(ours) == len(ref)


def test_bf16_matches_hf(model_dir):
    llm = LLM(str(model_dir), device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3)
    try:
        ref_logits, ref_tokens, ref_steps = hf_bf16(model_dir, llm.tokenizer, PROMPTS, 16)
        for p, ref in zip(PROMPTS, ref_logits):
            ours = first_step_logits(llm.engine, llm.tokenizer.encode(p))
            rel = (ours - ref).norm() / ref.norm()
            assert rel < 2e-2, f"{p!r}: relative logit error {rel:.3g}"
        tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    finally:
        llm.close()
    exact = sum(a == b for a, b in zip(tokens, ref_tokens))
    agree = sum(greedy_agrees(a, b, steps) for a, b, steps in zip(tokens, ref_tokens, ref_steps))
    print(f"greedy agreement over 16 tokens: {exact}/{len(PROMPTS)} prompts exactly, {agree} up to a near-tie")
    assert agree >= 0.75 * len(PROMPTS)


def test_cuda_graphs_equal_eager_and_triton_equals_torch(qwen3_06b_dir):
    """Graphs replay the eager kernels exactly (bf16). The triton backend follows the torch one: first-step
    logits close in bf16 (flash prefill vs math), greedy tokens in float32. Token agreement in bf16 says little
    with random weights: one near-tie argmax flips a whole sequence (seen: one of the 8 prompts flipping at
    its first token whatever the decode split rule)."""
    # 33 sequences: a graph bucket with padding; one long prompt among short ones makes split plans
    prompts = PROMPTS * 4 + [" ".join(PROMPTS) * 40]
    outputs, logits = {}, {}
    runs = {"graphs": {}, "eager": {"enforce_eager": True},
            "torch": {"enforce_eager": True, "attention_backend": "torch"},
            "eager fp32": {"enforce_eager": True, "dtype": "float32"},
            "torch fp32": {"enforce_eager": True, "attention_backend": "torch", "dtype": "float32"}}
    for name, kw in runs.items():
        llm = LLM(str(qwen3_06b_dir), device="cuda", gpu_memory_utilization=0.3, **kw)
        graphs, splits = llm.engine.runner.graphs, []
        if graphs is not None:  # count the replays that follow a plan's split contexts
            replay, backend = graphs.replay, graphs.backend
            graphs.replay = lambda inputs, bucket: (splits.append(backend.graph_variant(inputs.attn) == SPLIT)
                                                    or replay(inputs, bucket))
        try:
            assert (graphs is not None) == (name == "graphs")
            if name in ("eager", "torch"):
                logits[name] = [first_step_logits(llm.engine, llm.tokenizer.encode(p)) for p in PROMPTS]
            outputs[name] = [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
            assert llm.engine.num_free_blocks == llm.engine.block_manager.num_blocks
            if name == "graphs":
                assert sum(splits) >= 15, splits
        finally:
            llm.close()
    assert outputs["graphs"] == outputs["eager"]
    for p, ours, ref in zip(PROMPTS, logits["eager"], logits["torch"]):
        rel = (ours - ref).norm() / ref.norm()
        assert rel < 2e-2, f"{p!r}: triton vs torch backend, relative first-step logit error {rel:.3g}"
    agree = sum(a == b for a, b in zip(outputs["eager fp32"], outputs["torch fp32"]))
    assert agree >= 0.75 * len(prompts), f"triton vs torch backends (float32) agree on {agree}/{len(prompts)}"


@pytest.mark.parametrize("scenario", [long_among_short, blocks_reused])
def test_graphs_equal_eager_as_batches_shrink_and_grow_and_blocks_are_reused(tiny_qwen3_dir, scenario):
    """tests/test_cuda_graph_shapes.py's replay scenarios with real graphs and the Triton kernels: padded buckets,
    split plans, batches that shrink below the rows a replay filled while freed blocks take new KV."""
    settings, arrivals = scenario()
    tokens = {}
    for name, kw in {"graphs": {}, "eager": {"enforce_eager": True}}.items():
        llm = LLM(str(tiny_qwen3_dir), device="cuda", dtype="float32", max_num_seqs=8, enable_prefix_caching=False,
                  **settings, **kw)
        try:
            assert (llm.engine.runner.graphs is not None) == (name == "graphs")
            tokens[name] = generate(llm, arrivals)
        finally:
            llm.close()
    assert tokens["graphs"] == tokens["eager"]


def test_prefill_graphs_equal_eager(tiny_qwen3_dir):
    """tests/test_prefill_graph.py's arrivals with real prompt graphs (FlashAttention and the paged prefill kernel
    under the graphs' upper bounds) against eager steps: fresh and cached prompts, alone and beside decodes, steps
    that fill fewer sequences and tokens than the one before, a step too large for a graph. bf16: FlashAttention
    takes half precision only (in float32 no prompt graph is captured)."""
    from tests.test_prefill_graph import arrivals, generate as generate_greedy

    tokens, replays = {}, []
    for name, kw in {"graphs": {"prefill_graph_max_tokens": 128}, "eager": {"enforce_eager": True}}.items():
        llm = LLM(str(tiny_qwen3_dir), device="cuda", dtype="bfloat16", max_num_seqs=8, max_num_batched_tokens=256,
                  num_kv_blocks=96, **kw)
        runner = llm.engine.runner
        try:
            if name == "graphs":
                graphs = runner.prefill_graphs
                assert graphs.sizes == [64, 128] and graphs.max_seqs == 8
                replay = graphs.replay
                graphs.replay = lambda inputs, t: replays.append((t, graphs.variant(inputs))) or replay(inputs, t)
            tokens[name] = generate_greedy(llm, arrivals())
        finally:
            llm.close()
    assert tokens["graphs"] == tokens["eager"]
    assert {v for _, v in replays} == {"fresh", "cached"} and {t for t, _ in replays} == {64, 128}


def test_prefix_cache_and_preemption_on_gpu(qwen3_06b_dir):
    # float32: random weights leave tiny logit gaps, and in bf16 a different batching flips some argmaxes.
    shared = "You are a helpful assistant. Answer briefly and precisely. " * 8
    prompts = [shared + p for p in PROMPTS]
    base = LLM(str(qwen3_06b_dir), device="cuda", dtype="float32", gpu_memory_utilization=0.3,
               enable_prefix_caching=False)
    try:
        expected = [o.token_ids for o in base.generate(prompts, GREEDY, use_tqdm=False)]
    finally:
        base.close()
    tight = LLM(str(qwen3_06b_dir), device="cuda", dtype="float32", num_kv_blocks=40, max_num_batched_tokens=256,
                max_num_seqs=8)
    try:
        got = [o.token_ids for o in tight.generate(prompts, GREEDY, use_tqdm=False)]
        assert tight.engine.block_manager.cache_hit_tokens > 0
        assert tight.engine.scheduler.num_preemptions > 0
    finally:
        tight.close()
    assert got == expected


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tensor_parallel_2_equals_1(qwen3_06b_dir):
    results = {}
    for tp in (1, 2):
        llm = LLM(str(qwen3_06b_dir), device="cuda", tensor_parallel_size=tp, gpu_memory_utilization=0.3)
        try:
            results[tp] = [o.token_ids[:8] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        finally:
            llm.close()
    agree = sum(a == b for a, b in zip(results[1], results[2]))
    print(f"TP=2 vs TP=1 first 8 tokens agree on {agree}/{len(PROMPTS)}")
    assert agree >= 0.75 * len(PROMPTS)


def test_late_launch_waits_for_the_step_in_flight(tmp_path):
    """With overlap, a server may wait before the next step (`launch_delay`) until shortly before the GPU
    finishes the batch in flight: learned from CUDA-event step times; the waits change no token. Qwen3-8B
    shapes: a step long enough against the host's launch work (with Qwen3-0.6B at batch 4 the host's launch
    work, 0.75 ms of a 1.3 ms step on an H200, leaves the clock no room to wait)."""
    from scripts.model_prep import prepare_tokenizer

    path = prepare_tokenizer("qwen3-8b", tmp_path / "qwen3-8b")
    sampling = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ids = [list(range(100 + i, 400 + i)) for i in range(8)]
    # No prefix cache: the second pass must run the same kernels as the first (a cached prefix takes the
    # paged prefill, whose bf16 rounding flips near-tied argmaxes of random weights).
    llm = LLM(str(path), device="cuda", load_format="dummy", gpu_memory_utilization=0.5, enable_prefix_caching=False)
    try:
        expected = [o.token_ids for o in llm.generate(ids, sampling, use_tqdm=False)]
        engine = llm.engine
        for i, p in enumerate(ids):
            engine.add_request(f"r{i}", p, sampling)
        delays, tokens = [], {f"r{i}": [] for i in range(len(ids))}
        while engine.has_unfinished():
            time.sleep(engine.launch_delay())
            for seq in engine.step():
                tokens[seq.request_id].append(seq.last_token)
            delays.append(engine.launch_delay())
        clock = engine.clock
        assert clock.step_s is not None and 0 < clock.step_s < 0.1, clock
        assert 0 < max(delays) < clock.step_s, (clock, delays)  # it waited, never a whole step
        assert [tokens[f"r{i}"] for i in range(len(ids))] == expected
        assert engine.totals.gpu_seconds > 0
    finally:
        llm.close()


def test_a_step_that_ends_before_the_clock_said_launches_the_next_at_once(qwen3_06b_dir, monkeypatch):
    """In an MPS client, a clock that takes the step in flight for far longer than it runs (steps were slow beside
    another engine's prompt) keeps no server waiting once the step's tokens are done: the GPU would sit idle. (No MPS
    server here: the pipe named only makes the engine take itself for a client.)"""
    from common.engine.device import mps_client

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/no-mps-server-here")
    mps_client.cache_clear()
    llm = LLM(str(qwen3_06b_dir), device="cuda", gpu_memory_utilization=0.3)
    mps_client.cache_clear()
    try:
        engine = llm.engine
        for i in range(4):
            engine.add_request(f"r{i}", list(range(10 + i, 60 + i)), SamplingParams(max_tokens=16, ignore_eos=True))
        for _ in range(4):
            engine.step()
        assert engine.early_launch_event() is not None
        engine.clock.step_s = 1.0  # a second a step
        engine.clock.in_flight(time.perf_counter(), decode_only=True)
        torch.cuda.synchronize()
        assert engine.clock.delay(time.perf_counter()) > 0.5  # the clock alone would wait
        assert engine.launch_delay() == 0.0
    finally:
        llm.close()


def test_a_launched_steps_tokens_come_back_through_pinned_memory():
    """A non-blocking copy into pageable memory waits for the GPU: the launch would no longer return before its step
    is done, and the overlap with the next step's scheduling would be lost."""
    tokens = torch.arange(8, device="cuda")
    flight = InFlight.start(tokens)
    tokens.fill_(-1)  # the step after it writes the same buffer (a sampler graph's tokens)
    assert flight.host.is_pinned() and flight.tokens() == list(range(8))
