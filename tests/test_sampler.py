from __future__ import annotations

import pytest
import torch

from common.engine.layers.sampler import SamplingBatch, sample
from common.sampling_params import InvalidRequest, SamplingParams


def draw(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int | None] | None = None) -> torch.Tensor:
    gens = [None if s is None else torch.Generator().manual_seed(s) for s in (seeds or [None] * len(params))]
    return sample(logits, SamplingBatch.build(params, gens, logits.shape[-1], logits.device))


def test_temperature_zero_is_argmax():
    logits = torch.randn(6, 50)
    tokens = draw(logits, [SamplingParams(temperature=0)] * 6)
    assert torch.equal(tokens, logits.argmax(-1))


def test_greedy_rows_mixed_with_sampled_rows():
    logits = torch.randn(4, 50)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0)] * 2
    tokens = draw(logits, params)
    assert tokens[0] == logits[0].argmax() and tokens[2] == logits[2].argmax()


def test_top_k_one_is_argmax():
    logits = torch.randn(8, 100)
    assert torch.equal(draw(logits, [SamplingParams(temperature=2.0, top_k=1)] * 8), logits.argmax(-1))


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    tokens = draw(logits, [SamplingParams(top_p=0.6)] * 4000)
    seen = set(tokens.tolist())
    assert seen == {0, 1}  # 0.5 < 0.6, so token 1 (which crosses 0.6) stays; 2 and 3 go
    share = (tokens == 0).float().mean().item()
    assert abs(share - 0.5 / 0.8) < 0.04  # renormalised over the kept set


def test_tiny_top_p_keeps_the_top_token():
    logits = torch.randn(16, 30)
    assert torch.equal(draw(logits, [SamplingParams(top_p=1e-6)] * 16), logits.argmax(-1))


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    tokens = draw(probs.log().repeat(6000, 1), [SamplingParams()] * 6000)
    freq = torch.bincount(tokens, minlength=3).float() / 6000
    assert torch.allclose(freq, probs, atol=0.03)


def test_per_request_seed_is_reproducible_and_independent_of_the_batch():
    logits = torch.randn(1, 1000)
    alone = [draw(logits, [SamplingParams()], [123]).item() for _ in range(3)]
    assert len(set(alone)) == 1
    batched = draw(torch.cat([torch.randn(3, 1000), logits]), [SamplingParams()] * 4, [None, 7, None, 123])
    assert batched[3].item() == alone[0]
    others = {draw(logits, [SamplingParams()], [s]).item() for s in range(20)}
    assert len(others) > 1


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5),
    ("max_tokens", 0), ("max_tokens", -3), ("top_k", -2), ("seed", -1),
    # past what msgpack carries: a record the router could not send on
    ("max_tokens", 2**63), ("top_k", 10**20), ("stop_token_ids", [2**64]),
])
def test_invalid_sampling_params_name_the_field(field, value):
    with pytest.raises(InvalidRequest) as e:
        SamplingParams(**{field: value})
    assert e.value.field == field


def test_fused_cuda_sampler_gets_seeds_only_when_it_will_run():
    """Built for a CUDA device (with a host-only upload): the Philox seeds, and so the fused kernel, only
    for batches it serves; seeded rows get the same seed for the same position on every run."""
    pytest.importorskip("common.engine.layers.fused")
    cuda, host = torch.device("cuda"), (lambda t: t)

    def build(params, positions=(5, 9)):
        return SamplingBatch.build(params, [None] * len(params), 100, cuda, list(positions), host)
    assert build([SamplingParams(temperature=0)] * 2).seeds is None  # all greedy: argmax
    assert build([SamplingParams(), SamplingParams(top_p=0.9)]).seeds is None  # top-p: the torch path
    assert build([SamplingParams(), SamplingParams(top_k=5)]).seeds is None
    mixed = build([SamplingParams(temperature=0), SamplingParams(seed=3)])
    assert mixed.seeds is not None and mixed.seeds.shape == (2,)
    assert build([SamplingParams(seed=3)], [9]).seeds.tolist() == build([SamplingParams(seed=3)], [9]).seeds.tolist()
    assert build([SamplingParams(seed=3)], [9]).seeds.tolist() != build([SamplingParams(seed=3)], [10]).seeds.tolist()


def test_a_seeded_draw_depends_on_the_seed_and_the_position_only():
    """What lets a request moved mid-stream go on as it would have: the draw for position p of seed s is the
    same whatever was drawn before it, on whichever worker."""
    from common.engine.layers.sampler import seeded_generators
    logits = torch.randn(1, 1000)
    params = [SamplingParams(seed=5)]

    def at(position: int) -> int:
        gens = seeded_generators(params, [position], logits.device)
        return sample(logits, SamplingBatch.build(params, gens, 1000, logits.device, [position])).item()
    assert at(17) == at(17)
    assert len({at(p) for p in range(10, 30)}) > 1  # the position changes the draw
    assert seeded_generators([SamplingParams()], [3], logits.device) == [None]
