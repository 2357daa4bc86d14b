"""The LM head and the one-pass sampler in one kernel (common/engine/layers/head_sampler.py) against the head's
logits sampled by fused.gumbel_argmax: the same tokens, greedy and drawn.

Without a GPU the kernels run in Triton's interpreter on CPU (float32; tests/triton_interp.py). The inputs are
-1, 0 and 1, so every logit is a small integer, exact in bf16 whatever order a GEMM sums in: both paths see the
same logits, many of them tied (a greedy row takes the first).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.triton_interp import INTERPRETED, device, interpreter_suite  # noqa: F401 (device: a fixture)

head_sampler = pytest.importorskip("common.engine.layers.head_sampler")
fused = pytest.importorskip("common.engine.layers.fused")

test_interpreter_suite = interpreter_suite(__file__, timeout=600)
DTYPE = torch.float32 if INTERPRETED else torch.bfloat16


def ternary(*shape: int, seed: int) -> torch.Tensor:
    return torch.randint(-1, 2, shape, generator=torch.Generator().manual_seed(seed)).to(DTYPE)


def sampling(rows: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    temps = torch.tensor([0.0, 0.7, 1.0, 1.5] * rows)[:rows].to(device)
    return temps, (torch.arange(rows, dtype=torch.int64) * 7919 + 11).to(device)


@pytest.mark.parametrize("rows, vocab, hidden, vocab_size", [
    (1, 1000, 64, 1000),
    (13, 777, 128, 777),  # a partial vocabulary tile
    (64, 2050, 64, 2047),  # a whole row tile; the weight padded past the vocabulary (tensor-parallel padding)
])
def test_head_sampler_draws_the_tokens_of_the_head_then_the_sampler(device: str, rows: int, vocab: int, hidden: int,
                                                                    vocab_size: int) -> None:
    h, w = ternary(rows, hidden, seed=rows).to(device), ternary(vocab, hidden, seed=vocab).to(device)
    logits = (h.float() @ w.float().T)[:, :vocab_size].to(DTYPE)
    temps, seeds = sampling(rows, device)
    want = fused.gumbel_argmax(logits, temps, seeds).cpu()
    static = torch.full((rows + 2,), -1, dtype=torch.int64, device=device)  # a graph's buffer, longer than the batch
    got = head_sampler.sample(h, w, temps, seeds, out=static[:rows], vocab_size=vocab_size)
    assert got.data_ptr() == static.data_ptr() and static[rows:].tolist() == [-1, -1]
    assert got.cpu().tolist() == want.tolist()
    greedy = (temps == 0).cpu()
    assert got.cpu()[greedy].tolist() == logits.float().cpu().argmax(-1)[greedy].tolist()
    assert int(got.max()) < vocab_size


def test_draws_follow_softmax_over_temperature(device: str) -> None:
    """A hidden row against a head whose logits are log([0.6, 0.3, 0.1]) (a one-hot row times log-probability
    columns): the drawn tokens' frequencies are those probabilities, and the same seeds draw the same tokens."""
    probs = torch.tensor([0.6, 0.3, 0.1])
    rows = 256 if INTERPRETED else 2048
    h = torch.zeros(rows, 64, dtype=DTYPE)
    h[:, 0] = 1
    w = torch.zeros(3, 64)
    w[:, 0] = probs.log()
    h, w = h.to(device), w.to(DTYPE).to(device)
    temps = torch.ones(rows, device=device)
    seeds = torch.arange(rows, dtype=torch.int64, device=device) * 7919
    got = head_sampler.sample(h, w, temps, seeds).cpu()
    freq = torch.bincount(got, minlength=3).float() / rows
    assert torch.allclose(freq, probs, atol=0.1 if INTERPRETED else 0.04), freq
    assert torch.equal(head_sampler.sample(h, w, temps, seeds).cpu(), got)


@pytest.mark.parametrize("rows, hidden", [(1, 128), (64, 128), (65, 128), (8, 160)])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_lm_head_samples_a_decode_batch_in_one_kernel(rows: int, hidden: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`ParallelLMHead.sample_one_pass`: up to MAX_ROWS rows through the one kernel, more (or a hidden size not in
    whole K steps) through the logits; the same tokens either way."""
    from common.engine.layers.embedding import ParallelLMHead
    head = ParallelLMHead(1003, hidden).cuda()
    head.weight.data = ternary(1003, hidden, seed=1).cuda()
    calls = []
    real = head_sampler.sample
    monkeypatch.setattr(head_sampler, "sample", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    h = ternary(rows, hidden, seed=rows).cuda()
    temps, seeds = sampling(rows, "cuda")
    out = torch.empty(rows, dtype=torch.int64, device="cuda")
    got = head.sample_one_pass(h, temps, seeds, out).cpu()
    assert got.tolist() == fused.gumbel_argmax(F.linear(h, head.weight), temps, seeds).cpu().tolist()
    assert bool(calls) == (rows <= head_sampler.MAX_ROWS and hidden % head_sampler.BLOCK_K == 0)

