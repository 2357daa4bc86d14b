"""Stop 42 (issue 20): what this stop's changes save in the batch-64 decode step (Qwen3-0.6B, context 1,024, CUDA
graphs, warm), the step timed in one process with each undone in turn, two rounds; and one route further:

- `engine`: as it is: o's and down's split-K parts summed by the add+RMSNorm after them, SiLU-and-mul launched
  with PDL (the down projection's weights load while it runs);
- `summed`: the parts summed by split-K's own kernel first (stop 41's sum kernel);
- `silu_nopdl`: SiLU-and-mul launched without PDL (as at stop 41);
- `stop41`: both undone (the engine as stop 41 left it);
- `splitk_all` (with `--splitk-all`): the engine with qkv and gate_up as split-K too (two chunks of 512 inputs, a program per 64 outputs
  and chunk, weights loaded before the wait), their parts summed by a kernel of their own (what a fold into the
  q/k-norm + RoPE and SiLU kernels could build on).

With `--left-out`, the engine's step with kernels not launched (their outputs left unwritten: only the time
counts), as stop 41's probe: `no_reduce` (split decode attention's combine), `no_rope` (the q/k-norm + RoPE + K/V
store), `no_silu` (SiLU-and-mul), `no_norms` (both add+RMSNorms a layer): what each still costs in the step.

Two cuts measured slower and left out of the engine (docs/benchmarks.md, stop 42): SiLU-and-mul applied inside the
down projection's split-K kernel as it loaded x (in this probe, an H200: 3.56 ms against 2.98), and the q/k norms,
RoPE and K/V store inside the decode attention kernel (an H100: 4.24 ms against 3.84).

Run: python docs/gpu_runs/stop42_fold_probe.py [--left-out | --splitk-all]
"""
from __future__ import annotations

import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.bench_engine import model_dir, step_per_mode  # noqa: E402
from common.engine.attention import triton_ops  # noqa: E402
from common.engine.layers import fused, linear, splitk  # noqa: E402
from common.engine.pdl import launch_kwargs  # noqa: E402

REAL_SPLIT_K_GEMM = linear.split_k_gemm
REAL_SILU = fused.silu_and_mul
REAL_COLUMN_FORWARD = linear.ColumnParallelLinear.forward
REAL = {name: getattr(fused, name) for name in ("rms_norm", "qk_norm_rope_")}
REAL_REDUCE = triton_ops._decode_reduce_kernel


class NotLaunched:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def no_rms_norm(x, weight, eps, residual=None):
    out = torch.empty(x.shape, dtype=x.dtype, device=residual.device if residual is not None else x.device)
    return out if residual is None else (out, residual)


def always_summed(x, weight):
    """linear.split_k_gemm, but handing out a split-K that sums its own parts."""
    if REAL_SPLIT_K_GEMM(x, weight) is None:
        return None
    return types.SimpleNamespace(linear=lambda x_, w_, summed=True: splitk.linear(x_, w_))


def silu_nopdl(x):
    n = x.shape[-1] // 2
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    if x.shape[0]:
        fused._silu_and_mul_kernel[(x.shape[0], triton.cdiv(n, 1024))](x, out, x.stride(0), out.stride(0), N=n,
                                                                       BLOCK=1024, PDL=False)
    return out


@triton.jit
def _sum_kernel(part_ptr, out_ptr, N: tl.constexpr, ROWS: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr,
                PDL: tl.constexpr):
    row, cols = tl.program_id(0), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(part_ptr + (s * ROWS + row) * N + cols)
    tl.store(out_ptr + row * N + cols, acc.to(out_ptr.dtype.element_ty))


def column_splitk(self, x):
    """ColumnParallelLinear.forward, but a decode batch's qkv and gate_up (outputs in whole 1,024s, K 1,024) as
    split-K."""
    n, k = self.weight.shape
    if not (x.dim() == 2 and 8 < x.shape[0] <= 64 and k == 1024 and n % 1024 == 0 and self.bias is None
            and x.stride(-1) == 1):
        return REAL_COLUMN_FORWARD(self, x)
    m, splits = x.shape[0], k // splitk.BLOCK_K
    part = torch.empty(splits, splitk.MAX_ROWS, n, dtype=torch.float32, device=x.device)
    pdl = launch_kwargs(x.device)
    splitk._partial_kernel[(n // splitk.BLOCK_N, splits)](x, self.weight, part, m, x.stride(0), N=n, K=k,
                                                          ROWS=splitk.MAX_ROWS, BLOCK_N=splitk.BLOCK_N,
                                                          BLOCK_K=splitk.BLOCK_K, **pdl)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _sum_kernel[(m, n // 1024)](part, out, N=n, ROWS=splitk.MAX_ROWS, SPLITS=splits, BLOCK=1024, **pdl)
    return out


def set_mode(mode: str) -> None:
    """Before the engine is made (its CUDA graphs capture what the layers call then)."""
    linear.split_k_gemm, fused.silu_and_mul = REAL_SPLIT_K_GEMM, REAL_SILU
    linear.ColumnParallelLinear.forward = REAL_COLUMN_FORWARD
    triton_ops._decode_reduce_kernel = REAL_REDUCE
    for name, fn in REAL.items():
        setattr(fused, name, fn)
    if mode == "no_reduce":
        triton_ops._decode_reduce_kernel = NotLaunched()
    if mode == "no_rope":
        fused.qk_norm_rope_ = lambda *args, **kwargs: None
    if mode == "no_silu":
        fused.silu_and_mul = lambda x: torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
    if mode == "no_norms":
        fused.rms_norm = no_rms_norm
    if mode in ("summed", "stop41"):
        linear.split_k_gemm = always_summed
    if mode in ("silu_nopdl", "stop41"):
        fused.silu_and_mul = silu_nopdl
    if mode == "splitk_all":
        linear.ColumnParallelLinear.forward = column_splitk


def check_splitk_all() -> None:
    """The probe's column split-K gives F.linear's products (so its time is that of a real projection)."""
    lin = linear.ColumnParallelLinear(1024, 6144).to("cuda", torch.bfloat16)
    lin.weight.data.normal_(0, 0.03)
    x = torch.randn(37, 1024, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(column_splitk(lin, x), F.linear(x, lin.weight), atol=2e-2, rtol=2e-2)


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    check_splitk_all()
    with tempfile.TemporaryDirectory() as d:
        path = model_dir("qwen3-0.6b", Path(d))
        modes = (["no_reduce", "no_rope", "no_silu", "no_norms"] if "--left-out" in sys.argv
                 else ["splitk_all"] if "--splitk-all" in sys.argv
                 else ["summed", "silu_nopdl", "stop41"])
        for mode, ms, roof in step_per_mode(path, ["engine", *modes], set_mode):
            print(f"decode {mode:10s} batch 64: {ms:.3f} ms, {ms / roof:.2f}x the roofline ({roof:.3f} ms)",
                  flush=True)


if __name__ == "__main__":
    main()
