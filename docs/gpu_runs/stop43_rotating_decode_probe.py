"""Stop 43 (issue 20): decode attention that rotates q and the step's k itself and stores k and v
(`paged_decode_attention(..., rotary=DecodeRotary(...))`, capped at 128 registers) against the engine's two kernels
(fused.qk_norm_rope_, then paged_decode_attention), as a chain of Qwen3-0.6B's 28 layers: the qkv projection
(cuBLAS), then either. Each layer its own KV cache; context 1,024; batches 64 (one program a sequence), 32 and 8
(split plans). Microseconds a layer from a CUDA graph, alternated, two rounds; then the outputs and caches of one
layer against the two-kernel path's.

Not in the engine: run on a tree with docs/gpu_runs/stop43_rotating_decode.patch applied (`git apply`), as it ran.

Run: python docs/gpu_runs/stop43_rotating_decode_probe.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.engine.attention import triton_ops  # noqa: E402
from common.engine.attention.decode_plan import plan_decode  # noqa: E402
from common.engine.layers import fused  # noqa: E402
from common.engine.layers.rotary import RotaryEmbedding  # noqa: E402
from scripts.bench_gpu import graph_us  # noqa: E402

LAYERS, HIDDEN, HQ, HKV, D, PAGE, CONTEXT, EPS = 28, 1024, 16, 8, 128, 16, 1024, 1e-6
DT = torch.bfloat16


class Setup:
    def __init__(self, batch: int):
        self.batch = batch
        blocks = batch * CONTEXT // PAGE
        self.caches = [(torch.randn(blocks, PAGE, HKV, D, device="cuda", dtype=DT),
                        torch.randn(blocks, PAGE, HKV, D, device="cuda", dtype=DT)) for _ in range(LAYERS)]
        self.wqkv = [torch.randn((HQ + 2 * HKV) * D, HIDDEN, device="cuda", dtype=DT) * 0.03 for _ in range(LAYERS)]
        self.x = torch.randn(batch, HIDDEN, device="cuda", dtype=DT)
        self.tables = torch.arange(blocks, device="cuda", dtype=torch.int32).view(batch, -1)
        self.lens = torch.full((batch,), CONTEXT, device="cuda", dtype=torch.int32)
        self.positions = (self.lens - 1).long()
        self.slots = (self.tables[:, -1].long() * PAGE + PAGE - 1)
        self.plan = plan_decode([CONTEXT] * batch, HKV, torch.device("cuda"))
        self.cos_sin = RotaryEmbedding(D, 40960, 1e6, None).cos_sin.cuda()
        self.qw = torch.randn(D, device="cuda", dtype=DT) * 0.1 + 1
        self.kw = torch.randn(D, device="cuda", dtype=DT) * 0.1 + 1

    def split(self, layer: int):
        qkv = F.linear(self.x, self.wqkv[layer])
        return [t.view(self.batch, -1, D) for t in qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)]

    def two_kernels(self, layer: int) -> torch.Tensor:
        q, k, v = self.split(layer)
        kc, vc = self.caches[layer]
        fused.qk_norm_rope_(q, k, self.positions, self.cos_sin, self.qw, self.kw, EPS, v, kc, vc, self.slots)
        return triton_ops.paged_decode_attention(q, kc, vc, self.tables, self.lens, D ** -0.5, plan=self.plan)

    def rotating(self, layer: int) -> torch.Tensor:
        q, k, v = self.split(layer)
        kc, vc = self.caches[layer]
        rotary = triton_ops.DecodeRotary(k, v, self.positions, self.cos_sin, self.qw, self.kw, EPS, self.slots)
        return triton_ops.paged_decode_attention(q, kc, vc, self.tables, self.lens, D ** -0.5, plan=self.plan,
                                                 rotary=rotary)


def per_layer(fn) -> float:
    return graph_us(lambda: [fn(layer) for layer in range(LAYERS)], reps=10) / LAYERS


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    for batch in (64, 32, 8):
        s = Setup(batch)
        for round_ in (1, 2):
            print(f"batch {batch} (split plan {s.plan.split}), round {round_}: two kernels "
                  f"{per_layer(s.two_kernels):.2f} us a layer, rotating {per_layer(s.rotating):.2f}", flush=True)
        k0, v0 = (c.clone() for c in s.caches[0])
        want = s.two_kernels(0)
        k1, v1 = (c.clone() for c in s.caches[0])
        s.caches[0][0].copy_(k0)
        s.caches[0][1].copy_(v0)
        got = s.rotating(0)
        print(f"batch {batch}: outputs equal {torch.equal(got, want)} (max |diff| "
              f"{(got.float() - want.float()).abs().max().item():.3g}), caches equal "
              f"{torch.equal(s.caches[0][0], k1)} {torch.equal(s.caches[0][1], v1)}", flush=True)
    kernels = triton_ops._decode_kernel.device_caches[0][0].values()
    print("decode variants (registers, spills):", sorted((k.n_regs, k.n_spills) for k in kernels), flush=True)


if __name__ == "__main__":
    main()
