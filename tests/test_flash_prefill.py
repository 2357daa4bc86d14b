"""Fresh-prompt prefill attention (common/engine/attention/flash_prefill.py) against the torch reference: ragged
prompts, fewer KV heads than query heads (GQA), half precision on a GPU; elsewhere it is the reference itself."""
from __future__ import annotations

import pytest
import torch

from common.engine.attention import torch_ops
from common.engine.attention.flash_prefill import varlen_prefill

LENS = [1, 17, 300, 64, 1029]


def _packed(dtype: torch.dtype, device: str, heads: int, kv_heads: int, dim: int = 128):
    torch.manual_seed(0)
    total = sum(LENS)
    q = torch.randn(total, heads, dim, dtype=dtype, device=device)
    k = torch.randn(total, kv_heads, dim, dtype=dtype, device=device)
    v = torch.randn(total, kv_heads, dim, dtype=dtype, device=device)
    cu = torch.tensor([0] + LENS, device=device).cumsum(0).to(torch.int32)
    return q, k, v, cu


def test_off_the_gpu_it_is_the_reference() -> None:
    q, k, v, cu = _packed(torch.float32, "cpu", 4, 2, 16)
    torch.testing.assert_close(varlen_prefill(q, k, v, cu, max(LENS), 0.25),
                               torch_ops.varlen_attention(q, k, v, cu, 0.25), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("heads, kv_heads", [(16, 8), (32, 8), (8, 8)])
def test_gpu_flash_matches_the_reference(dtype: torch.dtype, heads: int, kv_heads: int) -> None:
    q, k, v, cu = _packed(dtype, "cuda", heads, kv_heads)
    scale = 128 ** -0.5
    got = varlen_prefill(q, k, v, cu, max(LENS), scale)
    want = torch_ops.varlen_attention(q.float(), k.float(), v.float(), cu, scale)
    assert got.shape == q.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
