"""The colocated engine against HF transformers, and under the scheduler's harder paths."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import ConfigError
from common.engine.llm import LLM
from common.sampling_params import InvalidRequest, SamplingParams
from tests.hf_oracle import hf_greedy

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4, 5,",
    "Hello, my name is",
    "The quick brown fox jumps over",
    "In 1492, Columbus",
    "Water boils at a temperature of",
]
GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
SHARED = "You are a helpful assistant. Answer briefly and precisely, with no preamble at all. Question: "


def all_blocks_free(llm: LLM) -> bool:
    return llm.engine.num_free_blocks == llm.engine.block_manager.num_blocks


@pytest.fixture(scope="module", params=["smollm2", "tiny_qwen3", "tiny_llama"])
def model_dir(request):
    return request.getfixturevalue(f"{request.param}_dir")


@pytest.fixture(scope="module")
def llm(model_dir):
    engine = LLM(str(model_dir), device="cpu", kv_cache_memory=256 << 20)
    yield engine
    engine.close()


def generate(llm: LLM, prompts, sampling=GREEDY):
    out = llm.generate(prompts, sampling, use_tqdm=False)
    assert all_blocks_free(llm)
    return [o.token_ids for o in out]


def test_greedy_matches_hf(llm, model_dir):
    ours = generate(llm, PROMPTS)
    expected = [hf_greedy(model_dir, llm.tokenizer.encode(p), 32) for p in PROMPTS]
    assert ours == expected


def test_batched_equals_one_by_one(llm):
    batched = generate(llm, PROMPTS)
    single = [generate(llm, [p])[0] for p in PROMPTS]
    assert batched == single


def test_shared_prefix_hits_the_cache_and_matches_no_cache(llm, model_dir):
    prompts = [SHARED + q for q in ["What is 2+2?", "Name a color.", "Capital of Italy?", "Largest planet?"]]
    bm = llm.engine.block_manager
    generate(llm, prompts[:1])  # warms the cache with the shared prefix
    hits_before = bm.cache_hit_tokens
    cached = generate(llm, prompts)
    assert bm.cache_hit_tokens - hits_before >= 3 * (len(llm.tokenizer.encode(SHARED)) // 16) * 16
    fresh = LLM(str(model_dir), device="cpu", kv_cache_memory=64 << 20, enable_prefix_caching=False)
    try:
        assert generate(fresh, prompts) == cached
        assert fresh.engine.block_manager.cache_hit_tokens == 0
    finally:
        fresh.close()


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_preemption_and_chunked_prefill_give_the_same_tokens(llm, model_dir, overlap):
    expected = generate(llm, PROMPTS)
    # 12 blocks of 16 tokens cannot hold 8 sequences of ~40 tokens: the scheduler must preempt.
    tight = LLM(str(model_dir), device="cpu", num_kv_blocks=12, max_num_batched_tokens=16, max_num_seqs=8,
                overlap_scheduling=overlap)
    try:
        assert generate(tight, PROMPTS) == expected
        assert tight.engine.scheduler.num_preemptions > 0
    finally:
        tight.close()


def test_sampled_generation_with_seed_is_reproducible(llm):
    sp = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    first = generate(llm, PROMPTS[:3], sp)
    assert generate(llm, PROMPTS[:3], sp) == first
    assert generate(llm, PROMPTS[2:3], sp)[0] == first[2]  # a seeded request ignores its batch-mates


@pytest.mark.parametrize("prompt,sampling,field", [
    ("", GREEDY, "prompt"),
    ("hello " * 20000, GREEDY, "prompt"),
    ("hi", dict(max_tokens=0), "max_tokens"),
    ("hi", dict(temperature=-1.0), "temperature"),
    ("hi", dict(top_p=0.0), "top_p"),
    ("hi", dict(top_p=1.01), "top_p"),
])
def test_bad_input_names_the_field_and_the_engine_keeps_working(llm, prompt, sampling, field):
    with pytest.raises(InvalidRequest) as e:
        sp = SamplingParams(**sampling) if isinstance(sampling, dict) else sampling
        llm.generate([prompt], sp, use_tqdm=False)
    assert e.value.field == field
    assert all_blocks_free(llm) and not llm.engine.has_unfinished()
    assert len(generate(llm, ["still working?"], SamplingParams(max_tokens=3, temperature=0))[0]) >= 1


def test_token_ids_outside_the_vocabulary_are_refused(llm):
    with pytest.raises(InvalidRequest) as e:
        llm.generate([[1, 2, 10**9]], GREEDY, use_tqdm=False)
    assert e.value.field == "token_ids"


def test_missing_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        LLM(str(tmp_path / "nope"), device="cpu")


@pytest.mark.parametrize("overlap", [True, False])
def test_step_totals_count_the_work_the_router_sees(tiny_qwen3_dir, overlap):
    """The busy-step totals a worker puts in its heartbeats (and a benchmark diffs over a load point): every
    prompt token prefilled once, one decode token per generated token after the first (with overlap, at most
    one more per request: a step launched before its finish was known), no idle step counted."""
    llm = LLM(str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20, overlap_scheduling=overlap,
              enable_prefix_caching=False)
    try:
        prompts = [[1, 2, 3, 4, 5], list(range(10, 40)), [7] * 17]
        sampling = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        llm.generate(prompts, sampling, use_tqdm=False)
        totals, load = llm.engine.totals, llm.engine.load()
        assert totals.num_prefill_tokens == sum(map(len, prompts))
        assert 3 * 5 <= totals.num_decode_tokens <= 3 * 6
        assert 6 <= totals.steps <= 6 + 2 and totals.seconds > 0
        assert (load.busy_steps, load.decode_tokens_run) == (totals.steps, totals.num_decode_tokens)
        before = (totals.steps, totals.seconds)
        llm.engine.step()  # nothing to run: not a busy step, and not busy time
        assert (llm.engine.totals.steps, llm.engine.totals.seconds) == before
    finally:
        llm.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_prompt_steps_are_counted_apart_from_decode_only_ones(tiny_qwen3_dir, overlap):
    """A decode worker prefilling a prompt in chunks beside a running decode (--disagg-policy): its heartbeat
    counts the batches with prompt tokens, the steps that launched or collected one (with overlap, a chunk's cost
    falls in both) and their seconds, apart from the decode-only steps (router/disagg_policy.py's chunk cost)."""
    llm = LLM(str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20, overlap_scheduling=overlap,
              enable_prefix_caching=False)
    engine = llm.engine
    try:
        engine.scheduler.max_prefill_tokens = 8
        greedy = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
        engine.add_request("a", [1, 2, 3, 4, 5], greedy)
        for _ in range(4):
            engine.step()
        engine.add_request("b", list(range(10, 40)), SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        load, chunks = engine.load(), 1 + 4  # a's prompt, and b's 30 tokens 8 at a time
        assert load.prompt_batches == chunks
        assert chunks <= load.prompt_steps <= (2 * chunks if overlap else chunks)
        assert load.busy_steps - load.prompt_steps >= 10  # a decodes alone before and after b
        assert 0 < load.prompt_seconds < load.busy_seconds
    finally:
        llm.close()


def test_a_cpu_engine_never_imports_triton(tiny_qwen3_dir):
    """triton is imported only where a GPU kernel runs: a CPU engine, from its import to a generate, leaves it
    alone even where it is installed (a fresh interpreter: this one has imported it for the kernel tests)."""
    code = f"""
import sys
from common.engine.llm import LLM
from common.sampling_params import SamplingParams
llm = LLM({str(tiny_qwen3_dir)!r}, device="cpu", kv_cache_memory=16 << 20)
out = llm.generate(["hello"], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True), use_tqdm=False)
llm.close()
assert len(out[0].token_ids) == 3, out
print("triton imported:", "triton" in sys.modules)
"""
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "triton imported: False"


def test_a_seeded_request_resumed_from_its_prompt_and_first_tokens_goes_on_the_same(llm):
    """A migrated request (the prompt and the tokens already streamed, prefilled again) draws what the
    uninterrupted run drew: a seeded draw is a function of the seed and the position only."""
    sp = SamplingParams(max_tokens=12, temperature=0.9, top_k=40, seed=77, ignore_eos=True)
    prompt = llm.tokenizer.encode(PROMPTS[3])
    whole = generate(llm, [prompt], sp)[0]
    for k in (1, 5):
        rest = SamplingParams(max_tokens=12 - k, temperature=0.9, top_k=40, seed=77, ignore_eos=True)
        assert whole[:k] + generate(llm, [prompt + whole[:k]], rest)[0] == whole


class _EagerGraphs:
    """A stand-in for the decode CUDA graphs on the CPU: same buckets interface, each 'replay' an eager forward of
    the decodes alone. With it ModelRunner.execute takes its GPU path for steps that mix decodes and prompts."""

    def __init__(self, runner, sizes=(1, 2, 4, 8)):
        self.runner, self.sizes = runner, sizes

    def bucket(self, num_decodes: int, decode_only: bool) -> int | None:
        if not decode_only or num_decodes > self.sizes[-1]:
            return None
        return next(s for s in self.sizes if s >= num_decodes)

    def replay(self, inputs, bucket: int):
        assert inputs.attn.decode_only and bucket >= inputs.attn.num_decodes
        return self.runner._eager(inputs)


@pytest.mark.parametrize("overlap", [True, False])
def test_decodes_beside_prompts_run_apart_and_generate_the_same(tiny_qwen3_dir, overlap):
    """A step that mixes decodes with prompt chunks runs its decodes as a decode-only step (their CUDA graph on a
    GPU) and its prompts in a forward of their own: the tokens must be those of one forward over the whole step."""
    from common.engine.step_inputs import split_step

    llm = LLM(str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20, overlap_scheduling=overlap,
              enable_prefix_caching=False, max_num_batched_tokens=16, max_num_seqs=8)
    runner = llm.engine.runner
    prompts = [[1, 2, 3], list(range(10, 50)), [7] * 23, list(range(60, 65))]
    sampling = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    try:
        def staggered() -> list[list[int]]:
            engine, out = llm.engine, {}
            for i, prompt in enumerate(prompts):
                engine.add_request(f"s{i}", prompt, sampling)
                for _ in range(3):  # the next prompt arrives while this one decodes
                    for seq in engine.step():
                        out[seq.request_id] = seq.completion_token_ids
            while engine.has_unfinished():
                for seq in engine.step():
                    out[seq.request_id] = seq.completion_token_ids
            return [out[f"s{i}"] for i in range(len(prompts))]

        whole = staggered()
        runner.graphs = _EagerGraphs(runner)
        splits = []
        real_split = split_step

        def counting_split(inputs):
            splits.append(inputs.attn.num_decodes)
            return real_split(inputs)
        import common.engine.model_runner as model_runner
        model_runner.split_step, restore = counting_split, model_runner.split_step
        try:
            apart = staggered()
        finally:
            model_runner.split_step = restore
        assert splits and all(n >= 1 for n in splits)  # some steps did mix decodes with prompt chunks
        assert apart == whole and all(len(t) == 12 for t in apart)
    finally:
        runner.graphs = None
        llm.close()


def test_a_reservation_waits_for_the_blocks_a_step_in_flight_may_still_write(tiny_qwen3_dir):
    """With overlap, a sequence that finishes is freed while the next step is on the GPU. A reservation (blocks
    another process will write) gets only blocks no step in flight may still write; the next step's collection
    releases the rest."""
    llm = LLM(str(tiny_qwen3_dir), device="cpu", num_kv_blocks=8, block_size=16, enable_prefix_caching=False)
    engine = llm.engine
    try:
        engine.add_request("short", list(range(1, 41)), SamplingParams(max_tokens=2, ignore_eos=True))  # 3 blocks
        engine.add_request("long", list(range(50, 60)), SamplingParams(max_tokens=30, ignore_eos=True))  # 1 block
        while "short" in engine.requests:
            engine.step()
        assert engine.has_unfinished() and len(engine.block_manager.fenced) == 3  # "long"'s next step in flight
        assert engine.reserve("r", list(range(100, 170)), SamplingParams()) is None  # 5 blocks: 4 of 7 unfenced
        engine.step()
        assert engine.block_manager.fenced == {}
        assert len(engine.reserve("r", list(range(100, 170)), SamplingParams())) == 5
    finally:
        llm.close()
