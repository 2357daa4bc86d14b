"""Probe (stop 29): can the batch-64 decode step's GEMMs read their weights from L2, fetched while attention runs?

In a Qwen3-0.6B decode step at 64 sequences of 1,024 tokens on an H200, attention streams each layer's KV
(268 MB) at about 93% of the copy bandwidth, while the four projections read their 30 MB of weights at 1.2-2 TB/s
(`bench_engine profile --batch 64`): small GEMMs, bound by latency rather than bandwidth. This times 28 layers of
[attention stand-in, qkv, o, gate_up, down] in one CUDA graph, the stand-in a kernel streaming 268 MB, with and
without a second stream that loads the layer's o/gate_up/down and the next layer's qkv weights into L2 while the
stand-in runs; the stand-in's loads plain or evict_first, the prefetch's plain or evict_last. Also the GEMMs alone,
with distinct weights (cold) and with one layer's weights repeated (hot in L2): the most the prefetch could give.

    PYTHONPATH=... python docs/gpu_runs/stop29_l2_prefetch_probe.py
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from scripts.bench_gpu import graph_us

H, Q, KV, I, LAYERS, ROWS = 1024, 2048, 1024, 3072, 28, 64
KV_BYTES = 64 * 1024 * 114688 // 28  # a layer's K and V of 64 sequences of 1,024 tokens
dev = torch.device("cuda")


@triton.jit
def _stream_kernel(src_ptr, sink_ptr, n, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    """Reads n int32 (each program BLOCK x 4 of them), as attention reads its KV."""
    base = tl.program_id(0).to(tl.int64) * BLOCK * 4
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(4):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offs, mask=offs < n, other=0, eviction_policy=EVICT)
    total = tl.sum(acc)
    if total == 0x5EED1234:  # never: keeps the loads
        tl.store(sink_ptr, total)


@triton.jit
def _prefetch_kernel(src_ptr, sink_ptr, n, BLOCK: tl.constexpr, EVICT: tl.constexpr, ASM: tl.constexpr):
    """Brings n int32 into L2: loads them (ASM 0) or issues prefetch.global.L2::evict_last per 128 B line (ASM 1)."""
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    step = 32 if ASM else 1  # int32 a 128 B line
    for start in range(pid * BLOCK * step, n, nprog * BLOCK * step):
        offs = start + tl.arange(0, BLOCK) * step
        if ASM:
            ptrs = src_ptr + tl.minimum(offs, n - 1)
            acc += tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                                             [ptrs], dtype=tl.int32, is_pure=False, pack=1)
        else:
            acc += tl.load(src_ptr + offs, mask=offs < n, other=0, eviction_policy=EVICT)
    total = tl.sum(acc)
    if total == 0x5EED1234:
        tl.store(sink_ptr, total)


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), flush=True)
    shapes = {"qkv": (Q + 2 * KV, H), "o": (H, Q), "gate_up": (2 * I, H), "down": (H, I)}
    ws = [{k: torch.randn(*s, device=dev, dtype=torch.bfloat16) * 0.02 for k, s in shapes.items()}
          for _ in range(LAYERS + 1)]
    xs = {"qkv": torch.randn(ROWS, H, device=dev, dtype=torch.bfloat16),
          "o": torch.randn(ROWS, Q, device=dev, dtype=torch.bfloat16),
          "gate_up": torch.randn(ROWS, H, device=dev, dtype=torch.bfloat16),
          "down": torch.randn(ROWS, I, device=dev, dtype=torch.bfloat16)}
    kv = [torch.empty(KV_BYTES // 4, dtype=torch.int32, device=dev) for _ in range(LAYERS)]
    for t in kv:
        t.fill_(1)
    sink = torch.zeros(1, dtype=torch.int32, device=dev)
    side = torch.cuda.Stream()
    outs = {}
    block = 2048

    def stream(layer: int, evict: str) -> None:
        n = kv[layer].numel()
        _stream_kernel[(triton.cdiv(n, block * 4),)](kv[layer], sink, n, BLOCK=block, EVICT=evict, num_warps=8)

    def prefetch(tensors, evict: str, asm: int, progs: int) -> None:
        for t in tensors:
            n = t.numel() * t.element_size() // 4
            _prefetch_kernel[(progs,)](t.view(torch.int32), sink, n, BLOCK=1024, EVICT=evict, ASM=asm, num_warps=4)

    def gemms(layer: int, hot: bool = False) -> None:
        w = ws[0 if hot else layer]
        for k in ("qkv", "o", "gate_up", "down"):
            outs[k] = F.linear(xs[k], w[k])

    def step(kv_evict: str = "", pf: str | None = None, asm: int = 0, progs: int = 32) -> None:
        for layer in range(LAYERS):
            outs["qkv"] = F.linear(xs["qkv"], ws[layer]["qkv"])
            if pf is not None:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    prefetch([ws[layer]["o"], ws[layer]["gate_up"], ws[layer]["down"], ws[layer + 1]["qkv"]],
                             pf, asm, progs)
            stream(layer, kv_evict)
            for k in ("o", "gate_up", "down"):
                outs[k] = F.linear(xs[k], ws[layer][k])
            if pf is not None:
                torch.cuda.current_stream().wait_stream(side)

    cold = graph_us(lambda: [gemms(i) for i in range(LAYERS)], reps=50) / LAYERS
    hot = graph_us(lambda: [gemms(i, hot=True) for i in range(LAYERS)], reps=50) / LAYERS
    alone = graph_us(lambda: [stream(i, "") for i in range(LAYERS)], reps=20) / LAYERS
    print(f"GEMMs alone, distinct weights (cold): {cold:.2f} us a layer", flush=True)
    print(f"GEMMs alone, one layer's weights (hot in L2): {hot:.2f} us a layer", flush=True)
    print(f"attention stand-in alone: {alone:.2f} us a layer ({KV_BYTES / alone / 1e3:.0f} GB/s)", flush=True)
    base = graph_us(lambda: step(), reps=20) / LAYERS
    print(f"layer, no prefetch: {base:.2f} us", flush=True)
    for kv_evict in ("", "evict_first"):
        for pf, asm in (("", 0), ("evict_last", 0), ("", 1)):
            for progs in (16, 66, 132):
                us = graph_us(lambda: step(kv_evict, pf, asm, progs), reps=20) / LAYERS
                how = "prefetch.L2::evict_last" if asm else f"loads {pf or 'plain'}"
                print(f"layer, KV loads {kv_evict or 'plain'}, side stream {how}, {progs} programs: {us:.2f} us "
                      f"({us - base:+.2f})", flush=True)


if __name__ == "__main__":
    main()
