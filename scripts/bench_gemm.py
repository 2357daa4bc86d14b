"""Decode-sized GEMMs: cuBLAS (torch's F.linear, and the separate SiLU-and-mul kernel before the down projection)
against a Triton alternative written for them, on one layer's four weight shapes of a model, at the row counts a
decode step has. The question it answers: can the engine's decode GEMMs get closer to the memory's bandwidth than
cuBLAS does? (docs/benchmarks.md, "Stop 16": not with this kernel; cuBLAS stays.)

    python -m scripts.bench_gemm [--config qwen3-0.6b] [--rows 1,2,4,8,16,32,64] [--sweep 1,64]

The Triton kernel (`skinny_linear`) streams the weight once, every program taking a slice of the output columns
over the whole K (no split-K partials, no reduce kernel), and with `silu_mul` computes the MLP's SiLU-and-mul while
loading x, so the down projection needs no separate kernel. Every product is checked against F.linear first. Each
timing replays a CUDA graph (as decode runs) of the product over `LAYERS` distinct weights, so that the weights come
from HBM and not from L2, and divides by it: kernel gaps inside a graph count, as they do in a decode step.
--sweep: for those row counts, every tile of a small grid too, the best printed beside the one `tile` picks.
"""
from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from common.config import ModelConfig
from scripts.model_prep.model_config import resolve_config

LAYERS = 16  # distinct copies of each weight per timing: 16 x 8-12 MB is past any L2
MAX_ROWS = 64


