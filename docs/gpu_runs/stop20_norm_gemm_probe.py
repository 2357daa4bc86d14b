"""Probe (stop 20): a Qwen3-0.6B layer's projections at decode batch sizes with the elementwise work folded into
the GEMMs (the kernel below: RMSNorm and the residual add applied to x as each program loads it, SiLU-and-mul to
gate_up's output before it is stored) against the engine's chain (fused RMSNorm kernels, cuBLAS,
SiLU-and-mul kernel). 28 layers of distinct weights in one CUDA graph; prints us a layer.

First a tile sweep of each folded GEMM alone (28 distinct weights a graph, 64 rows), then whole-layer chains:

  cublas      rms_norm, qkv, o, rms_norm, gate_up, silu_and_mul, down (the engine today, past 2 rows)
  fold-cub    qkv with the norm folded in, o on cuBLAS, gate_up with norm and SiLU folded in, down on cuBLAS
  fold-tc     the same with o and down on the Triton GEMM too (4 kernels a layer)

    PYTHONPATH=... python docs/gpu_runs/stop20_norm_gemm_probe.py
"""
from __future__ import annotations

import itertools
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from common.engine.layers import fused
from common.engine.pdl import launch_kwargs

@triton.jit(do_not_specialize=["M"])
def _norm_gemm_kernel(x_ptr, res_ptr, norm_w_ptr, w_ptr, out_ptr, res_out_ptr, M, eps,
                      stride_x, stride_r, stride_w, stride_o, stride_ro,
                      N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr, SILU: tl.constexpr,
                      PDL: tl.constexpr):
    """Grid (N / BLOCK_N,): outputs [n0, n0 + BLOCK_N) of every row (with SILU, of silu(gate) * up, N of each)."""
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < N
    w_rows = w_ptr + cols[:, None].to(tl.int64) * stride_w
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        x = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :], mask=row_ok[:, None], other=0.0)
        if HAS_RES:  # rounded to the model dtype, as the unfused residual add is
            x = (x.to(tl.float32) + tl.load(res_ptr + rows[:, None] * stride_r + k[None, :],
                                            mask=row_ok[:, None], other=0.0).to(tl.float32)).to(x.dtype)
            if pid == 0:
                tl.store(res_out_ptr + rows[:, None] * stride_ro + k[None, :], x, mask=row_ok[:, None])
        if NORM:
            xf = x.to(tl.float32)
            sumsq += tl.sum(xf * xf, axis=1)
            x = (xf * tl.load(norm_w_ptr + k).to(tl.float32)[None, :]).to(x.dtype)
        acc = tl.dot(x, tl.trans(tl.load(w_rows + k[None, :], mask=col_ok[:, None], other=0.0)), acc)
        if SILU:
            up = tl.load(w_rows + N * stride_w + k[None, :], mask=col_ok[:, None], other=0.0)
            acc_up = tl.dot(x, tl.trans(up), acc_up)
    if NORM:
        rstd = 1.0 / tl.sqrt(sumsq / K + eps)
        acc = acc * rstd[:, None]
        acc_up = acc_up * rstd[:, None]
    y = acc.to(out_ptr.dtype.element_ty)
    if SILU:  # rounded as silu_and_mul rounds the projection's output: gate and up, the activation, the product
        gate = y.to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
        y = (act * acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :], y, mask=row_ok[:, None] & col_ok[None, :])


H, Q, KV, I, LAYERS = 1024, 2048, 1024, 3072, 28
dev = torch.device("cuda")
torch.manual_seed(0)


def rand(*shape, scale=0.02):
    return torch.randn(*shape, device=dev, dtype=torch.bfloat16) * scale


layers = [dict(qkv=rand(Q + 2 * KV, H), o=rand(H, Q), gate_up=rand(2 * I, H), down=rand(H, I),
               n1=1 + rand(H, scale=0.1), n2=1 + rand(H, scale=0.1)) for _ in range(LAYERS)]


def launch(x, w, *, nw=None, res=None, silu=False, cfg=(32, 128, 4, 4)):
    bn, bk, stages, warps = cfg
    m, k = x.shape
    n = w.shape[0] // (2 if silu else 1)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if res is not None else out
    _norm_gemm_kernel[(triton.cdiv(n, bn),)](
        x, res if res is not None else x, nw if nw is not None else w, w, out, res_out, m, 1e-6, x.stride(0),
        res.stride(0) if res is not None else 0, w.stride(0), out.stride(0), res_out.stride(0),
        N=n, K=k, BLOCK_M=64, BLOCK_N=bn, BLOCK_K=bk, NORM=nw is not None, HAS_RES=res is not None, SILU=silu,
        num_warps=warps, num_stages=stages, **launch_kwargs(dev))
    return out, (res_out if res is not None else None)


def graph_us(fn, reps=40):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) / reps * 1e3 / LAYERS)
    return best


KINDS = {  # name: (weight key, input width, norm?, silu?)
    "qkv+norm": ("qkv", H, True, False),
    "o": ("o", Q, False, False),
    "gate_up+norm+silu": ("gate_up", H, True, True),
    "down": ("down", I, False, False),
}


