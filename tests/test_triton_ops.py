"""Triton attention kernels vs torch_ops and vs a float64 reference on random paged layouts.

Tests taking the `device` fixture run on CUDA when there is a GPU. Without one they still run, on CPU in
Triton's interpreter: test_interpreter_suite re-runs this file in a subprocess with TRITON_INTERPRET=1
(it must be set before triton is imported). bf16 runs on GPU only: the interpreter's tl.dot gives
garbage for bf16 operands.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from tests.triton_interp import INTERPRETED, device, interpreter_suite  # noqa: F401 (device: a fixture)
from common.engine.attention import torch_ops

triton_ops = pytest.importorskip("common.engine.attention.triton_ops")
from common.engine.attention.decode_plan import PROGRAMS_PER_SM, plan_decode, plan_units, split_units  # noqa: E402

DTYPES = [torch.float16, torch.float32] + ([] if INTERPRETED else [torch.bfloat16])
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# (Hq, Hkv, D): GQA ratios 1, 2, 3 (SmolLM2) and 4.
HEADS = [(4, 4, 64), (4, 2, 128), (9, 3, 64), (16, 4, 128)]


def heads_id(heads: tuple[int, int, int]) -> str:
    return "hq{}-hkv{}-d{}".format(*heads)


STORE_CASES = [(HEADS[0], 16), (HEADS[1], 256), (HEADS[2], 16), (HEADS[3], 256)]

test_interpreter_suite = interpreter_suite(__file__, timeout=900)


@dataclass
class PagedKV:
    kv: torch.Tensor  # the whole pool [num_blocks, num_layers, 2, block_size, Hkv, D]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    keys: list[torch.Tensor]  # per sequence, dense [seq_len, Hkv, D]
    values: list[torch.Tensor]


def make_paged_kv(seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                  device: str, num_layers: int = 2, layer: int = 1) -> PagedKV:
    """A NaN-filled pool holding each sequence in shuffled blocks. Block 0 is never used: the tables'
    padding points there, so reading past a sequence's end or a padding entry produces NaN."""
    blocks = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks) + 4
    kv = torch.full((num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim), float("nan"),
                    dtype=dtype, device=device)
    k_cache, v_cache = kv[:, layer, 0], kv[:, layer, 1]
    ids = (torch.randperm(num_blocks - 1) + 1).to(device)
    tables = torch.zeros(len(seq_lens), max(blocks, default=0) + 3, dtype=torch.int32, device=device)
    keys, values, used = [], [], 0
    for i, (n, nb) in enumerate(zip(seq_lens, blocks)):
        tables[i, :nb] = ids[used:used + nb]
        used += nb
        k = torch.randn(n, num_kv_heads, head_dim, device=device).to(dtype)
        v = torch.randn(n, num_kv_heads, head_dim, device=device).to(dtype)
        pos = torch.arange(n, device=device)
        block = tables[i].long()[pos // block_size]
        k_cache[block, pos % block_size] = k
        v_cache[block, pos % block_size] = v
        keys.append(k)
        values.append(v)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return PagedKV(kv, k_cache, v_cache, tables, lens, keys, values)


def reference(q: torch.Tensor, q_lens: list[int], keys: list[torch.Tensor], values: list[torch.Tensor],
              scale: float, chunk: int = 512) -> torch.Tensor:
    """float64 attention from dense per-sequence K/V; query j of a sequence sees keys 0 .. L - q_len + j."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    start = 0
    for q_len, k, v in zip(q_lens, keys, values):
        group = q.shape[1] // k.shape[1]
        k = k.double().repeat_interleave(group, dim=1)
        v = v.double().repeat_interleave(group, dim=1)
        context = k.shape[0] - q_len
        for j0 in range(0, q_len, chunk):
            j1 = min(j0 + chunk, q_len)
            s = torch.einsum("qhd,khd->hqk", q[start + j0:start + j1].double(), k) * scale
            visible = torch.arange(k.shape[0], device=q.device)[None, :] <= \
                context + torch.arange(j0, j1, device=q.device)[:, None]
            p = s.masked_fill(~visible, float("-inf")).softmax(-1)
            out[start + j0:start + j1] = torch.einsum("hqk,khd->qhd", p, v)
        start += q_len
    return out


def random_q(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
             device: str) -> torch.Tensor:
    """q as the model makes it: a strided view into a packed qkv projection."""
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, device=device).to(dtype)
    return qkv[:, :num_heads]


def check(out: torch.Tensor, expected64: torch.Tensor, expected_torch: torch.Tensor) -> None:
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements not written (or NaN)"
    tol = TOL[out.dtype]
    torch.testing.assert_close(out.double(), expected64, atol=tol, rtol=tol)
    torch.testing.assert_close(out.float(), expected_torch.float(), atol=2 * tol, rtol=2 * tol)


def run_decode(seq_lens: list[int], heads: tuple[int, int, int], block_size: int, dtype: torch.dtype, device: str,
               **kwargs) -> None:
    num_heads, num_kv_heads, head_dim = heads
    paged = make_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, dtype, device)
    q = random_q(len(seq_lens), num_heads, num_kv_heads, head_dim, dtype, device)
    scale = head_dim ** -0.5
    out = torch.full_like(q, float("nan"))
    result = triton_ops.paged_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables,
                                               paged.seq_lens, scale, out=out, **kwargs)
    assert result is out
    expected = torch_ops.paged_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables,
                                                paged.seq_lens, scale)
    check(out, reference(q, [1] * len(seq_lens), paged.keys, paged.values, scale), expected)


def run_prefill(q_lens: list[int], seq_lens: list[int], heads: tuple[int, int, int], block_size: int,
                dtype: torch.dtype, device: str) -> None:
    num_heads, num_kv_heads, head_dim = heads
    paged = make_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, dtype, device)
    q = random_q(sum(q_lens), num_heads, num_kv_heads, head_dim, dtype, device)
    query_start_loc = torch.tensor([0, *q_lens], device=device).cumsum(0).to(torch.int32)
    scale = head_dim ** -0.5
    args = (q, paged.k_cache, paged.v_cache, query_start_loc, paged.seq_lens, paged.block_tables, max(q_lens), scale)
    out = torch.full_like(q, float("nan"))
    assert triton_ops.paged_prefill_attention(*args, out=out) is out
    check(out, reference(q, q_lens, paged.keys, paged.values, scale), torch_ops.paged_prefill_attention(*args))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("heads, block_size", STORE_CASES, ids=[f"{heads_id(h)}-bs{b}" for h, b in STORE_CASES])
def test_store_kvcache(device: str, heads: tuple[int, int, int], block_size: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    num_heads, num_kv_heads, head_dim = heads
    num_blocks, num_tokens = 6, 40
    kv = torch.full((num_blocks, 3, 2, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=device)
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, device=device).to(dtype)
    key, value = qkv[:, num_heads:num_heads + num_kv_heads], qkv[:, num_heads + num_kv_heads:]
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[::7] = -1
    expected = kv.clone()
    torch_ops.store_kvcache(key, value, expected[:, 2, 0], expected[:, 2, 1], slots)
    triton_ops.store_kvcache(key, value, kv[:, 2, 0], kv[:, 2, 1], slots)
    torch.testing.assert_close(kv, expected, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("heads", HEADS, ids=heads_id)
def test_decode(device: str, heads: tuple[int, int, int], block_size: int, dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    # Lengths around tile (32/64) and block (16/256) boundaries, and long enough to be split several ways.
    run_decode([1, 17, 63, 65, 300], heads, block_size, dtype, device)


@pytest.mark.parametrize("max_num_splits", [1, 3, 1000], ids=lambda n: f"splits{n}")
def test_decode_split_counts(device: str, max_num_splits: int) -> None:
    """Split counts from none to more than a short sequence has tiles, long and short sequences in one launch."""
    torch.manual_seed(2)
    run_decode([5, 2100, 300, 5000, 129], HEADS[2], 16, torch.float16, device, max_num_splits=max_num_splits)


def covered(table, lens: list[int]) -> None:
    """Every token of every sequence in exactly one unit, in order; the per-sequence rows agree; no unit empty."""
    used = int((table[0] >= 0).sum())
    assert (table[0, used:] == -1).all() and (table[1, :used] < table[2, :used]).all()
    for i, n in enumerate(lens):
        first, count = table[3, i], table[4, i]
        assert (count == 0) == (n == 0)
        assert (table[0, first:first + count] == i).all()
        ends = [0] + table[2, first:first + count].tolist()
        assert table[1, first:first + count].tolist() == ends[:-1] and ends[-1] == n


@pytest.mark.parametrize("lens, units, split", [
    ([400] * 15 + [8192], [3] * 15 + [43], True),  # the long one is cut as finely as the short ones
    ([500] * 63 + [32768], [1] * 63 + [47], True),  # was one program reading 32k tokens
    ([1024] * 64, [1] * 64, False),  # 512 programs fill one wave already: no split, no reduce
    ([520] * 64, [1] * 64, False),  # at one wave, 520 rounds to one unit: not 2 x 260
    ([4096] * 16, [6] * 16, True),
    ([4096] * 256, [1] * 256, False),
    ([1024], [16], True),  # few programs: cut down to one 64-token tile ...
    ([65536], [64], True),  # ... and at most 64 units a sequence
    ([100000] * 3, [33] * 3, True),
    ([40, 0, 7], [1, 0, 1], False),  # padding (0) gets no unit
])
def test_plan_cuts_units_of_a_wave_and_a_half(lens: list[int], units: list[int], split: bool) -> None:
    target = 4 * 132 // 8  # an H200, 8 KV heads
    table, got_split = plan_units(lens, target, len(lens) + split_units(target))
    assert got_split == split and (table is None) == (not split)  # no table: one unit a sequence
    if split:
        covered(table, lens)
        assert table[4, :len(lens)].tolist() == units


def test_plan_units_of_mixed_lengths_stay_near_the_mean() -> None:
    """Contexts of mixed lengths: no unit is much longer than the mean unit (the wave waits for the longest).
    Rounded to nearest at one wave, units ran up to 1.5x the mean."""
    rng = random.Random(0)
    lens = [rng.randint(341, 1707) for _ in range(48)]
    table, split = plan_units(lens, 66, 48 + split_units(66))
    covered(table, lens)
    used = int((table[0] >= 0).sum())
    sizes = table[2, :used] - table[1, :used]
    assert split and sizes.max() <= 1.35 * sum(lens) / used


def test_plan_pads_to_the_graph_batch() -> None:
    """A graph's bucket is wider than the batch: the extra entries have no units."""
    table, split = plan_units([5000, 3], 66, 16 + split_units(66))
    covered(table, [5000, 3] + [0] * 14)
    assert split and table.shape == (5, 16 + 99) and (table[4, 2:] == 0).all()


@pytest.mark.parametrize("lens", [[300, 2100, 5, 5000, 129], [200] * 9 + [9000], [100000, 1]])
@pytest.mark.parametrize("target", [5, 66, 1000])
def test_plan_never_exceeds_its_capacity(lens: list[int], target: int) -> None:
    table, split = plan_units(lens, target, len(lens) + split_units(target))  # asserts the capacity itself
    assert split
    covered(table, lens)


def test_decode_reduces_many_units(device: str) -> None:
    """A sequence cut into more units than the reduce kernel takes at once (16): combined over several passes."""
    torch.manual_seed(7)
    lens = [5, 5000, 2100]
    plan = plan_decode(lens, 3, torch.device(device), target=1000)
    assert plan.units[4, 1] > 16  # 5000 tokens in units of 192
    run_decode(lens, HEADS[2], 16, torch.float16, device, plan=plan)


LAUNCHES = [(32, 4, 2), (64, 4, 3), (128, 8, 4), (16, 2, 1)]  # (block_n, warps, stages)


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: "n{}-w{}-st{}".format(*l))
@pytest.mark.parametrize("target", [1, 3, 40], ids=lambda t: f"target{t}")
def test_decode_any_launch_and_plan_give_the_same_attention(device: str, launch: tuple[int, int, int],
                                                            target: int) -> None:
    """What a sweep may pick (scripts/bench_attention.py --sweep) changes speed, never the result."""
    torch.manual_seed(6)
    lens = [1, 70, 300, 129, 16]
    plan = plan_decode(lens, 2, torch.device(device), target=target)
    run_decode(lens, HEADS[1], 16, torch.float16, device, launch=triton_ops.DecodeLaunch(*launch), plan=plan)


