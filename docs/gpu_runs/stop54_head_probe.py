"""Probe (stop 54, issue 20): the fused LM head and sampler (common/engine/layers/head_sampler.py) reads Qwen3-0.6B's
311 MB head at 64 rows in about 95 us (stop 46), against about 74 us for as many bytes at the copy rate. Variants:

- `engine`: the engine's kernel (four accumulators of 32 columns, entries 4i+j apart, one Philox call for four);
- `one`: one accumulator of the tile's 128 columns in order, one dot a K step; the four uniforms of each Philox
  call interleaved into column order (tl.join), so the tokens are the engine's;
- `one+tma`: the same with the weight tile loaded by the tensor memory accelerator (a host tensor descriptor);
- `one, K 128` and other tilings; `greedy` (no noise: the bound of the noise's cost).

`--kernels`: each alone from a CUDA graph of 20 launches, us a launch, alternated, two rounds, and the tokens of
each variant against the engine's on 20 draws. `--step`: the decode step (bench_engine's, Qwen3-0.6B, context 1,024,
CUDA graphs, warm) with the engine's kernel and with each of `--step-variants`, alternated, three rounds.

    python docs/gpu_runs/stop54_head_probe.py --kernels --step [--batches 1,8,64]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.engine.layers import fused, head_sampler  # noqa: E402
from stop46_head_sampler_probe import graph_us  # noqa: E402 (stop 46's timing, to compare with its figures)

VOCAB, HIDDEN = 151936, 1024


@triton.jit
def _noise(seeds_ptr, rows, row_mask, inv_temp, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROUNDS: tl.constexpr):
    """fused.gumbel_score's noise term for the tile, columns in order (column 4i + j: Philox call i's j-th uniform)."""
    Q: tl.constexpr = BLOCK_N // 4
    seed = tl.load(seeds_ptr + rows, mask=row_mask, other=0)[:, None]
    counter = tl.program_id(1) * Q + tl.arange(0, Q)
    i0, i1, i2, i3 = tl.randint4x(seed, counter[None, :], ROUNDS)
    u0, u1, u2, u3 = (tl.uint_to_uniform_float(i0), tl.uint_to_uniform_float(i1), tl.uint_to_uniform_float(i2),
                      tl.uint_to_uniform_float(i3))
    u = tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), [BLOCK_M, BLOCK_N])
    return fused.gumbel_score(tl.zeros_like(u), u, inv_temp)


@triton.jit
def _head_one_kernel(h_ptr, w_ptr, w_desc, temps_ptr, seeds_ptr, best_ptr, best_idx_ptr, M, stride_h, stride_best,
                     V: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, TMA: tl.constexpr, NOISE: tl.constexpr, EARLY: tl.constexpr = False,
                     ROUNDS: tl.constexpr = 10):
    Q: tl.constexpr = BLOCK_N // 4
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    n0 = tl.program_id(1) * BLOCK_N
    col = n0 + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    h = h_ptr + rows[:, None].to(tl.int64) * stride_h + ks[None, :]
    w = w_ptr + col[None, :].to(tl.int64) * K + ks[:, None]
    inv_temp = fused.inverse_temperature(tl.load(temps_ptr + rows, mask=row_mask, other=0.0)[:, None])
    if EARLY:  # the noise's math before the weight stream, the same numbers
        g = _noise(seeds_ptr, rows, row_mask, inv_temp, BLOCK_M, BLOCK_N, ROUNDS)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(h + k, mask=row_mask[:, None], other=0.0)
        if TMA:
            wt = w_desc.load([n0, k]).T
        else:
            wt = tl.load(w + k, mask=(col < V)[None, :], other=0.0)
        acc = tl.dot(x, wt, acc)
    x = acc.to(h_ptr.dtype.element_ty).to(tl.float32)
    if NOISE:
        if not EARLY:
            g = _noise(seeds_ptr, rows, row_mask, inv_temp, BLOCK_M, BLOCK_N, ROUNDS)
        x = tl.where(inv_temp > 0, x * inv_temp + g, x)
    s = tl.where(col[None, :] < V, x, float("-inf"))
    m = tl.max(s, axis=1)
    first = tl.min(tl.where(s == m[:, None], col[None, :], V), axis=1)
    first = tl.where(first == V, n0, first)
    tl.store(best_ptr + rows * stride_best + tl.program_id(1), m, mask=row_mask)
    tl.store(best_idx_ptr + rows * stride_best + tl.program_id(1), first.to(tl.int64), mask=row_mask)


def head_one(h, w, temps, seeds, out=None, tma: bool = False, noise: bool = True, block_n: int = 128,
             block_k: int = 64, warps: int = 4, stages: int = 3, vocab: int | None = None, early: bool = False,
             rounds: int = 10):
    rows, k = h.shape
    vocab = vocab or w.shape[0]
    bm = min(64, max(16, triton.next_power_of_2(rows)))
    tiles = triton.cdiv(vocab, block_n)
    best = torch.empty(rows, tiles, dtype=torch.float32, device=h.device)
    best_idx = torch.empty(rows, tiles, dtype=torch.int64, device=h.device)
    desc = None
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        desc = TensorDescriptor.from_tensor(w, block_shape=[block_n, block_k])
    _head_one_kernel[(triton.cdiv(rows, bm), tiles)](
        h, w, desc, temps, seeds, best, best_idx, rows, h.stride(0), best.stride(0), V=vocab, K=k, BLOCK_M=bm,
        BLOCK_N=block_n, BLOCK_K=block_k, TMA=tma, NOISE=noise, EARLY=early, ROUNDS=rounds, num_warps=warps,
        num_stages=stages)
    return fused.first_best(best, best_idx, out)


def inputs(rows: int, seed: int = 0, device: str = "cuda", vocab: int = VOCAB, hidden: int = HIDDEN):
    g = torch.Generator(device=device).manual_seed(seed)
    w = (torch.randn(vocab, hidden, device=device, generator=g) * 0.05).bfloat16()
    h = torch.randn(rows, hidden, device=device, generator=g).bfloat16()
    temps = torch.tensor([0.0, 0.7, 1.0, 1.3], device=device).repeat(rows)[:rows].contiguous()
    seeds = torch.arange(rows, device=device, dtype=torch.int64) * 7919 + seed
    return w, h, temps, seeds


VARIANTS = {
    "engine": lambda h, w, t, s, o: head_sampler.sample(h, w, t, s, o),
    "one": lambda h, w, t, s, o: head_one(h, w, t, s, o),
    "one+tma": lambda h, w, t, s, o: head_one(h, w, t, s, o, tma=True),
    "one, K 128": lambda h, w, t, s, o: head_one(h, w, t, s, o, block_k=128, stages=2),
    "one+tma, K 128": lambda h, w, t, s, o: head_one(h, w, t, s, o, tma=True, block_k=128, stages=2),
    "one+tma, 4 stages": lambda h, w, t, s, o: head_one(h, w, t, s, o, tma=True, stages=4),
    "one, N 256, 8 warps": lambda h, w, t, s, o: head_one(h, w, t, s, o, block_n=256, warps=8),
    "one+tma, N 256, 8 warps": lambda h, w, t, s, o: head_one(h, w, t, s, o, tma=True, block_n=256, warps=8),
    "one, greedy": lambda h, w, t, s, o: head_one(h, w, t, s, o, noise=False),
    "one+tma, noise first": lambda h, w, t, s, o: head_one(h, w, t, s, o, tma=True, early=True),
    "one+tma, noise first, 8 warps": lambda h, w, t, s, o: head_one(h, w, t, s, o, tma=True, early=True, warps=8),
    "one+tma, 8 warps": lambda h, w, t, s, o: head_one(h, w, t, s, o, tma=True, warps=8),
    "one+tma, Philox 7 rounds (other draws)": lambda h, w, t, s, o: head_one(h, w, t, s, o, tma=True, rounds=7),
    "one+tma, greedy": lambda h, w, t, s, o: head_one(h, w, t, s, o, tma=True, noise=False),
}


def kernels(batches: list[int]) -> None:
    for rows in batches:
        w, h, temps, seeds = inputs(rows)
        out = torch.empty(rows, dtype=torch.int64, device="cuda")
        figures: dict[str, list[float]] = {name: [] for name in VARIANTS}
        cublas = [graph_us(lambda: F.linear(h, w)) for _ in range(2)]
        for _ in range(2):
            for name, fn in VARIANTS.items():
                try:
                    figures[name].append(graph_us(lambda: fn(h, w, temps, seeds, out)))
                except Exception as e:  # over shared memory or registers
                    print(f"rows {rows} {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    figures[name].append(float("nan"))
        print(f"rows {rows}: cuBLAS head alone {cublas[0]:.2f} / {cublas[1]:.2f} us; " + "; ".join(
            f"{name} {a:.2f} / {b:.2f}" for name, (a, b) in figures.items()), flush=True)
        for name in ("one", "one+tma", "one+tma, noise first", "one+tma, noise first, 8 warps"):
            differ = total = 0
            for seed in range(20):
                w, h, temps, seeds = inputs(rows, seed)
                differ += int((VARIANTS[name](h, w, temps, seeds, None)
                               != head_sampler.sample(h, w, temps, seeds)).sum())
                total += rows
            print(f"rows {rows}: {name}: tokens differing from the engine's {differ} of {total}", flush=True)


def step(batches: list[int], variants: list[str]) -> None:
    from scripts.bench_engine import model_dir, step_per_mode
    engine_sample = head_sampler.sample

    def patched(fn):
        def sample(hidden, weight, temperatures, seeds, out=None, vocab_size=None):
            if vocab_size not in (None, weight.shape[0]):
                return engine_sample(hidden, weight, temperatures, seeds, out, vocab_size)
            return fn(hidden, weight, temperatures, seeds, out)
        return sample

    def set_mode(mode: str) -> None:
        head_sampler.sample = engine_sample if mode == "engine" else patched(VARIANTS[mode])
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir("Qwen3-0.6B", Path(tmp))
        for batch in batches:
            for mode, ms, roof in step_per_mode(path, ["engine", *variants], set_mode, batch=batch, rounds=3):
                print(f"batch {batch} {mode}: {ms:.3f} ms ({ms / roof:.3f}x the roofline {roof:.3f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--step", action="store_true")
    ap.add_argument("--step-variants", default="one+tma")
    ap.add_argument("--batches", default="1,8,64")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    print(torch.cuda.get_device_name(), flush=True)
    if args.kernels:
        kernels(batches)
    if args.step:
        step(batches, args.step_variants.split(","))


if __name__ == "__main__":
    main()
