"""Stop 41 (issue 20): what the batch-64 decode step's kernels between the GEMMs cost inside the step, as stop 37's
probe measured attention's: the step itself with some kernels not launched (their outputs left unwritten: only the
time counts), alternated in one process, Qwen3-0.6B, context 1,024:

- `engine`: as it is;
- `no_rope`: the q/k-norm + RoPE + K/V-store kernel not launched (what fusing it into decode attention could save
  at most);
- `no_small`: neither that nor the add+RMSNorm and SiLU-and-mul kernels (what fusing every kernel between the
  GEMMs away could save at most);
- `no_gemm`: the four projections not run (cuBLAS's GEMMs and their split-K reduce), the LM head kept;
- `no_qkv`, `no_o`, `no_gate_up`, `no_down`: one projection not run (`--each`: what each GEMM costs in the step);
- `splitk_BNxBK`, `splitk_BNxBK_reduce` (`--splitk`): the two projections of 1,024 outputs (o and down: cuBLAS
  splits their K and adds a reduce kernel) as one Triton split-K kernel each, a program per (BN columns, BK of K)
  that loads its weight tile, then (PDL) waits for its input and writes its float32 partial sum; without a reduce
  (its output left unwritten: what the GEMM would cost were the partials summed by the add+RMSNorm after it) and
  with one (a kernel summing the partials into bf16, as cuBLAS's).

The 1.35x target is 0.22 ms off the engine's step (stop 37): a route whose bound is below that cannot reach it alone.

Run: python docs/gpu_runs/stop41_small_kernels_probe.py [--each | --splitk]
"""
from __future__ import annotations

import sys
import tempfile
import types
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.bench_engine import model_dir, step_per_mode  # noqa: E402
from common.engine.layers import fused, linear  # noqa: E402
from common.engine.pdl import launch_kwargs  # noqa: E402

REAL = {name: getattr(fused, name) for name in ("rms_norm", "qk_norm_rope_", "silu_and_mul")}
REAL_F = linear.F


def no_rms_norm(x, weight, eps, residual=None):
    out = torch.empty_like(x)
    return out if residual is None else (out, residual)


def no_rope(*args, **kwargs) -> None:
    return None


def no_silu(x):
    return torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)


def no_linear(x, weight, bias=None):
    return torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype, device=x.device)


SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}  # Qwen3-0.6B


def skipping(shape: tuple[int, int]):
    """F.linear, but for weights of `shape`, whose projection is not run."""
    def linear_(x, weight, bias=None):
        return no_linear(x, weight) if tuple(weight.shape) == shape else REAL_F.linear(x, weight, bias)
    return types.SimpleNamespace(linear=linear_)


@triton.jit
def _splitk_partial_kernel(x_ptr, w_ptr, part_ptr, stride_x, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                           BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    """Program (n, k): part[k] [:, n tile] = x[:, k chunk] @ W[n tile, k chunk]^T in float32; the weight tile is
    loaded before the wait (no step writes weights)."""
    n, k = tl.program_id(0), tl.program_id(1)
    rows, cols, ks = tl.arange(0, M), n * BN + tl.arange(0, BN), k * BK + tl.arange(0, BK)
    w = tl.load(w_ptr + cols[:, None].to(tl.int64) * K + ks[None, :])
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :])
    acc = tl.dot(x, tl.trans(w))
    tl.store(part_ptr + k * M * N + rows[:, None] * N + cols[None, :], acc)


@triton.jit
def _sum_partials_kernel(part_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, S: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, N)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([N], dtype=tl.float32)
    for s in range(S):
        acc += tl.load(part_ptr + s * M * N + row * N + cols)
    tl.store(out_ptr + row * N + cols, acc.to(out_ptr.dtype.element_ty))


def splitk(bn: int, bk: int, reduce: bool):
    """F.linear, but o and down (1,024 outputs) as the split-K kernel (rows padded to a power of two)."""
    def linear_(x, weight, bias=None):
        n, k = weight.shape
        x2 = x.view(-1, k)
        m = x2.shape[0]
        if n != 1024 or m > 64 or x2.stride(-1) != 1:
            return REAL_F.linear(x, weight, bias)
        rows = max(16, triton.next_power_of_2(m))
        part = torch.empty((k // bk, rows, n), dtype=torch.float32, device=x.device)
        if rows != m:
            x2 = torch.nn.functional.pad(x2, (0, 0, 0, rows - m))
        _splitk_partial_kernel[(n // bn, k // bk)](x2, weight, part, x2.stride(0), M=rows, N=n, K=k, BN=bn, BK=bk,
                                                   **launch_kwargs(x.device))
        out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        if reduce:
            _sum_partials_kernel[(rows,)](part, out, M=rows, N=n, S=k // bk, **launch_kwargs(x.device))
        return out[:m].view(*x.shape[:-1], n)
    return types.SimpleNamespace(linear=linear_)


def set_mode(mode: str) -> None:
    """Before the engine is made (its CUDA graphs capture what the layers call then)."""
    for name, fn in REAL.items():
        setattr(fused, name, fn)
    linear.F = REAL_F
    if mode in ("no_rope", "no_small"):
        fused.qk_norm_rope_ = no_rope
    if mode == "no_small":
        fused.rms_norm, fused.silu_and_mul = no_rms_norm, no_silu
    if mode == "no_gemm":
        linear.F = types.SimpleNamespace(linear=no_linear)
    if mode.removeprefix("no_") in SHAPES:
        linear.F = skipping(SHAPES[mode.removeprefix("no_")])
    if mode.startswith("splitk_"):
        bn, bk = map(int, mode.split("_")[1].split("x"))
        linear.F = splitk(bn, bk, mode.endswith("_reduce"))


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    with tempfile.TemporaryDirectory() as d:
        path = model_dir("qwen3-0.6b", Path(d))
        modes = ([f"no_{p}" for p in SHAPES] if "--each" in sys.argv
                 else [f"splitk_{t}{r}" for t in ("64x256", "32x256", "64x512") for r in ("", "_reduce")]
                 if "--splitk" in sys.argv else ["no_rope", "no_small", "no_gemm"])
        for mode, ms, roof in step_per_mode(path, ["engine", *modes], set_mode):
            print(f"decode {mode:8s} batch 64: {ms:.3f} ms, {ms / roof:.2f}x the roofline ({roof:.3f} ms)",
                  flush=True)


if __name__ == "__main__":
    main()
