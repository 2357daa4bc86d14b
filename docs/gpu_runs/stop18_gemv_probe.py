"""Probe (stop 18): a Qwen3-0.6B decode layer's projections at a few rows, 28 layers of distinct weights in one
CUDA graph, three ways: cuBLAS (+ silu_and_mul), gemv.py without PDL, gemv.py and the RMSNorm with PDL.
Prints us a layer (graph replay time / 28). Also checks gemv against F.linear.

    PYTHONPATH=... python docs/gpu_runs/stop18_gemv_probe.py
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from common.engine import pdl
from common.engine.layers import fused, gemv as gemv_mod

H, Q, KV, I, LAYERS = 1024, 2048, 1024, 3072, 28
dev = torch.device("cuda")
torch.manual_seed(0)
layers = [dict(qkv=torch.randn(Q + 2 * KV, H, device=dev, dtype=torch.bfloat16) * 0.02,
               o=torch.randn(H, Q, device=dev, dtype=torch.bfloat16) * 0.02,
               gate_up=torch.randn(2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02,
               down=torch.randn(H, I, device=dev, dtype=torch.bfloat16) * 0.02,
               n1=torch.ones(H, device=dev, dtype=torch.bfloat16), n2=torch.ones(H, device=dev, dtype=torch.bfloat16))
          for _ in range(LAYERS)]


def chain(x, res, how):
    for w in layers:
        h, res = fused.rms_norm(x, w["n1"], 1e-6, res)
        if how == "cublas":
            y = F.linear(h, w["qkv"])
            z = F.linear(y[:, :Q].contiguous(), w["o"])
            h, res = fused.rms_norm(z, w["n2"], 1e-6, res)
            x = F.linear(fused.silu_and_mul(F.linear(h, w["gate_up"])), w["down"])
        else:
            y = gemv_mod.gemv(h, w["qkv"])
            z = gemv_mod.gemv(y[:, :Q].contiguous(), w["o"])
            h, res = fused.rms_norm(z, w["n2"], 1e-6, res)
            x = gemv_mod.gemv(gemv_mod.gemv(h, w["gate_up"]), w["down"], silu=True)
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


def check():
    for m in (1, 3, 8):
        for name, (n, k) in dict(qkv=(4096, 1024), o=(1024, 2048), down=(1024, 3072)).items():
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
            err = (gemv_mod.gemv(x, w).float() - F.linear(x, w).float()).abs().max().item()
            xs = torch.randn(m, 2 * k, device=dev, dtype=torch.bfloat16)
            err2 = (gemv_mod.gemv(xs, w, silu=True).float() - F.linear(fused.silu_and_mul(xs), w).float()).abs().max()
            print(f"check m={m} {name}: max |gemv - F.linear| {err:.4f}, silu {err2.item():.4f}", flush=True)


print(torch.cuda.get_device_name(), "pdl", pdl.pdl_enabled(dev), flush=True)
check()
for m in (1, 2, 4, 8):
    a = time_graph(m, "cublas")
    b = time_graph(m, "gemv")
    print(f"rows {m}: us a layer (norm, qkv, o, norm, gate_up, down): cublas {a:.2f}  gemv{'+pdl' if pdl.pdl_enabled(dev) else ''} {b:.2f}",
          flush=True)
if os.environ.get("PDCLUSTER_PDL") != "0":
    print("(rerun with PDCLUSTER_PDL=0 for gemv without PDL)")
