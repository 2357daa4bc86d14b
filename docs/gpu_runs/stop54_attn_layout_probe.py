"""Probe (stop 54, issue 20): does the KV pool's order within a page move the batch-64 decode attention?

The engine's pool is kv[block, layer, K/V, slot, head, dim]: a KV head's page is 16 rows of 256 B, 2 KB apart (the
other heads' rows between them). Decode attention reads it at about 94% of a plain read of as many bytes (stop 29).
The engine's kernel (`paged_decode_attention`, unchanged: it takes the cache's strides) on the same 64 sequences of
1,024 tokens (Qwen3-0.6B: 8 KV heads of 128, pages of 16; blocks shuffled) in four pools:
- `engine`: [block, layer, K/V, slot, head, dim];
- `head-major page`: [block, layer, K/V, head, slot, dim] (a head's page 4 KB in one piece; blocks still whole);
- `per layer`: [layer, block, K/V, slot, head, dim] (a layer's blocks next to each other);
- `per layer, head-major`: [layer, block, K/V, head, slot, dim].
Each replayed from a CUDA graph (us a launch, GB/s of KV), alternated, three rounds; then a contiguous read.

    PYTHONPATH=... python docs/gpu_runs/stop54_attn_layout_probe.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.engine.attention import torch_ops, triton_ops  # noqa: E402
from scripts.bench_gpu import graph_us  # noqa: E402
from stop29_attn_read_probe import _read_kernel  # noqa: E402 (stop 29's contiguous read)

LAYERS, PAGE, HKV, HQ, D = 28, 16, 8, 16, 128
BATCH, CONTEXT = 64, 1024
dev = torch.device("cuda")


def pools(num_blocks: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(k_cache, v_cache) of layer 0, each [blocks, slot, head, dim] as the kernel indexes them, by layout."""
    out = {}
    engine = torch.randn(num_blocks, LAYERS, 2, PAGE, HKV, D, dtype=torch.bfloat16, device=dev)
    out["engine"] = (engine[:, 0, 0], engine[:, 0, 1])
    hm = engine.permute(0, 1, 2, 4, 3, 5).contiguous()  # [block, layer, kv, head, slot, dim], the same values
    out["head-major page"] = (hm[:, 0, 0].transpose(1, 2), hm[:, 0, 1].transpose(1, 2))
    del engine
    layer = torch.empty(LAYERS, num_blocks, 2, PAGE, HKV, D, dtype=torch.bfloat16, device=dev)
    layer[0] = hm[:, 0].transpose(2, 3)
    out["per layer"] = (layer[0, :, 0], layer[0, :, 1])
    layer_hm = torch.empty(LAYERS, num_blocks, 2, HKV, PAGE, D, dtype=torch.bfloat16, device=dev)
    layer_hm[0] = hm[:, 0]
    out["per layer, head-major"] = (layer_hm[0, :, 0].transpose(1, 2), layer_hm[0, :, 1].transpose(1, 2))
    return out


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), flush=True)
    triton_ops._check_cache = lambda k, v: None  # the head-major views' head stride is a page, not a head's row
    per_seq = CONTEXT // PAGE
    num_blocks = BATCH * per_seq + 64
    caches = pools(num_blocks)
    tables = torch.randperm(num_blocks, device=dev)[:BATCH * per_seq].view(BATCH, per_seq).to(torch.int32)
    lens = torch.full((BATCH,), CONTEXT, dtype=torch.int32, device=dev)
    q = torch.randn(BATCH, HQ, D, dtype=torch.bfloat16, device=dev)
    scale = D ** -0.5
    gbytes = BATCH * CONTEXT * 2 * HKV * D * 2 / 1e9
    plan = triton_ops.plan_decode([CONTEXT] * BATCH, HKV, dev)
    k0, v0 = caches["engine"]
    ref = torch_ops.paged_decode_attention(q[:4], k0, v0, tables[:4], lens[:4], scale).float()
    outs = {name: torch.empty_like(q) for name in caches}
    runs = {name: (lambda k=k, v=v, o=outs[name]: triton_ops.paged_decode_attention(
        q, k, v, tables, lens, scale, out=o, plan=plan)) for name, (k, v) in caches.items()}
    for name, run in runs.items():
        run()
        print(f"{name}: strides {tuple(caches[name][0].stride())}, max |err| "
              f"{(outs[name][:4].float() - ref).abs().max().item():.4f}", flush=True)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(3):
        for name, run in runs.items():
            times[name].append(graph_us(run, reps=50))
    for name, us in times.items():
        print(f"{name}: " + ", ".join(f"{t:.1f} us ({gbytes / t * 1e6:.0f} GB/s)" for t in us), flush=True)
    del caches
    flat = torch.empty(int(gbytes * 1e9) // 4, dtype=torch.int32, device=dev).fill_(1)
    sink = torch.zeros(1, dtype=torch.int32, device=dev)
    us = graph_us(lambda: _read_kernel[(triton.cdiv(flat.numel(), 8192),)](flat, sink, flat.numel(), BLOCK=2048,
                                                                           num_warps=8), reps=50)
    print(f"contiguous read of as many bytes: {us:.1f} us ({gbytes / us * 1e6:.0f} GB/s)")


if __name__ == "__main__":
    main()
