"""Triton fusions (common/engine/layers/fused.py) against the torch layers they replace.

Without a GPU they run in Triton's interpreter on CPU (a subprocess with TRITON_INTERPRET=1, as in
test_triton_ops.py); bf16 runs on GPU only.
"""
from __future__ import annotations

import pytest
import torch

from tests.triton_interp import INTERPRETED, device, interpreter_suite  # noqa: F401 (device: a fixture)

fused = pytest.importorskip("common.engine.layers.fused")
gemv = pytest.importorskip("common.engine.layers.gemv")
splitk = pytest.importorskip("common.engine.layers.splitk")

from common.engine.layers.activation import SiluAndMul  # noqa: E402
from common.engine.layers.linear import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from common.engine.layers.norm import RMSNorm  # noqa: E402
from common.engine.layers.rotary import RotaryEmbedding  # noqa: E402

DTYPES = [torch.float32, torch.float16] + ([] if INTERPRETED else [torch.bfloat16])
# One rounding step of the dtype: fused and torch may round an intermediate differently.
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}

test_interpreter_suite = interpreter_suite(__file__, timeout=600)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = TOL[got.dtype]
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=tol * 4, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [64, 1024, 576])  # 576: SmolLM2's hidden size, not a power of two
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(device: str, dtype: torch.dtype, n: int, with_residual: bool) -> None:
    torch.manual_seed(0)
    norm = RMSNorm(n, 1e-6)
    norm.weight.data = torch.randn(n).to(dtype)
    x = torch.randn(37, n).to(dtype)
    residual = torch.randn(37, n).to(dtype) if with_residual else None
    want = norm(x, residual.clone()) if with_residual else norm(x)
    res_dev = residual.to(device) if with_residual else None
    got = fused.rms_norm(x.to(device), norm.weight.to(device), 1e-6, res_dev)
    if with_residual:
        close(got[0], want[0])
        assert got[1] is res_dev
        close(res_dev, want[1])  # the residual was updated in place to x + residual
    else:
        close(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", [(16, 8, 128), (9, 3, 64)], ids=["qwen3", "smollm2"])
@pytest.mark.parametrize("with_norm", [True, False])
def test_qk_norm_rope(device: str, dtype: torch.dtype, heads: tuple[int, int, int], with_norm: bool) -> None:
    torch.manual_seed(0)
    hq, hkv, d = heads
    rope = RotaryEmbedding(d, 4096, 1e6, None)
    q_norm, k_norm = RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
    q_norm.weight.data, k_norm.weight.data = torch.randn(d).to(dtype), torch.randn(d).to(dtype)
    norms = (q_norm, k_norm) if with_norm else (None, None)
    qkv = torch.randn(23, (hq + 2 * hkv) * d).to(dtype)
    positions = torch.randint(0, 4096, (23,))
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    want_q, want_k = rope(positions, q.view(-1, hq, d), k.view(-1, hkv, d), *norms)
    qkv_dev = qkv.to(device)
    v_before = qkv_dev[:, (hq + hkv) * d:].clone()
    q, k, v = qkv_dev.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(-1, hq, d), k.view(-1, hkv, d)
    norms = (q_norm.weight.to(device), k_norm.weight.to(device)) if with_norm else (None, None)
    fused.qk_norm_rope_(q, k, positions.to(device), rope.cos_sin.to(device), *norms, 1e-6)
    close(q, want_q)
    close(k, want_k)
    assert torch.equal(v, v_before)  # v shares the buffer and is left alone


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads, block_size", [((16, 8, 128), 16), ((9, 3, 64), 256)], ids=["qwen3", "smollm2"])
@pytest.mark.parametrize("with_norm", [True, False])
def test_qk_norm_rope_writes_the_kv_cache(device: str, dtype: torch.dtype, heads: tuple[int, int, int],
                                          block_size: int, with_norm: bool) -> None:
    """The fused kernel's cache write equals the torch rope + store_kvcache path: rotated k and raw v at each
    token's slot, nothing for slot -1, every other slot untouched (NaN stays NaN)."""
    from common.engine.attention import torch_ops

    torch.manual_seed(1)
    hq, hkv, d = heads
    t = 21
    rope = RotaryEmbedding(d, 4096, 1e6, None)
    norms = (RMSNorm(d, 1e-6), RMSNorm(d, 1e-6))
    for norm in norms:
        norm.weight.data = torch.randn(d).to(dtype)
    qkv = torch.randn(t, (hq + 2 * hkv) * d).to(dtype)
    positions = torch.randint(0, 4096, (t,))
    num_blocks = 2 * (-(-t // block_size)) + 1
    pool = torch.full((num_blocks, 2, 2, block_size, hkv, d), float("nan"), dtype=dtype)  # a layer's view is strided
    slots = torch.randperm(num_blocks * block_size)[:t]
    slots[::5] = -1
    want_pool = pool.clone()
    q, k, v = (x.view(t, -1, d) for x in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))
    want_q, want_k = rope(positions, q, k, *(norms if with_norm else (None, None)))
    torch_ops.store_kvcache(want_k, v, want_pool[:, 1, 0], want_pool[:, 1, 1], slots)

    qkv_dev, pool_dev = qkv.to(device), pool.to(device)
    q, k, v = (x.view(t, -1, d) for x in qkv_dev.split([hq * d, hkv * d, hkv * d], dim=-1))
    weights = [n.weight.to(device) for n in norms] if with_norm else [None, None]
    fused.qk_norm_rope_(q, k, positions.to(device), rope.cos_sin.to(device), *weights, 1e-6, v,
                        pool_dev[:, 1, 0], pool_dev[:, 1, 1], slots.to(device))
    close(q, want_q)
    close(k, want_k)
    got, want = pool_dev.cpu(), want_pool
    assert torch.equal(got.isnan(), want.isnan())  # written exactly where torch wrote, nowhere else
    close(torch.nan_to_num(got), torch.nan_to_num(want))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [96, 3072, 1536])
def test_silu_and_mul(device: str, dtype: torch.dtype, n: int) -> None:
    torch.manual_seed(0)
    x = (3 * torch.randn(19, 2 * n)).to(dtype)
    close(fused.silu_and_mul(x.to(device)), SiluAndMul()(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(64, 32), (24, 48), (1024, 576)], ids=["pow2", "odd", "smollm2-o"])
@pytest.mark.parametrize("rows", range(1, gemv.MAX_ROWS + 1))
def test_gemv_matches_linear(device: str, dtype: torch.dtype, shape: tuple[int, int], rows: int) -> None:
    torch.manual_seed(rows)
    n, k = shape
    w, b = (torch.randn(n, k) / k ** 0.5).to(dtype), torch.randn(n).to(dtype)
    x, gate_up = torch.randn(rows, k).to(dtype), (3 * torch.randn(rows, 2 * k)).to(dtype)
    assert gemv.fits(x, w)
    wd, bd = w.to(device), b.to(device)
    close(gemv.gemv(x.to(device), wd), torch.nn.functional.linear(x, w))
    close(gemv.gemv(x.to(device), wd, bd), torch.nn.functional.linear(x, w, b))
    # with silu: SiLU-and-mul of [gate | up] as it loads x, rounded as the separate kernel rounds
    close(gemv.gemv(gate_up.to(device), wd, silu=True), torch.nn.functional.linear(SiluAndMul()(gate_up), w))


@pytest.mark.parametrize("dtype", [torch.float16] if INTERPRETED else list(splitk.HALF), ids=str)
@pytest.mark.parametrize("rows", [1, 3, 37, splitk.MAX_ROWS])
def test_split_k_matches_linear(device: str, dtype: torch.dtype, rows: int) -> None:
    """Every row of a decode batch (the row tile masked past it), the K chunks' float32 parts summed once."""
    torch.manual_seed(rows)
    n, k = 128, 3 * splitk.BLOCK_K
    w, x = (torch.randn(n, k) / k ** 0.5).to(dtype), torch.randn(rows, k).to(dtype)
    assert splitk.fits(x, w)
    close(splitk.linear(x.to(device), w.to(device)), torch.nn.functional.linear(x.float(), w.float()).to(dtype))


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_sums_a_projections_partial_sums(device: str, with_residual: bool) -> None:
    """o and down hand the add+RMSNorm their K chunks' parts: it must norm what the summed projection would give,
    to the bit, on the GPU and through the torch path (PartialSums.total) alike."""
    torch.manual_seed(1)
    rows, n, k = 5, 128, 3 * splitk.BLOCK_K
    w, x = (torch.randn(n, k) / k ** 0.5).half().to(device), torch.randn(rows, k).half().to(device)
    norm = RMSNorm(n, 1e-6).half().to(device)
    norm.weight.data = torch.randn(n).half().to(device)
    residual = torch.randn(rows, n).half().to(device) if with_residual else None
    parts = splitk.linear(x, w, summed=False)
    summed = splitk.linear(x, w)
    assert parts.shape == summed.shape and torch.equal(parts.total(), summed)

    def normed(inp):
        if residual is None:
            return fused.rms_norm(inp, norm.weight, 1e-6)
        return fused.rms_norm(inp, norm.weight, 1e-6, residual.clone())
    got, want = normed(parts), normed(summed)
    for g, w_ in zip(got, want) if with_residual else [(got, want)]:
        assert torch.equal(g, w_)
    on_cpu = RMSNorm(n, 1e-6).half()
    on_cpu.weight.data = norm.weight.cpu()
    cpu_parts = type(parts)(parts.parts.cpu(), parts.rows, parts.dtype)
    cpu_got = on_cpu(cpu_parts, residual.cpu().clone()) if with_residual else on_cpu(cpu_parts)
    close(cpu_got[0] if with_residual else cpu_got, (want[0] if with_residual else want))


def test_split_k_serves_a_decode_batch_through_a_weight_of_few_outputs() -> None:
    def half(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=torch.bfloat16)

    w, k = half(1024, 2048), 2048
    assert splitk.fits(half(splitk.MAX_ROWS, k), w) and splitk.fits(half(3, k), w)
    assert not splitk.fits(half(splitk.MAX_ROWS + 1, k), w)  # a prompt step: cuBLAS
    assert not splitk.fits(half(0, k), w)
    assert not splitk.fits(half(8, 4096), half(4096, 4096))  # wider than measured (Qwen3-8B): cuBLAS
    assert not splitk.fits(half(8, 1024), half(576, 1024))  # not a power of two (SmolLM2)
    assert not splitk.fits(half(8, 1000), half(1024, 1000))  # K not in whole chunks
    assert not splitk.fits(half(8, 2 * k)[:, ::2], w)  # strided rows
    assert not splitk.fits(torch.empty(8, k, dtype=torch.float32), w.float())  # 4-byte tiles: cuBLAS


def test_gemv_serves_only_a_few_rows_of_a_weight_it_can_hold() -> None:
    w = torch.empty(64, 1024)
    assert gemv.fits(torch.empty(gemv.MAX_ROWS, 1024), w)
    assert not gemv.fits(torch.empty(gemv.MAX_ROWS + 1, 1024), w)
    assert not gemv.fits(torch.empty(0, 1024), w)
    assert not gemv.fits(torch.empty(1, 4 * gemv.SLICE_ELEMENTS), torch.empty(64, 4 * gemv.SLICE_ELEMENTS))
    assert not gemv.fits(torch.empty(1, 2048)[:, ::2], w)  # strided rows


def test_empty_batch(device: str) -> None:
    x = torch.empty(0, 64, device=device)
    assert fused.rms_norm(x, torch.ones(64, device=device), 1e-6).shape == (0, 64)
    assert fused.silu_and_mul(torch.empty(0, 128, device=device)).shape == (0, 64)


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=str)
def test_layers_dispatch_to_fused_on_cuda(device: str, dtype: torch.dtype) -> None:
    """The modules pick the fused path for CUDA tensors and still match their own CPU results."""
    if device != "cuda":
        pytest.skip("dispatch happens for CUDA tensors only")
    torch.manual_seed(0)
    norm = RMSNorm(1024, 1e-6)
    norm.weight.data = torch.randn(1024).to(dtype)
    x, r = torch.randn(8, 1024).to(dtype), torch.randn(8, 1024).to(dtype)
    want = norm(x, r.clone())
    got = norm.cuda()(x.cuda(), r.cuda())
    close(got[0], want[0])
    close(got[1], want[1])
    up, down = ColumnParallelLinear(1024, 512).to(dtype), RowParallelLinear(256, 1024).to(dtype)
    for p in (up.weight, down.weight):
        p.data = (torch.randn(p.shape) / p.shape[1] ** 0.5).to(dtype)
    for rows in (1, gemv.MAX_ROWS, gemv.MAX_ROWS + 1):  # gemv, then cuBLAS
        h = up.cuda()(x[:rows].cuda())
        close(h, up.cpu()(x[:rows]))
        close(down.cuda()(h, silu_and_mul=True), down.cpu()(h.cpu(), silu_and_mul=True))