def kind_fn(kind, m, cfg):
    key, width, norm, silu = KINDS[kind]
    x, res = rand(m, width, scale=1.0), rand(m, width, scale=1.0)

    def fn():
        for w in layers:
            launch(x, w[key], nw=w["n1"] if norm else None, res=res if norm else None, silu=silu, cfg=cfg)
    return fn


def cublas_kind_fn(kind, m):
    key, width, norm, silu = KINDS[kind]
    x, res = rand(m, width, scale=1.0), rand(m, width, scale=1.0)

    def fn():
        for w in layers:
            h = fused.rms_norm(x, w["n1"], 1e-6, res)[0] if norm else x
            y = F.linear(h, w[key])
            if silu:
                fused.silu_and_mul(y)
    return fn


print(torch.cuda.get_device_name(), flush=True)
# correctness against the unfused chain, 64 and 5 rows
for m in (64, 5):
    w = layers[0]
    x, res = rand(m, H, scale=1.0), rand(m, H, scale=1.0)
    h, r = fused.rms_norm(x, w["n1"], 1e-6, res.clone())
    y, r2 = launch(x, w["gate_up"], nw=w["n1"], res=res, silu=True)
    ref = fused.silu_and_mul(F.linear(h, w["gate_up"]))
    y1, _ = launch(x, w["qkv"], nw=w["n1"], res=res)
    print(f"check rows {m}: residual {(r2.float() - r.float()).abs().max():.4f}  gate_up+silu "
          f"{(y.float() - ref.float()).abs().max():.4f} (ref max {ref.abs().max():.2f})  qkv "
          f"{(y1.float() - F.linear(h, w['qkv']).float()).abs().max():.4f}", flush=True)

import sys  # noqa: E402

if "--variants" in sys.argv:  # which part of the folded prologue costs: 64 rows, qkv and gate_up shapes
    for key, silu in (("qkv", False), ("gate_up", True)):
        x, res = rand(64, H, scale=1.0), rand(64, H, scale=1.0)
        for cfg in ((32, 128, 4, 4), (64, 64, 6, 4), (32, 64, 6, 4)):
            if silu and cfg[0] * cfg[1] > 64 * 128:
                continue
            row = {}
            for name, kw in (("plain", {}), ("res", dict(res=res)), ("norm", dict(norm=True)),
                             ("norm+res", dict(norm=True, res=res))):
                def fn(kw=kw):
                    for w in layers:
                        launch(x, w[key], nw=w["n1"] if kw.get("norm") else None, res=kw.get("res"), silu=silu,
                               cfg=cfg)
                row[name] = graph_us(fn)
            print(f"{key}{'+silu' if silu else ''} {cfg}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()),
                  flush=True)
        print(f"{key}: cuBLAS path (norm kernel, GEMM{', silu kernel' if silu else ''}) "
              f"{graph_us(cublas_kind_fn(key + ('+norm+silu' if silu else '+norm'), 64)):.2f}", flush=True)
    sys.exit(0)

t0 = time.time()
best = {}
grid = list(itertools.product((16, 32, 64), (64, 128, 256), (3, 4, 6), (4,)))
for kind in KINDS:
    rows = []
    for cfg in grid:
        if cfg[0] * cfg[1] > 64 * 128 and KINDS[kind][3]:
            continue
        try:
            rows.append((graph_us(kind_fn(kind, 64, cfg)), cfg))
        except Exception as e:  # out of shared memory and the like
            print(f"  {kind} {cfg}: {type(e).__name__}", flush=True)
    rows.sort()
    b = rows[0][1]
    for warps in (8,):
        rows.append((graph_us(kind_fn(kind, 64, (*b[:3], warps))), (*b[:3], warps)))
    rows.sort()
    best[kind] = rows[0][1]
    print(f"{kind}: cuBLAS path {graph_us(cublas_kind_fn(kind, 64)):.2f} us; best tiles "
          + "  ".join(f"{c} {t:.2f}" for t, c in rows[:5]), flush=True)
print(f"sweep {time.time() - t0:.0f} s", flush=True)


def chain(x, res, how):
    for w in layers:
        if how == "cublas":
            h, res = fused.rms_norm(x, w["n1"], 1e-6, res)
            y = F.linear(h, w["qkv"])
            z = F.linear(y[:, :Q], w["o"])
            h, res = fused.rms_norm(z, w["n2"], 1e-6, res)
            x = F.linear(fused.silu_and_mul(F.linear(h, w["gate_up"])), w["down"])
        else:
            y, res = launch(x, w["qkv"], nw=w["n1"], res=res, cfg=best["qkv+norm"])
            a = y[:, :Q]
            z = F.linear(a, w["o"]) if how == "fold-cub" else launch(a, w["o"], cfg=best["o"])[0]
            act, res = launch(z, w["gate_up"], nw=w["n2"], res=res, silu=True, cfg=best["gate_up+norm+silu"])
            x = F.linear(act, w["down"]) if how == "fold-cub" else launch(act, w["down"], cfg=best["down"])[0]
    return x


for m in (64, 48, 32, 16, 8, 4, 3):
    x, res = rand(m, H, scale=1.0), rand(m, H, scale=1.0)
    row = {f"{how}{i}": graph_us(lambda: chain(x, res, how))
           for i, how in enumerate(("cublas", "fold-cub", "fold-tc", "cublas"))}
    print(f"rows {m}: us a layer " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
