"""The flash_attn backend's side of the contract, with a stand-in `flash_attn` package.

flash-attn has no wheel for the GPU host's torch, so the real package never runs here. The stand-in has
flash-attn's documented signatures (`flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
max_seqlen_k, softmax_scale=, causal=)`, `flash_attn_with_kvcache(q [B, Sq, H, D], k_cache, v_cache,
cache_seqlens=, block_table=, softmax_scale=, causal=)`) and computes with torch_ops, checking what it is given:
these tests fail if the adapter passes the wrong shapes or arguments, or if `auto` ignores the package.
"""
from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path

import pytest
import torch

from common.engine.attention import choice as S
from common.engine.attention import torch_ops

CALLS: list[str] = []


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None, causal=False):
    assert causal and torch.equal(cu_seqlens_q, cu_seqlens_k) and max_seqlen_q == max_seqlen_k
    assert max_seqlen_q == int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    assert q.dim() == 3 and k.shape[1] <= q.shape[1]  # [T, H, D], GQA
    CALLS.append("varlen")
    return torch_ops.varlen_attention(q, k, v, cu_seqlens_q, softmax_scale)


def _with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None, causal=False):
    assert q.dim() == 4 and q.shape[1] == 1  # one new query per sequence
    assert block_table is not None and block_table.dtype == torch.int32 and k_cache.shape[1] % 256 == 0
    CALLS.append("kvcache")
    out = torch_ops.paged_decode_attention(q[:, 0], k_cache, v_cache, block_table, cache_seqlens, softmax_scale)
    return out.unsqueeze(1)


@pytest.fixture
def flash_attn(monkeypatch):
    module = types.ModuleType("flash_attn")
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    module.flash_attn_varlen_func, module.flash_attn_with_kvcache = _varlen, _with_kvcache
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    monkeypatch.delitem(sys.modules, "common.engine.attention.flash_attn_ops", raising=False)
    CALLS.clear()
    yield module


def paged(seq_lens: list[int], page: int, heads: int = 2, dim: int = 64):
    blocks = [-(-n // page) for n in seq_lens]
    k_cache, v_cache = torch.randn(2, sum(blocks) + 1, page, heads, dim)
    ids = torch.randperm(sum(blocks)) + 1
    table = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks):
        table[i, :nb] = ids[used:used + nb]
        used += nb
    return k_cache, v_cache, table, torch.tensor(seq_lens, dtype=torch.int32)


def backend(name: str = "flash_attn"):
    return S.create_backend(name, torch.device("cuda"), num_kv_heads=2)


def test_auto_picks_flash_attn_when_importable(flash_attn):
    assert S.resolve_backend("auto", "cuda") == "flash_attn"
    assert backend("auto").name == "flash_attn"
    assert S.resolve_backend("auto", "cpu") == "torch"
    assert S.create_backend("auto", torch.device("cpu"), num_kv_heads=2).name == "torch"


def test_prefill_and_decode_go_through_flash_attn_and_match_torch(flash_attn):
    torch.manual_seed(0)
    ops = backend().ops
    q, k, v = torch.randn(3, 11, 4, 64)
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    cu = torch.tensor([0, 5, 11], dtype=torch.int32)
    torch.testing.assert_close(ops.prefill(q, k, v, cu, 6, 0.125), torch_ops.varlen_attention(q, k, v, cu, 0.125))
    k_cache, v_cache, table, lens = paged([300, 7, 256], 256)
    qd = torch.randn(3, 4, 64)
    torch.testing.assert_close(ops.decode(qd, k_cache, v_cache, table, lens, 0.125),
                               torch_ops.paged_decode_attention(qd, k_cache, v_cache, table, lens, 0.125))
    assert CALLS == ["varlen", "kvcache"]


def test_decode_with_pages_flash_attn_cannot_take_falls_back_to_triton(flash_attn, monkeypatch):
    from common.engine.attention import triton_ops

    monkeypatch.setattr(triton_ops, "paged_decode_attention", lambda *a, **kw: "triton")
    k_cache, v_cache, table, lens = paged([40, 3], 16)
    assert backend().ops.decode(torch.randn(2, 4, 64), k_cache, v_cache, table, lens, 0.125) == "triton"
    assert CALLS == []


def test_flash_attn_is_never_a_dependency_nor_an_extra() -> None:
    """flash-attn builds only against an installed torch and fails in pip's isolated builds: neither the project's
    dependencies nor any of its extras may name it (README: install it yourself)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    assert not [r for r in wanted if r.lower().replace("_", "-").startswith("flash-attn")], wanted


def test_without_flash_attn_auto_picks_triton_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the package (the usual install) `auto` must still serve, on our own kernels."""
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # find_spec sees no flash_attn, whatever is installed
    assert S.resolve_backend("auto", "cuda") == "triton"
    assert S.resolve_backend("auto", "cpu") == "torch"
