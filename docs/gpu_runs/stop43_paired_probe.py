"""Stop 43 (issue 20): the paired GEMMs (common/engine/layers/paired_gemm.py) against what they replace, timed as
a chain of Qwen3-0.6B's 28 layers (distinct weights, so none stays in L2), each an add+RMSNorm (PDL, as in the step)
then:
- qkv: cuBLAS's F.linear + fused.qk_norm_rope_ (the q/k norms, RoPE, the K/V store), or one qkv_rope kernel;
- gate_up: cuBLAS's F.linear + fused.silu_and_mul, or one gate_up_silu kernel;
over the tilings listed (K split across programs, the last of a tile summing the parts, or not), at 64 rows, then
the fastest at 8 and 32. Microseconds a layer (`scripts/bench_gpu.graph_us`;
the chain of norms alone printed for reference), alternated, two rounds. The outputs against the two-kernel path's
are printed too (max abs difference: summation order only).

Run: python docs/gpu_runs/stop43_paired_probe.py [--quick]
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.engine.layers import fused  # noqa: E402
import stop43_paired_gemm as pg  # noqa: E402  (beside this script)
from common.engine.layers.rotary import RotaryEmbedding  # noqa: E402
from scripts.bench_gpu import graph_us  # noqa: E402

LAYERS, HIDDEN, HQ, HKV, D, INTER, PAGE, EPS = 28, 1024, 16, 8, 128, 3072, 16, 1e-6
DT = torch.bfloat16


class Setup:
    def __init__(self, rows: int):
        g = torch.Generator(device="cuda").manual_seed(0)
        def rnd(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, device="cuda", generator=g) * 0.05).to(DT)
        self.rows = rows
        self.wqkv = [rnd((HQ + 2 * HKV) * D, HIDDEN) for _ in range(LAYERS)]
        self.wgu = [rnd(2 * INTER, HIDDEN) for _ in range(LAYERS)]
        self.norm_w = rnd(HIDDEN) + 1
        self.qw, self.kw = rnd(D) + 1, rnd(D) + 1
        self.x, self.residual = rnd(rows, HIDDEN) * 20, rnd(rows, HIDDEN) * 20
        self.cos_sin = RotaryEmbedding(D, 40960, 1e6, None).cos_sin.cuda()
        self.positions = torch.randint(0, 1024, (rows,), device="cuda")
        blocks = 4 * rows
        self.k_cache = torch.zeros(blocks, PAGE, HKV, D, device="cuda", dtype=DT)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.slots = torch.randperm(blocks * PAGE, device="cuda")[:rows]
        self.works: dict[tuple[str, pg.Tiling], pg.Workspace] = {}

    def norm(self) -> torch.Tensor:
        return fused.rms_norm(self.x, self.norm_w, EPS, self.residual)[0]

    def qkv_ref(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        out = F.linear(h, self.wqkv[layer])
        q, k, v = out.split([HQ * D, HKV * D, HKV * D], dim=-1)
        fused.qk_norm_rope_(q.view(-1, HQ, D), k.view(-1, HKV, D), self.positions, self.cos_sin, self.qw, self.kw,
                            EPS, v.view(-1, HKV, D), self.k_cache, self.v_cache, self.slots)
        return out

    def work(self, kind: str, tiling: pg.Tiling) -> pg.Workspace:
        """One workspace a tiling, made before the graph is captured (its counters zeroed once)."""
        if (kind, tiling) not in self.works:
            tiles = (HQ + 2 * HKV) if kind == "qkv" else INTER // tiling.block_n
            tiles *= -(-self.rows // tiling.block_m)
            if kind == "qkv":
                tiling = dataclasses.replace(tiling, block_n=D // 2)
            self.works[kind, tiling] = pg.Workspace.make(tiles, tiling, torch.device("cuda"))
        return self.works[kind, tiling]

    def qkv_paired(self, layer: int, h: torch.Tensor, tiling: pg.Tiling) -> torch.Tensor:
        return pg.qkv_rope(h, self.wqkv[layer], self.positions, self.cos_sin, HQ, HKV, D, self.qw, self.kw, EPS,
                           self.k_cache, self.v_cache, self.slots, tiling, self.work("qkv", tiling))

    def gu_ref(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        return fused.silu_and_mul(F.linear(h, self.wgu[layer]))

    def gu_paired(self, layer: int, h: torch.Tensor, tiling: pg.Tiling) -> torch.Tensor:
        return pg.gate_up_silu(h, self.wgu[layer], tiling, self.work("gate_up", tiling))


def per_layer(s: Setup, step) -> float:
    def chain() -> None:
        for layer in range(LAYERS):
            step(layer, s.norm())
    return graph_us(chain, reps=20) / LAYERS


def tilings(kind: str, quick: bool) -> list[pg.Tiling]:
    """Stop 43's first call found one program a tile best for neither (qkv: 32 tiles of a head each); its best
    of those is kept for reference, then K split across 2-8 programs a tile, the last summing."""
    unsplit = pg.Tiling(32, 64, 128, 4, 4) if kind == "qkv" else pg.Tiling(64, 32, 128, 4, 4)
    ns = [64] if kind == "qkv" else [32, 64]
    ms, warps = ([64], [4]) if quick else ([16, 32, 64], [4, 8]) if kind == "qkv" else ([32, 64], [4])
    ks = [(2, 256), (4, 256), (8, 128)] if quick else [(s, k) for s in (2, 4, 8) for k in (64, 128, 256)
                                                          if k <= HIDDEN // s]
    return [unsplit] + [pg.Tiling(m, n, k, w, 3, s) for m, n, (s, k), w in itertools.product(ms, ns, ks, warps)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    s = Setup(64)
    h = s.norm()
    for kind, ref, paired in (("qkv", s.qkv_ref, s.qkv_paired), ("gate_up", s.gu_ref, s.gu_paired)):
        want = ref(0, h).float()
        got = paired(0, h, pg.Tiling(64, 64, 128, 4, 3, 4)).float()
        again = [torch.equal(paired(0, h, pg.Tiling(64, 64, 128, 4, 3, 4)).float(), got) for _ in range(20)]
        print(f"{kind}: max |paired (4 splits) - two kernels| {(got - want).abs().max().item():.3g} "
              f"(max |out| {want.abs().max().item():.3g}); the same again {sum(again)} of 20", flush=True)
    norms = per_layer(s, lambda layer, h: None)
    print(f"64 rows: the add+RMSNorm chain alone {norms:.2f} us a layer", flush=True)
    best: dict[str, list[pg.Tiling]] = {}
    for kind, ref, paired in (("qkv", s.qkv_ref, s.qkv_paired), ("gate_up", s.gu_ref, s.gu_paired)):
        times = {}
        for t in tilings(kind, args.quick):
            try:
                times[t] = per_layer(s, lambda layer, h, t=t: paired(layer, h, t))
            except Exception as e:  # noqa: BLE001: a tiling over the GPU's shared memory
                print(f"{kind} {t}: {type(e).__name__}", flush=True)
        ranked = sorted(times, key=times.get)
        for t in ranked[:10]:
            print(f"{kind} 64 rows {t}: {times[t]:.2f} us a layer", flush=True)
        best[kind] = ranked[:3]
    for rows in (64, 32, 8):
        s = Setup(rows)
        for kind, ref, paired in (("qkv", s.qkv_ref, s.qkv_paired), ("gate_up", s.gu_ref, s.gu_paired)):
            for round_ in (1, 2):
                line = f"{kind} {rows} rows, round {round_}: two kernels {per_layer(s, ref):.2f}"
                for t in best[kind]:
                    line += f"; m{t.block_m} n{t.block_n} k{t.block_k} w{t.warps} s{t.stages} x{t.splits} "
                    line += f"{per_layer(s, lambda layer, h, t=t: paired(layer, h, t)):.2f}"
                print(line + " us a layer (norm included)", flush=True)


if __name__ == "__main__":
    main()