@pytest.mark.parametrize("max_num_splits", [1, 8], ids=lambda n: f"splits{n}")
def test_decode_empty_sequence_gives_zero(device: str, max_num_splits: int) -> None:
    """A padded batch entry (seq_len 0, as in a CUDA-graph batch) must give 0, not NaN."""
    paged = make_paged_kv([40, 1], 2, 64, 16, torch.float16, device)
    seq_lens = torch.tensor([40, 0], dtype=torch.int32, device=device)
    q = random_q(2, 4, 2, 64, torch.float16, device)
    out = triton_ops.paged_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables, seq_lens, 0.125,
                                            max_num_splits=max_num_splits)
    assert (out[1] == 0).all()
    torch.testing.assert_close(out[:1].double(), reference(q[:1], [1], paged.keys[:1], paged.values[:1], 0.125),
                               atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("heads", HEADS, ids=heads_id)
def test_prefill(device: str, heads: tuple[int, int, int], block_size: int, dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    # q_len 1 alone and over a prefix, no prefix, a prefix ending just before a tile boundary (62),
    # one ending on a block boundary (256).
    q_lens = [1, 40, 1, 33, 20]
    seq_lens = [1, 40, 130, 95, 276]
    run_prefill(q_lens, seq_lens, heads, block_size, dtype, device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("heads", [(16, 8, 128), (32, 8, 128), (9, 3, 64)], ids=["qwen3-0.6b", "qwen3-8b", "smollm2"])
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_long_context(heads: tuple[int, int, int], block_size: int, dtype: torch.dtype) -> None:
    torch.manual_seed(4)
    run_decode([32768, 1, 4097, 20000, 31999, 512], heads, block_size, dtype, "cuda")
    run_prefill([1024, 1, 1, 2048, 300], [32768, 17000, 5, 2048, 9000], heads, block_size, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_cuda_graph() -> None:
    """Capture once; replays must follow new seq_lens, block_tables and plan tables written in place."""
    torch.manual_seed(5)
    (num_heads, num_kv_heads, head_dim), dtype, scale = (32, 8, 128), torch.bfloat16, 128 ** -0.5
    lens = [4096, 1, 700, 2000, 3, 4000, 4096, 1]
    paged = make_paged_kv(lens, num_kv_heads, head_dim, 16, dtype, "cuda")
    q = random_q(4, num_heads, num_kv_heads, head_dim, dtype, "cuda").contiguous()
    block_tables, seq_lens = paged.block_tables[:4].clone(), paged.seq_lens[:4].clone()
    plan = plan_decode(lens[:4], num_kv_heads, q.device)
    assert plan.split
    out = torch.empty_like(q)
    args = (q, paged.k_cache, paged.v_cache, block_tables, seq_lens, scale)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # compile outside the capture
        triton_ops.paged_decode_attention(*args, out=out, plan=plan)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        triton_ops.paged_decode_attention(*args, out=out, plan=plan)
    for rows in (slice(4, 8), slice(0, 4)):
        block_tables.copy_(paged.block_tables[rows])
        seq_lens.copy_(paged.seq_lens[rows])
        plan.units.copy_(plan_decode(lens[rows], num_kv_heads, q.device).units)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, reference(q, [1] * 4, paged.keys[rows], paged.values[rows], scale),
              torch_ops.paged_decode_attention(*args))


@pytest.mark.parametrize("heads", [(16, 8, 128), (32, 8, 128)], ids=["qwen3-0.6b", "qwen3-8b"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_kernel_holds_the_programs_a_wave_is_planned_for(heads: tuple[int, int, int]) -> None:
    """decode_plan sizes a wave at PROGRAMS_PER_SM programs an SM. A decode kernel whose registers or shared memory
    let an SM hold fewer turns an unsplit batch planned as one wave into two (docs/benchmarks.md, stop 43)."""
    hq, hkv, d = heads
    device = torch.device("cuda")
    # Dropped from memory, so the variants in the cache after are this test's launches even where others ran first
    triton_ops._decode_kernel.device_caches.clear()
    for split in (False, True):
        lens = [300, 40, 700, 5]
        kv = make_paged_kv(lens, hkv, d, 16, torch.bfloat16, "cuda")
        q = torch.randn(len(lens), hq, d, device=device, dtype=torch.bfloat16)
        plan = plan_decode(lens, hkv, device, target=1 if not split else 1000)
        assert plan.split == split
        triton_ops.paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, d ** -0.5,
                                          plan=plan)
    compiled = list(triton_ops._decode_kernel.device_caches[torch.cuda.current_device()][0].values())
    assert len(compiled) >= 2, "an unsplit and a split variant at least"
    props = torch.cuda.get_device_properties(device)
    registers_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    for kernel in compiled:
        threads = kernel.metadata.num_warps * 32
        assert PROGRAMS_PER_SM * kernel.n_regs * threads <= registers_per_sm, (
            f"{kernel.n_regs} registers a thread: fewer than {PROGRAMS_PER_SM} programs an SM")
        assert PROGRAMS_PER_SM * kernel.metadata.shared <= props.shared_memory_per_multiprocessor