def test_gumbel_argmax_greedy_rows_are_argmax(device: str) -> None:
    torch.manual_seed(0)
    logits = torch.randn(9, 5000)  # not a multiple of the 4096 block
    logits[3, 4999] = 50.0  # the maximum in the last, partial block
    logits[2] = 1.0  # ties everywhere: the first index, as torch.argmax
    logits[4, 100] = logits[4, 3000] = logits[4, 2100] = 60.0  # equal maxima in other lanes and chunks
    temps = torch.tensor([0.0, 1.0] * 4 + [0.0])
    seeds = torch.arange(9, dtype=torch.int64)
    out = fused.gumbel_argmax(logits.to(device), temps.to(device), seeds.to(device)).cpu()
    greedy = temps == 0
    assert torch.equal(out[greedy], logits.argmax(-1)[greedy])
    assert out[3] == 4999 and out[2] == 0 and out[4] == 100


def test_gumbel_argmax_follows_the_distribution_and_its_seeds(device: str) -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    rows = 1000 if INTERPRETED else 4000  # the interpreter runs one program at a time
    logits = probs.log().repeat(rows, 1).to(device)
    temps = torch.ones(rows, device=device)
    seeds = torch.arange(rows, dtype=torch.int64, device=device) * 7919
    out = fused.gumbel_argmax(logits, temps, seeds).cpu()
    freq = torch.bincount(out, minlength=3).float() / rows
    assert torch.allclose(freq, probs, atol=0.05), freq
    assert torch.equal(fused.gumbel_argmax(logits, temps, seeds).cpu(), out)  # same seeds, same tokens
    static = torch.full((rows + 3,), -1, dtype=torch.int64, device=device)  # a graph's buffer, longer than the batch
    assert fused.gumbel_argmax(logits, temps, seeds, out=static[:rows]).data_ptr() == static.data_ptr()
    assert torch.equal(static[:rows].cpu(), out) and static[rows:].tolist() == [-1] * 3
    hot = fused.gumbel_argmax(logits, temps * 1e6, seeds).cpu()  # a huge temperature flattens it
    assert (torch.bincount(hot, minlength=3).float() / rows).min() > 0.25