@triton.jit(do_not_specialize=["M"])
def _skinny_kernel(x_ptr, w_ptr, out_ptr, M, stride_x, stride_o, N: tl.constexpr, K: tl.constexpr,
                   SILU_MUL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   DOT: tl.constexpr):
    rows = tl.arange(0, BM)
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    row_ok = rows < M
    col_ok = cols < N
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_x
    w_rows = w_ptr + cols[:, None].to(tl.int64) * K
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + ks
        k_ok = k < K
        x = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if SILU_MUL:  # x = [gate | up]: silu(gate) rounded to the dtype, times up, as fused.silu_and_mul rounds
            up = tl.load(x_rows + K + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            gate = x.to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(x.dtype).to(tl.float32)
            x = (act * up).to(x.dtype)
        w = tl.load(w_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT:
            acc = tl.dot(x, tl.trans(w), acc)
        else:  # too few rows for a tensor-core tile: multiply-add on the CUDA cores
            acc += tl.sum(x[:, None, :].to(tl.float32) * w[None, :, :].to(tl.float32), axis=2)
    out = out_ptr + rows[:, None].to(tl.int64) * stride_o + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    bk: int
    dot: bool
    num_warps: int = 4
    num_stages: int = 3


def tile(m: int, n: int, k: int) -> Tile:
    """The launch for an [m, k] x [k, n] product, the best of the H100 sweep (docs/benchmarks.md): one row on the
    CUDA cores, 8 columns a program; from two rows a tensor-core tile of at least 16 rows."""
    if m == 1:
        return Tile(1, 8, 512, dot=False, num_stages=4)
    return Tile(max(16, triton.next_power_of_2(m)), 32 if n >= 4096 else 16, 128, dot=True, num_stages=5)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False, t: Tile | None = None) -> torch.Tensor:
    """x [M, K] (or [M, 2K] = [gate | up] with `silu_mul`) times weight [N, K]^T, M <= MAX_ROWS."""
    n, k = weight.shape
    m = x.shape[0]
    assert m <= MAX_ROWS and x.shape[1] == (2 * k if silu_mul else k) and x.stride(1) == 1 and weight.is_contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        t = t or tile(m, n, k)
        _skinny_kernel[(triton.cdiv(n, t.bn),)](x, weight, out, m, x.stride(0), out.stride(0), N=n, K=k,
                                                 SILU_MUL=silu_mul, BM=t.bm, BN=t.bn, BK=t.bk, DOT=t.dot,
                                                 num_warps=t.num_warps, num_stages=t.num_stages)
    return out



def shapes(c: ModelConfig) -> dict[str, tuple[int, int, bool]]:
    """name -> (N, K, silu_mul) of one decoder layer's GEMMs."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return {"qkv": (q + 2 * kv, c.hidden_size, False), "o": (c.hidden_size, q, False),
            "gate_up": (2 * c.intermediate_size, c.hidden_size, False),
            "down": (c.hidden_size, c.intermediate_size, True)}


def graph_us(fn, reps: int = 50) -> float:
    """Microseconds per call of `fn`, replayed in a CUDA graph; median of 5 rounds."""
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=reps, return_mode="median") * 1e3


def main(argv: list[str] | None = None) -> None:
    from common.engine.layers import fused

    ap = argparse.ArgumentParser(prog="bench_gemm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="qwen3-0.6b")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--sweep", default="", help="row counts to sweep tiles at")
    args = ap.parse_args(argv)
    c = ModelConfig.from_dict(resolve_config(args.config)[1])
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = [int(r) for r in args.rows.split(",")]
    sweep = {int(r) for r in args.sweep.split(",") if r}
    print(f"== {args.config}: one layer's GEMMs, bf16, {torch.cuda.get_device_name()}; us per GEMM "
          f"(graph replay over {LAYERS} weights); GB/s = weight bytes / time")
    print(f"{'gemm':<9}{'rows':>5}{'cublas us':>11}{'GB/s':>7}{'skinny us':>11}{'GB/s':>7}{'gain':>7}   tile")
    totals: dict[int, list[float]] = {m: [0.0, 0.0] for m in rows}
    for name, (n, k, silu) in shapes(c).items():
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
        nbytes = n * k * 2
        for m in rows:
            x = torch.randn(m, 2 * k if silu else k, device=dev, dtype=torch.bfloat16)
            want = F.linear(fused.silu_and_mul(x) if silu else x, ws[0])
            got = skinny_linear(x, ws[0], silu_mul=silu)
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)

            def cublas():
                for w in ws:
                    F.linear(fused.silu_and_mul(x) if silu else x, w)

            def skinny(t: Tile | None = None):
                for w in ws:
                    skinny_linear(x, w, silu_mul=silu, t=t)

            cu, sk = graph_us(cublas) / LAYERS, graph_us(skinny) / LAYERS
            totals[m][0] += cu
            totals[m][1] += sk
            t = tile(m, n, k)
            print(f"{name:<9}{m:>5}{cu:>11.2f}{nbytes / cu / 1e3:>7.0f}{sk:>11.2f}{nbytes / sk / 1e3:>7.0f}"
                  f"{cu / sk:>7.2f}   {t}", flush=True)
            if m in sweep:
                best = (sk, t)
                for cand in candidates(m):
                    try:
                        got = skinny_linear(x, ws[0], silu_mul=silu, t=cand)
                        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
                        us = graph_us(lambda: skinny(cand), reps=20) / LAYERS
                    except Exception as e:  # a tile this GPU cannot run (shared memory): skip it
                        print(f"   skip {cand}: {type(e).__name__}")
                        continue
                    best = min(best, (us, cand), key=lambda b: b[0])
                print(f"   best {best[0]:.2f} us ({nbytes / best[0] / 1e3:.0f} GB/s): {best[1]}", flush=True)
    print("== a layer's four GEMMs (+ SiLU-and-mul for cuBLAS), us")
    for m, (cu, sk) in totals.items():
        print(f"rows {m:>3}: cublas {cu:7.2f}  skinny {sk:7.2f}  gain {cu / sk:.2f}")


def candidates(m: int) -> list:
    next_power_of_2 = triton.next_power_of_2
    out = []
    if m <= 8:
        for bn, bk, warps, stages in itertools.product((8, 16, 32), (128, 256, 512), (4,), (3, 4)):
            out.append(Tile(next_power_of_2(m), bn, bk, dot=False, num_warps=warps, num_stages=stages))
    if m >= 8:
        bm = max(16, next_power_of_2(m))
        for bn, bk, warps, stages in itertools.product((16, 32, 64), (64, 128, 256), (4,), (3, 4, 5)):
            out.append(Tile(bm, bn, bk, dot=True, num_warps=warps, num_stages=stages))
    return out


if __name__ == "__main__":
    main()
