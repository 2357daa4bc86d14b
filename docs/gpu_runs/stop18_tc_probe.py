"""Probe (stop 18): a Qwen3-0.6B layer's projections at 16-64 rows, 28 layers of distinct weights in one CUDA
graph: cuBLAS (+ silu_and_mul) against a Triton tensor-core GEMM launched with PDL, with and without pulling its
weight slice into L2 before it waits for x. Prints us a layer.

    PYTHONPATH=... python docs/gpu_runs/stop18_tc_probe.py
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from common.engine.layers import fused

H, Q, KV, I, LAYERS = 1024, 2048, 1024, 3072, 28
dev = torch.device("cuda")


@triton.jit(do_not_specialize=["M"])
def _tc_kernel(x_ptr, w_ptr, out_ptr, M, stride_x, stride_o, N: tl.constexpr, K: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, LINES: tl.constexpr,
               PREFETCH: tl.constexpr, PDL: tl.constexpr):
    rows = tl.arange(0, BM)
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    col_ok = cols < N
    w_rows = w_ptr + cols[:, None].to(tl.int64) * K
    if PREFETCH:
        line = tl.arange(0, LINES)[None, :] * 64
        ok = (col_ok[:, None] & (line < K)).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [w_rows + line, ok], dtype=tl.int32, is_pure=False, pack=1)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    ks = tl.arange(0, BK)
    row_ok = rows < M
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_x
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + ks
        x = tl.load(x_rows + k[None, :], mask=row_ok[:, None], other=0.0)
        w = tl.load(w_rows + k[None, :], mask=col_ok[:, None], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    out = out_ptr + rows[:, None].to(tl.int64) * stride_o + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def tc(x, w, bn, prefetch, stages=4):
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _tc_kernel[(triton.cdiv(n, bn),)](x, w, out, m, x.stride(0), out.stride(0), N=n, K=k, BM=max(16, m), BN=bn,
                                      BK=128, LINES=triton.next_power_of_2(k) // 64, PREFETCH=prefetch, PDL=True,
                                      launch_pdl=True, num_warps=4, num_stages=stages)
    return out


torch.manual_seed(0)
layers = [dict(qkv=torch.randn(Q + 2 * KV, H, device=dev, dtype=torch.bfloat16) * 0.02,
               o=torch.randn(H, Q, device=dev, dtype=torch.bfloat16) * 0.02,
               gate_up=torch.randn(2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02,
               down=torch.randn(H, I, device=dev, dtype=torch.bfloat16) * 0.02,
               n1=torch.ones(H, device=dev, dtype=torch.bfloat16), n2=torch.ones(H, device=dev, dtype=torch.bfloat16))
          for _ in range(LAYERS)]
TILES = {"qkv": 32, "o": 16, "gate_up": 64, "down": 32}


def chain(x, res, how):
    def lin(h, name, w):
        if how == "cublas":
            return F.linear(h, w)
        return tc(h, w, TILES[name] if "wide" not in how else 2 * TILES[name], "prefetch" in how)
    for w in layers:
        h, res = fused.rms_norm(x, w["n1"], 1e-6, res)
        y = lin(h, "qkv", w["qkv"])
        z = lin(y[:, :Q].contiguous(), "o", w["o"])
        h, res = fused.rms_norm(z, w["n2"], 1e-6, res)
        x = lin(fused.silu_and_mul(lin(h, "gate_up", w["gate_up"])), "down", w["down"])
    return x


def time_graph(m, how, reps=50):
    x = torch.randn(m, H, device=dev, dtype=torch.bfloat16)
    res = torch.randn(m, H, device=dev, dtype=torch.bfloat16)
    chain(x, res.clone(), how)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain(x, res, how)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps * 1e3 / LAYERS


print(torch.cuda.get_device_name(), flush=True)
for m in (64, 16):
    x = torch.randn(m, 1024, device=dev, dtype=torch.bfloat16)
    w = layers[0]["qkv"]
    print(f"check rows {m}: max |tc - F.linear| {(tc(x, w, 32, True).float() - F.linear(x, w).float()).abs().max():.4f}")
for m in (64, 32, 16, 8):
    row = {how: time_graph(m, how) for how in ("cublas", "tc-pdl", "tc-pdl-prefetch", "tc-pdl-prefetch-wide")}
    print(f"rows {m}: us a layer " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
