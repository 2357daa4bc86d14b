"""Stop 33 (issue 20): how much of the batch-64 decode step two changes could take, before building either.

1. The row projections (o_proj, down_proj) at 64 rows: cuBLAS picks split-K and a reduce kernel for them. Timed
   here in CUDA graphs over 28 layers of Qwen3-0.6B-shaped weights, several ways that give the same product:
   F.linear (the engine's), the weight stored transposed (x @ Wt), the product transposed (W @ x^T), and addmm
   with the residual as C (the residual add in the GEMM's epilogue).
2. The decode step with RMSNorm's kernels left out (`nonorm`: the norms return their input): an upper bound on
   folding the norm's weight into the next projection and its 1/rms into the kernels after it (the step's output is
   wrong in that mode; only its time counts). Alternated with the engine as it is, in one process.

Run: python docs/gpu_runs/stop33_fold_probe.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.bench_engine import decode_step_ms, make_llm, model_dir, weight_bytes  # noqa: E402
from scripts.bench_gpu import graph_us, hbm_bandwidth  # noqa: E402
from common.engine.layers import norm  # noqa: E402

LAYERS, ROWS, HIDDEN = 28, 64, 1024


def row_projections() -> None:
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    for name, k in (("o_proj", 2048), ("down_proj", 3072)):
        ws = [torch.randn(HIDDEN, k, device=dev, dtype=dt) * 0.02 for _ in range(LAYERS)]
        wts = [w.t().contiguous() for w in ws]
        xs = [torch.randn(ROWS, k, device=dev, dtype=dt) for _ in range(LAYERS)]
        res = torch.randn(ROWS, HIDDEN, device=dev, dtype=dt)
        ref = F.linear(xs[0], ws[0]).float()
        ways = {
            "F.linear (engine)": lambda i: F.linear(xs[i], ws[i]),
            "x @ Wt (stored transposed)": lambda i: xs[i] @ wts[i],
            "(W @ x^T)^T": lambda i: (ws[i] @ xs[i].t()).t(),
            "addmm(residual, x, W^T)": lambda i: torch.addmm(res, xs[i], ws[i].t()),
            "addmm(residual, x, Wt)": lambda i: torch.addmm(res, xs[i], wts[i]),
        }
        for way, fn in ways.items():
            out = fn(0).float() - (res.float() if "addmm" in way else 0)
            err = (out - ref).abs().max().item()
            us = graph_us(lambda: [fn(i) for i in range(LAYERS)], reps=50) / LAYERS
            print(f"{name:10s} {way:30s} {us:7.2f} us a layer   max |diff| {err:.3g}", flush=True)


def no_norm(self, x, residual=None):
    return x if residual is None else (x, residual)


def decode_steps(root: Path) -> None:
    path = model_dir("qwen3-0.6b", root)
    bw = hbm_bandwidth()  # GB/s, read + write, as bench_engine decode takes it
    real = norm.RMSNorm.forward
    for mode in ("engine", "nonorm", "engine", "nonorm"):
        norm.RMSNorm.forward = no_norm if mode == "nonorm" else real
        llm = make_llm(path, max_num_seqs=256, max_model_len=1024 + 300)
        try:
            layout = llm.engine.runner.layout
            kv = layout.block_bytes // layout.block_size
            wb = weight_bytes(llm)
            for batch in (1, 64):
                ms = decode_step_ms(llm, batch, 1024)
                roof = (wb + batch * (1024 + 20) * kv) / (bw * 1e9) * 1e3
                print(f"decode {mode:7s} batch {batch:3d}: {ms:.3f} ms, {ms / roof:.2f}x the roofline", flush=True)
        finally:
            llm.close()
    norm.RMSNorm.forward = real


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), flush=True)
    row_projections()
    with tempfile.TemporaryDirectory() as d:
        decode_steps(Path(d))
