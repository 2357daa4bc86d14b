"""Tensor parallelism on CPU (gloo): the same sharded layers and all-reduces the GPU runs over NCCL.

tiny-qwen3 has 4 query heads and 2 KV heads, so tp=4 needs KV-head replication (PITFALLS: fewer KV
heads than ranks), and tp=2 splits them.
"""
from __future__ import annotations

import threading

import pytest

from common.config import ConfigError, EngineConfig
from common.engine.llm import LLM
from common.sampling_params import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "1, 2, 3, 4, 5,"]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def run(model_dir, tp: int) -> tuple[list[list[int]], int]:
    llm = LLM(str(model_dir), device="cpu", tensor_parallel_size=tp, kv_cache_memory=16 << 20)
    try:
        tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        assert llm.engine.num_free_blocks == llm.engine.block_manager.num_blocks
        return tokens, llm.engine.block_manager.num_blocks
    finally:
        llm.close()


@pytest.fixture(scope="module")
def single(tiny_qwen3_dir):
    return run(tiny_qwen3_dir, 1)


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_equals_single_rank(tiny_qwen3_dir, single, tp):
    tokens, num_blocks = run(tiny_qwen3_dir, tp)
    assert tokens == single[0]
    # Each rank holds 1/tp of the KV heads (but at least one), so the same memory holds more blocks.
    assert num_blocks >= single[1]


def test_a_forward_outside_a_step_runs_on_every_rank(tiny_qwen3_dir, single):
    """The warm-up's forwards at each padded step size (`forward_fresh`; on a GPU, before `LLM(...)` returns) are
    sent to the other ranks too. Run by rank 0 alone, their all-reduces paired with the other ranks' wait for the
    next step, and the group hung (TP=2 on two H100s)."""
    llm = LLM(str(tiny_qwen3_dir), device="cpu", tensor_parallel_size=2, kv_cache_memory=16 << 20)
    result = {}

    def warm_then_generate() -> None:
        llm.engine.runner.forward_fresh(16)
        result["tokens"] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]

    thread = threading.Thread(target=warm_then_generate, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the tensor-parallel group hung"  # its ranks are daemons: they end with pytest
    try:
        assert result["tokens"] == single[0]
    finally:
        llm.close()


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_a_preempted_request_is_recomputed_as_a_prefill_on_every_rank(tiny_qwen3_dir, single, overlap: bool) -> None:
    """Four sequences of about 20 tokens cannot all hold 2 blocks of 16 in a pool of 5: the scheduler preempts. A
    preempted request comes back as a prefill of its prompt and tokens so far, with a fresh block table, and every
    rank must run it so: the tokens are those of one rank with room for all."""
    llm = LLM(str(tiny_qwen3_dir), device="cpu", tensor_parallel_size=2, num_kv_blocks=5, max_num_seqs=4,
              overlap_scheduling=overlap)
    try:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == single[0]
        assert llm.engine.scheduler.num_preemptions > 0
        assert llm.engine.num_free_blocks == llm.engine.block_manager.num_blocks
    finally:
        llm.close()


def _rank_with_half_the_memory(config: EngineConfig, rank: int, init_method: str) -> None:
    """A non-zero rank (its own process) whose device has half the KV memory rank 0 has."""
    from common.engine import llm_engine

    config.kv_cache_memory //= 2
    llm_engine._tp_worker(config, rank, init_method)


def test_every_rank_holds_the_kv_blocks_of_the_rank_with_the_least_memory(tiny_qwen3_dir, single,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank sizes its KV pool from its own memory, but rank 0 schedules one block table for all: the pool is the
    smallest rank's (all-reduce MIN), or a block id past a smaller rank's pool writes out of it."""
    from common.engine import llm_engine

    monkeypatch.setattr(llm_engine, "_tp_worker", _rank_with_half_the_memory)
    llm = LLM(str(tiny_qwen3_dir), device="cpu", tensor_parallel_size=2, kv_cache_memory=16 << 20)
    try:
        assert llm.engine.block_manager.num_blocks == (8 << 20) // llm.engine.runner.layout.block_bytes
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == single[0]
    finally:
        llm.close()


def test_tensor_parallel_size_must_divide_the_heads(tiny_qwen3_dir):
    """Refused before any rank starts, naming the flag."""
    with pytest.raises(ConfigError, match="tensor_parallel_size: 3 does not split 4 attention heads"):
        LLM(str(tiny_qwen3_dir), device="cpu", tensor_parallel_size=3, kv_cache_memory=16 << 20)


def test_cuda_is_checked_where_the_engine_runs_not_where_the_config_is_made(tiny_qwen3_dir):
    """`serve --device cuda` on a head node without a GPU must start; the engine itself refuses."""
    import torch

    from common.config import EngineConfig

    config = EngineConfig(model=str(tiny_qwen3_dir), device="cuda")  # a config alone is fine anywhere
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="device: cuda asked for but torch sees no CUDA device"):
        LLM.from_config(config)
