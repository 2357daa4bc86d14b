"""EngineConfig's defaults that depend on the device: a step's token budget is smaller on CPU, where one step of
8192 prompt tokens takes minutes (the router still hears the worker: common/worker/liveness.py)."""
from __future__ import annotations

import pytest

from common.config import STEP_TOKENS, ConfigError, EngineConfig


def test_the_step_budget_defaults_by_device_once_the_device_is_known(tiny_qwen3_dir):
    model = str(tiny_qwen3_dir)
    assert EngineConfig(model=model, device="cpu").max_num_batched_tokens == STEP_TOKENS["cpu"] == 512
    assert EngineConfig(model=model, device="cuda").max_num_batched_tokens == STEP_TOKENS["cuda"] == 8192
    auto = EngineConfig(model=model)
    assert auto.max_num_batched_tokens is None
    assert auto.on_device("cpu").max_num_batched_tokens == 512
    assert auto.on_device("cuda").max_num_batched_tokens == 8192
    assert EngineConfig(model=model, device="cpu", max_num_batched_tokens=4096).max_num_batched_tokens == 4096


def test_a_step_budget_below_the_batch_is_refused_once_known(tiny_qwen3_dir):
    with pytest.raises(ConfigError, match="max_num_batched_tokens: must be positive"):
        EngineConfig(model=str(tiny_qwen3_dir), device="cpu", max_num_batched_tokens=0)
    with pytest.raises(ConfigError, match="at least max_num_seqs"):
        EngineConfig(model=str(tiny_qwen3_dir), max_num_seqs=1024).on_device("cpu")


@pytest.mark.parametrize("name", ["cuda_graph_max_bs", "prefill_graph_max_tokens"])
def test_graph_limits_take_zero_for_none_and_refuse_negatives(tiny_qwen3_dir, name):
    assert getattr(EngineConfig(model=str(tiny_qwen3_dir), **{name: 0}), name) == 0
    with pytest.raises(ConfigError, match=f"{name}: must be 0 or more, got -1"):
        EngineConfig(model=str(tiny_qwen3_dir), **{name: -1})


def test_prompt_graphs_cover_the_whole_step_budget_by_default(tiny_qwen3_dir):
    """An eager prompt step holds its worker's loop for the host's launches (docs/benchmarks.md, stop 56): by default
    every step size replays a graph."""
    from common.engine.prefill_graph import prefill_graph_sizes
    from common.engine.step_sizes import token_buckets

    cfg = EngineConfig(model=str(tiny_qwen3_dir)).on_device("cuda")
    assert cfg.prefill_graph_max_tokens is None
    assert prefill_graph_sizes(cfg.max_num_batched_tokens, cfg.prefill_graph_max_tokens) == token_buckets(
        cfg.max_num_batched_tokens)
