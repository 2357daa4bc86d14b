"""Probe (stop 39): does one persistent kernel a layer beat the chain of projections in the batch-64 decode step?

At 64 rows each of a Qwen3-0.6B layer's projections costs 5-7 us whatever its weight's size (stops 18-29): latency
of a kernel in a chain (its launch, ramp, K loop and tail), not HBM. This times 28 layers of the chain after
attention, o -> gate_up (SiLU-and-mul) -> down -> qkv, in one CUDA graph:
- the engine's way: cuBLAS for each projection (F.linear) and the engine's SiLU-and-mul kernel between;
- one Triton kernel a layer, one program an SM, the four projections as stages split into column tiles among the
  programs, a grid-wide barrier (an atomic count) between stages; SiLU-and-mul applied to the gate_up tile before
  it is stored. Variants: weights read as they come (`none`); each program's tiles of all four stages brought into
  L2 at the kernel's start (`all`, prefetch.global.L2 a 128-byte line), so the whole layer's weights stream at once
  while the stages run; each stage's tiles brought in just before the barrier ahead of it (`next`).
Outputs are checked against the cuBLAS chain's. A barrier that spins too long gives up (the output is then wrong
and the check says so) rather than hang the GPU.

    PYTHONPATH=... python docs/gpu_runs/stop39_persistent_layer_probe.py
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

H, Q, KV, I, LAYERS, ROWS = 1024, 2048, 1024, 3072, 28, 64
MAX_SPINS = tl.constexpr(1 << 15)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _grid_sync(bar_ptr, target):
    """Every program arrives; returns once `target` programs have (the count rises over a launch's barriers)."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    spins = 0
    while (tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu") < target) & (spins < MAX_SPINS):
        spins += 1
    tl.debug_barrier()


@triton.jit
def _prefetch(w_ptr, tile, BYTES: tl.constexpr):
    """prefetch.global.L2 over one tile's rows of W (contiguous, BYTES of them), 256 lines at a time."""
    lines = tl.arange(0, 256)
    base = w_ptr.to(tl.pointer_type(tl.int8)) + tile.to(tl.int64) * BYTES
    for start in tl.static_range(0, BYTES, 256 * 128):
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [base + start + lines * 128],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_stage(w_ptr, pid, nprog, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, SILU: tl.constexpr):
    for t in range(pid, N // BN, nprog):
        _prefetch(w_ptr, t, BN * K * 2)
        if SILU:
            _prefetch(w_ptr, t + N // BN, BN * K * 2)


@triton.jit
def _stage(x_ptr, w_ptr, out_ptr, pid, nprog, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
           BN: tl.constexpr, BK: tl.constexpr, SILU: tl.constexpr):
    """out[M, N] = x[M, K] @ W[N, K]^T over the program's column tiles; with SILU, W is [gate | up] (2N rows) and
    out = silu(x W_gate^T) * (x W_up^T), rounded as the engine's kernels round."""
    rows = tl.arange(0, M)
    for t in range(pid, N // BN, nprog):
        cols = t * BN + tl.arange(0, BN)
        acc = tl.zeros([M, BN], dtype=tl.float32)
        acc_up = tl.zeros([M, BN], dtype=tl.float32)
        for k0 in tl.range(0, K, BK, num_stages=3):
            ks = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], cache_modifier=".cg")
            w = tl.load(w_ptr + cols[:, None].to(tl.int64) * K + ks[None, :])
            acc = tl.dot(x, tl.trans(w), acc)
            if SILU:
                w_up = tl.load(w_ptr + (N + cols)[:, None].to(tl.int64) * K + ks[None, :])
                acc_up = tl.dot(x, tl.trans(w_up), acc_up)
        if SILU:
            gate = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
            up = acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
            acc = act * up
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc.to(out_ptr.dtype.element_ty))


@triton.jit
def _layer_kernel(x_ptr, wo_ptr, wgu_ptr, wd_ptr, wqkv_ptr, h1_ptr, h2_ptr, h3_ptr, out_ptr, bar_ptr,
                  M: tl.constexpr, H: tl.constexpr, Q: tl.constexpr, I: tl.constexpr, QKV: tl.constexpr,
                  BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr, BN_QKV: tl.constexpr,
                  BK: tl.constexpr, PREFETCH: tl.constexpr, ONLY: tl.constexpr):
    """PREFETCH 0: none; 1: every stage's tiles at the start; 2: each stage's just before the barrier ahead of it.
    ONLY -1: all four stages with barriers between; 0-3: that stage alone (one launch a stage, no barrier); -2: the
    barriers alone (what they cost)."""
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    if PREFETCH >= 1:
        _prefetch_stage(wo_ptr, pid, nprog, H, Q, BN_O, False)
    if PREFETCH == 1:
        _prefetch_stage(wgu_ptr, pid, nprog, I, H, BN_GU, True)
        _prefetch_stage(wd_ptr, pid, nprog, H, I, BN_D, False)
        _prefetch_stage(wqkv_ptr, pid, nprog, QKV, H, BN_QKV, False)
    if ONLY == -1 or ONLY == 0:
        _stage(x_ptr, wo_ptr, h1_ptr, pid, nprog, M, H, Q, BN_O, BK, False)
    if PREFETCH == 2:
        _prefetch_stage(wgu_ptr, pid, nprog, I, H, BN_GU, True)
    if ONLY < 0:
        _grid_sync(bar_ptr, nprog)
    if ONLY == -1 or ONLY == 1:
        _stage(h1_ptr, wgu_ptr, h2_ptr, pid, nprog, M, I, H, BN_GU, BK, True)
    if PREFETCH == 2:
        _prefetch_stage(wd_ptr, pid, nprog, H, I, BN_D, False)
    if ONLY < 0:
        _grid_sync(bar_ptr, 2 * nprog)
    if ONLY == -1 or ONLY == 2:
        _stage(h2_ptr, wd_ptr, h3_ptr, pid, nprog, M, H, I, BN_D, BK, False)
    if PREFETCH == 2:
        _prefetch_stage(wqkv_ptr, pid, nprog, QKV, H, BN_QKV, False)
    if ONLY < 0:
        _grid_sync(bar_ptr, 3 * nprog)
    if ONLY == -1 or ONLY == 3:
        _stage(h3_ptr, wqkv_ptr, out_ptr, pid, nprog, M, QKV, H, BN_QKV, BK, False)


def make_layers(device: torch.device, layers: int, dtype: torch.dtype) -> list[dict[str, torch.Tensor]]:
    shapes = {"o": (H, Q), "gate_up": (2 * I, H), "down": (H, I), "qkv": (Q + 2 * KV, H)}
    return [{k: torch.randn(*s, device=device, dtype=dtype) * 0.02 for k, s in shapes.items()}
            for _ in range(layers)]


class Chain:
    """28 layers' buffers; `cublas()` and `persistent()` each run the chain of every layer. (float32 checks the
    indexing under Triton's interpreter, whose bfloat16 dot is wrong.)"""

    def __init__(self, device: torch.device, layers: int, nprog: int, dtype: torch.dtype = torch.bfloat16):
        self.ws = make_layers(device, layers, dtype)
        self.x = torch.randn(ROWS, Q, device=device, dtype=dtype)
        self.bufs = [{"h1": torch.empty(ROWS, H, device=device, dtype=dtype),
                      "h2": torch.empty(ROWS, I, device=device, dtype=dtype),
                      "h3": torch.empty(ROWS, H, device=device, dtype=dtype),
                      "out": torch.empty(ROWS, Q + 2 * KV, device=device, dtype=dtype)}
                     for _ in range(layers)]
        self.bars = torch.zeros(layers, 32, dtype=torch.int32, device=device)  # a count a layer, 128 B apart
        self.nprog = nprog

    def cublas(self, silu_and_mul) -> list[torch.Tensor]:
        outs = []
        for w in self.ws:
            h1 = F.linear(self.x, w["o"])
            h2 = silu_and_mul(F.linear(h1, w["gate_up"]))
            outs.append(F.linear(F.linear(h2, w["down"]), w["qkv"]))
        return outs

    def persistent(self, prefetch: int = 0, tiles: tuple[int, int, int, int] = (16, 32, 16, 32), bk: int = 128,
                   warps: int = 4, only: int = -1, hot: bool = False) -> list[torch.Tensor]:
        """`only` -1: one launch a layer; 0: one a stage; -2: the barriers alone. `hot`: every layer with the first
        layer's weights (in L2 after the first)."""
        self.bars.zero_()
        ws = [self.ws[0]] * len(self.ws) if hot else self.ws
        for w, b, bar in zip(ws, self.bufs, self.bars):
            args = (self.x, w["o"], w["gate_up"], w["down"], w["qkv"], b["h1"], b["h2"], b["h3"], b["out"], bar)
            kw = dict(M=ROWS, H=H, Q=Q, I=I, QKV=Q + 2 * KV, BN_O=tiles[0], BN_GU=tiles[1], BN_D=tiles[2],
                      BN_QKV=tiles[3], BK=bk, PREFETCH=prefetch, num_warps=warps)
            if only < 0:
                _layer_kernel[(self.nprog,)](*args, ONLY=only, **kw)
            else:  # one launch a stage: the same arithmetic without barriers (Triton's interpreter)
                for stage in range(4):
                    _layer_kernel[(self.nprog,)](*args, ONLY=stage, **kw)
        return [b["out"] for b in self.bufs]


def check(chain: Chain, silu_and_mul, **kw) -> float:
    """The largest difference between the persistent chain's and cuBLAS's output, over the largest output."""
    ref = chain.cublas(silu_and_mul)
    got = chain.persistent(**kw)
    return max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(got, ref))


def main() -> None:
    from common.engine.layers.activation import silu_and_mul
    from scripts.bench_gpu import graph_us

    torch.manual_seed(0)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(props.name, f"{props.multi_processor_count} SMs", flush=True)
    chain = Chain(dev, LAYERS, props.multi_processor_count)
    base = graph_us(lambda: chain.cublas(silu_and_mul), reps=50) / LAYERS
    print(f"cuBLAS chain (o, gate_up, SiLU-and-mul, down, qkv): {base:.2f} us a layer", flush=True)
    configs = [((16, 32, 16, 32), 128, 4), ((16, 32, 16, 32), 128, 8), ((16, 16, 16, 32), 128, 4),
               ((16, 32, 16, 32), 64, 4), ((16, 16, 16, 16), 256, 4)]
    us = graph_us(lambda: chain.persistent(only=-2), reps=50) / LAYERS
    print(f"a launch and three barriers, no stage: {us:.2f} us a layer", flush=True)
    for hot in (False, True):
        us = graph_us(lambda: chain.persistent(only=0, hot=hot), reps=50) / LAYERS
        print(f"the four stages as four launches (no barrier){', weights hot in L2' if hot else ''}: {us:.2f} us a "
              f"layer", flush=True)
    us = graph_us(lambda: chain.persistent(hot=True), reps=50) / LAYERS
    print(f"persistent, weights hot in L2: {us:.2f} us a layer", flush=True)
    configs = [((16, 32, 16, 32), 128, 4), ((16, 32, 16, 32), 128, 8), ((16, 16, 16, 32), 128, 4),
               ((16, 32, 16, 32), 64, 4), ((16, 16, 16, 16), 256, 4)]
    for prefetch in (0, 1, 2):
        for tiles, bk, warps in configs:
            kw = dict(prefetch=prefetch, tiles=tiles, bk=bk, warps=warps)
            try:
                err = check(chain, silu_and_mul, **kw)
                us = graph_us(lambda: chain.persistent(**kw), reps=50) / LAYERS
            except Exception as e:  # noqa: BLE001 (a tiling Triton cannot compile: say so, go on)
                print(f"persistent {kw}: failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
                continue
            print(f"persistent, prefetch {('none', 'all', 'next')[prefetch]}, tiles {tiles}, BK {bk}, {warps} warps: "
                  f"{us:.2f} us a layer ({us / base:.2f}x cuBLAS), error {err:.4f}", flush=True)

if __name__ == "__main__":
    main()
