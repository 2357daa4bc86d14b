"""Stop 46 (issue 20): the LM head and the one-pass sampler in one kernel (common/engine/layers/head_sampler.py)
against cuBLAS's head then fused.gumbel_argmax, the logits written and read back.

1. `--kernels`: both alone, Qwen3-0.6B's head (151,936 x 1,024, bf16, random), from a CUDA graph of 20 launches,
   alternated, two rounds, us a launch; and the tokens of the two paths compared (greedy and Gumbel rows).
2. `--tilings`: the fused kernel's tile x warps x stages at 8 and 64 rows.
3. `--step`: the decode step (`bench_engine`'s, Qwen3-0.6B, context 1,024, CUDA graphs, warm) with the fused head
   (`engine`) and without (`unfused`: head_sampler.MAX_ROWS = 0), alternated, three rounds.

Run: python docs/gpu_runs/stop46_head_sampler_probe.py [--kernels] [--tilings] [--step] [--batches 1,8,32,64]
"""
from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.engine.layers import fused, head_sampler  # noqa: E402
from scripts.bench_engine import model_dir, step_per_mode  # noqa: E402

VOCAB, HIDDEN = 151936, 1024


def graph_us(fn, launches: int = 20, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return sorted(times)[len(times) // 2]


def inputs(rows: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=g) * 0.05).bfloat16()
    h = torch.randn(rows, HIDDEN, device="cuda", generator=g).bfloat16()
    temps = torch.tensor([0.0, 0.7, 1.0, 1.3], device="cuda").repeat(rows)[:rows].contiguous()
    seeds = torch.arange(rows, device="cuda", dtype=torch.int64) * 7919 + seed
    return w, h, temps, seeds


# ---- variants of the noise's math (--math) ------------------------------------------------------------------
@triton.jit
def _score(x, u, temp, FAST: tl.constexpr):
    """FAST: x times 1/T, and -ln(-ln u) through log2 (one MUFU op each), less its constant -ln(ln 2)."""
    if FAST:
        inv = 1.0 / tl.where(temp > 0, temp, 1.0)
        g = libdevice.fast_log2f(-libdevice.fast_log2f(tl.maximum(u, 1e-10)))
        return tl.where(temp > 0, x * inv - 0.6931471805599453 * g, x)
    return tl.where(temp > 0, x / tl.where(temp > 0, temp, 1.0) - tl.log(-tl.log(tl.maximum(u, 1e-10))), x)


@triton.jit
def _chunk(logits_ptr, row, stride, offs, u, temp, best, best_idx, V: tl.constexpr, FAST: tl.constexpr):
    x = tl.load(logits_ptr + row * stride + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    x = _score(x, u, temp, FAST)
    better = x > best
    return tl.where(better, x, best), tl.where(better, offs, best_idx)


@triton.jit
def _gumbel_kernel(logits_ptr, temps_ptr, seeds_ptr, best_ptr, best_idx_ptr, stride, V: tl.constexpr,
                   SPLIT: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    QUARTER: tl.constexpr = BLOCK // 4
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temp = tl.load(temps_ptr + row)
    seed = tl.load(seeds_ptr + row)
    q = tl.arange(0, QUARTER)
    best = tl.full([QUARTER], float("-inf"), dtype=tl.float32)
    best_idx = tl.full([QUARTER], V, dtype=tl.int32)
    for start in range(split * SPLIT, tl.minimum(split * SPLIT + SPLIT, V), BLOCK):
        counter = start // 4 + q
        u0, u1, u2, u3 = tl.rand4x(seed, counter)
        best, best_idx = _chunk(logits_ptr, row, stride, 4 * counter, u0, temp, best, best_idx, V, FAST)
        best, best_idx = _chunk(logits_ptr, row, stride, 4 * counter + 1, u1, temp, best, best_idx, V, FAST)
        best, best_idx = _chunk(logits_ptr, row, stride, 4 * counter + 2, u2, temp, best, best_idx, V, FAST)
        best, best_idx = _chunk(logits_ptr, row, stride, 4 * counter + 3, u3, temp, best, best_idx, V, FAST)
    m = tl.max(best, axis=0)
    first = tl.min(tl.where(best == m, best_idx, V), axis=0)
    first = tl.where(first == V, split * SPLIT, first)
    tl.store(best_ptr + row * tl.num_programs(1) + split, m)
    tl.store(best_idx_ptr + row * tl.num_programs(1) + split, first.to(tl.int64))


def gumbel_variant(logits, temps, seeds, out, fast: bool):
    rows, vocab = logits.shape
    block = 2048
    split = block * max(1, triton.cdiv(vocab, block * 32))
    splits = triton.cdiv(vocab, split)
    best = torch.empty(rows, splits, dtype=torch.float32, device=logits.device)
    best_idx = torch.empty(rows, splits, dtype=torch.int64, device=logits.device)
    _gumbel_kernel[(rows, splits)](logits, temps, seeds, best, best_idx, logits.stride(0), V=vocab, SPLIT=split,
                                   BLOCK=block, FAST=fast, num_warps=4)
    return fused.first_best(best, best_idx, out)


@triton.jit
def _noisy(acc, u, temp, col, V: tl.constexpr, FAST: tl.constexpr, NOISE: tl.constexpr):
    x = acc.to(tl.bfloat16).to(tl.float32)
    if NOISE:
        x = _score(x, u, temp, FAST)
    return tl.where(col < V, x, float("-inf"))


@triton.jit
def _first_of(score, col, m, V: tl.constexpr):
    return tl.min(tl.where(score == m[:, None], col, V), axis=1)


@triton.jit
def _head_kernel(h_ptr, w_ptr, temps_ptr, seeds_ptr, best_ptr, best_idx_ptr, M, stride_h, stride_best,
                 V: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, FAST: tl.constexpr, NOISE: tl.constexpr):
    Q: tl.constexpr = BLOCK_N // 4
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    counter = tl.program_id(1) * Q + tl.arange(0, Q)
    col0 = 4 * counter
    ks = tl.arange(0, BLOCK_K)
    h = h_ptr + rows[:, None].to(tl.int64) * stride_h + ks[None, :]
    w = w_ptr + col0[None, :].to(tl.int64) * K + ks[:, None]
    acc0 = tl.zeros([BLOCK_M, Q], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, Q], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, Q], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, Q], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(h + k, mask=row_mask[:, None], other=0.0)
        acc0 = tl.dot(x, tl.load(w + k, mask=(col0 < V)[None, :], other=0.0), acc0)
        acc1 = tl.dot(x, tl.load(w + K + k, mask=(col0 + 1 < V)[None, :], other=0.0), acc1)
        acc2 = tl.dot(x, tl.load(w + 2 * K + k, mask=(col0 + 2 < V)[None, :], other=0.0), acc2)
        acc3 = tl.dot(x, tl.load(w + 3 * K + k, mask=(col0 + 3 < V)[None, :], other=0.0), acc3)
    temp = tl.load(temps_ptr + rows, mask=row_mask, other=0.0)[:, None]
    seed = tl.load(seeds_ptr + rows, mask=row_mask, other=0)[:, None]
    if NOISE:
        u0, u1, u2, u3 = tl.rand4x(seed, counter[None, :])
    else:
        u0 = temp
        u1 = temp
        u2 = temp
        u3 = temp
    s0 = _noisy(acc0, u0, temp, col0[None, :], V, FAST, NOISE)
    s1 = _noisy(acc1, u1, temp, col0[None, :] + 1, V, FAST, NOISE)
    s2 = _noisy(acc2, u2, temp, col0[None, :] + 2, V, FAST, NOISE)
    s3 = _noisy(acc3, u3, temp, col0[None, :] + 3, V, FAST, NOISE)
    m = tl.maximum(tl.maximum(tl.max(s0, axis=1), tl.max(s1, axis=1)),
                   tl.maximum(tl.max(s2, axis=1), tl.max(s3, axis=1)))
    first = tl.minimum(tl.minimum(_first_of(s0, col0[None, :], m, V), _first_of(s1, col0[None, :] + 1, m, V)),
                       tl.minimum(_first_of(s2, col0[None, :] + 2, m, V), _first_of(s3, col0[None, :] + 3, m, V)))
    tl.store(best_ptr + rows * stride_best + tl.program_id(1), m, mask=row_mask)
    tl.store(best_idx_ptr + rows * stride_best + tl.program_id(1), first.to(tl.int64), mask=row_mask)


def head_variant(h, w, temps, seeds, out, fast: bool, noise: bool = True, block_m: int = 64, block_n: int = 128,
                 block_k: int = 64, warps: int = 4, stages: int = 3):
    rows, k = h.shape
    bm = min(block_m, max(16, triton.next_power_of_2(rows)))
    tiles = triton.cdiv(VOCAB, block_n)
    best = torch.empty(rows, tiles, dtype=torch.float32, device=h.device)
    best_idx = torch.empty(rows, tiles, dtype=torch.int64, device=h.device)
    _head_kernel[(triton.cdiv(rows, bm), tiles)](h, w, temps, seeds, best, best_idx, rows, h.stride(0),
                                                 best.stride(0), V=VOCAB, K=k, BLOCK_M=bm, BLOCK_N=block_n,
                                                 BLOCK_K=block_k, FAST=fast, NOISE=noise, num_warps=warps,
                                                 num_stages=stages)
    return fused.first_best(best, best_idx, out)


def math(batches: list[int]) -> None:
    for rows in batches:
        w, h, temps, seeds = inputs(rows)
        out = torch.empty(rows, dtype=torch.int64, device="cuda")
        logits = F.linear(h, w)
        cases = {
            "head alone (cuBLAS)": lambda: F.linear(h, w),
            "gumbel alone, engine": lambda: fused.gumbel_argmax(logits, temps, seeds, out),
            "gumbel alone, fast": lambda: gumbel_variant(logits, temps, seeds, out, True),
            "apart, engine": lambda: fused.gumbel_argmax(F.linear(h, w), temps, seeds, out),
            "apart, fast": lambda: gumbel_variant(F.linear(h, w), temps, seeds, out, True),
            "fused, engine": lambda: head_sampler.sample(h, w, temps, seeds, out),
            "fused, fast": lambda: head_variant(h, w, temps, seeds, out, True),
            "fused, fast, 8 warps": lambda: head_variant(h, w, temps, seeds, out, True, warps=8),
            "fused, fast, 32 rows a tile": lambda: head_variant(h, w, temps, seeds, out, True, block_m=32),
            "fused, no noise": lambda: head_variant(h, w, temps, seeds, out, True, noise=False),
        }
        for name, fn in cases.items():
            a, b = graph_us(fn), graph_us(fn)
            print(f"rows {rows}: {name}: {a:.2f} / {b:.2f} us", flush=True)
        base = fused.gumbel_argmax(logits, temps, seeds)
        fast = gumbel_variant(logits, temps, seeds, None, True)
        print(f"rows {rows}: fast math against the engine's, tokens differing: {int((base != fast).sum())} of {rows}")


def kernels(batches: list[int]) -> None:
    for rows in batches:
        w, h, temps, seeds = inputs(rows)
        out = torch.empty(rows, dtype=torch.int64, device="cuda")
        apart = lambda: fused.gumbel_argmax(F.linear(h, w), temps, seeds, out)  # noqa: E731
        one = lambda: head_sampler.sample(h, w, temps, seeds, out)  # noqa: E731

        def torch_reduce():  # the slices' best through torch's argmax and gather (two launches), as before stop 46
            real = fused.first_best
            fused.first_best = lambda best, idx, o: torch.gather(idx, 1, best.argmax(1, keepdim=True),
                                                                 out=o.unsqueeze(1))
            try:
                head_sampler.sample(h, w, temps, seeds, out)
            finally:
                fused.first_best = real
        figures = {"apart": [], "fused": [], "fused, torch's reduce": []}
        for _ in range(2):
            figures["apart"].append(graph_us(apart))
            figures["fused"].append(graph_us(one))
            figures["fused, torch's reduce"].append(graph_us(torch_reduce))
        print(f"rows {rows} (weight {w.numel() * 2 / 1e6:.0f} MB): " + ", ".join(
            f"{name} {a:.2f} / {b:.2f} us" for name, (a, b) in figures.items()), flush=True)
        differ, total = 0, 0
        for seed in range(20):
            w, h, temps, seeds = inputs(rows, seed)
            a = fused.gumbel_argmax(F.linear(h, w), temps, seeds)
            b = head_sampler.sample(h, w, temps, seeds)
            differ += int((a != b).sum())
            total += rows
        print(f"rows {rows}: tokens differing between the paths {differ} of {total}", flush=True)


def tilings(batches: list[int]) -> None:
    saved = (head_sampler.BLOCK_N, head_sampler.BLOCK_K, head_sampler.WARPS, head_sampler.STAGES)
    for rows in batches:
        w, h, temps, seeds = inputs(rows)
        out = torch.empty(rows, dtype=torch.int64, device="cuda")
        apart = graph_us(lambda: fused.gumbel_argmax(F.linear(h, w), temps, seeds, out))
        results = []
        for bn, bk, warps, stages in itertools.product((64, 128, 256), (64, 128), (4, 8), (2, 3, 4)):
            head_sampler.BLOCK_N, head_sampler.BLOCK_K, head_sampler.WARPS, head_sampler.STAGES = bn, bk, warps, stages
            try:
                us = graph_us(lambda: head_sampler.sample(h, w, temps, seeds, out), reps=10)
            except Exception as e:  # over shared memory or registers
                print(f"rows {rows} {bn}/{bk}/{warps}/{stages}: {type(e).__name__}", flush=True)
                continue
            results.append((us, bn, bk, warps, stages))
        results.sort()
        print(f"rows {rows}: apart {apart:.2f} us; fused best: " + "; ".join(
            f"{bn}/{bk}/{wp}/{st} {us:.2f}" for us, bn, bk, wp, st in results[:6]), flush=True)
        head_sampler.BLOCK_N, head_sampler.BLOCK_K, head_sampler.WARPS, head_sampler.STAGES = saved


def step(batches: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir("Qwen3-0.6B", Path(tmp))
        modes = {"engine": head_sampler.MAX_ROWS, "unfused": 0}

        def set_mode(mode: str) -> None:
            head_sampler.MAX_ROWS = modes[mode]
        for batch in batches:
            for mode, ms, roof in step_per_mode(path, list(modes), set_mode, batch=batch, rounds=3):
                print(f"batch {batch} {mode}: {ms:.3f} ms ({ms / roof:.2f}x the roofline {roof:.3f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--tilings", action="store_true")
    ap.add_argument("--step", action="store_true")
    ap.add_argument("--math", action="store_true")
    ap.add_argument("--batches", default="1,8,32,64")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    print(torch.cuda.get_device_name(), flush=True)
    if args.math:
        math(batches)
    if args.kernels:
        kernels(batches)
    if args.tilings:
        tilings([b for b in batches if b in (8, 64)] or batches)
    if args.step:
        step(batches)


if __name__ == "__main__":
    main()
