"""Probe (stop 19): the decode plan over contexts of mixed lengths. `plan_units` cuts every context into units of
about sum/target tokens, the count per sequence rounded to nearest, so a unit may hold up to 1.5x the mean and the
wave waits for it. Times the decode kernel alone (Qwen3-0.6B heads, block 16, 20 launches in a CUDA graph) under
candidate rules: rounding to nearest or up, and targets of 1, 1.5 or 2 waves; equal contexts and spread ones
(uniform in [mean/3, 5 mean/3]) of the same total.

    PYTHONPATH=... python docs/gpu_runs/stop19_plan_probe.py
"""
from __future__ import annotations

import random

import numpy as np
import torch

from common.engine.attention import triton_ops
from common.engine.attention.decode_plan import (MIN_UNIT_TOKENS, PLAN_ROWS, UNIT_GRANULE, DecodePlan, _cdiv,
                                                 _round_up, wave_units)

HQ, HKV, D, PAGE = 16, 8, 128, 16
dev = torch.device("cuda")


def plan(lens: list[int], target: int, rounding: str) -> DecodePlan:
    chunk = _round_up(max(MIN_UNIT_TOKENS, _cdiv(sum(lens), target)), UNIT_GRANULE)
    rows = [[] for _ in range(PLAN_ROWS)]
    for i, length in enumerate(lens):
        n = _cdiv(length, chunk) if rounding == "ceil" else max((2 * length + chunk) // (2 * chunk), 1)
        per = _round_up(_cdiv(length, n), UNIT_GRANULE)
        n = _cdiv(length, per)
        rows[3].append(len(rows[0]))
        rows[4].append(n)
        for k in range(n):
            rows[0].append(i), rows[1].append(k * per), rows[2].append(min((k + 1) * per, length))
    if max(rows[4]) == 1:
        return DecodePlan(None, False)
    cap = len(lens) + target  # the engine's capacity (plan_capacity) for this target
    table = np.full((PLAN_ROWS, cap), -1, np.int64)
    table[3:, :] = 0
    for r in range(3):
        table[r, :len(rows[r])] = rows[r]
    table[1:3, len(rows[0]):] = 0
    for r in (3, 4):
        table[r, :len(rows[r])] = rows[r]
    return DecodePlan(torch.from_numpy(table).to(dev, torch.int32), True)


def timed(fns, reps=20) -> float:
    """Per launch, the best of 5 replays of a graph of `reps` launches cycling through `fns` (distinct caches,
    together past L2, as a step's layers are)."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fns[i % len(fns)]()
    g.replay()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) / reps * 1e3)
    return best


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    wave = wave_units(HKV, dev)
    rng = random.Random(0)
    rules = [("nearest", 1.0), ("nearest", 1.5), ("nearest", 2.0), ("ceil", 1.5), ("ceil", 2.0)]
    print("rule: " + ", ".join(f"{r} x{m:g}" for r, m in rules) + " (us; units)", flush=True)
    for batch in (16, 32, 48, 64, 96, 128):
        for mean in (512, 1024, 2048):
            spread = [rng.randint(mean // 3, 5 * mean // 3) for _ in range(batch)]
            for kind, lens in (("equal", [mean] * batch), ("spread", spread)):
                pages = max(lens) // PAGE + 1
                copies = max(2, -(-4 * 50 * 2**20 // (2 * sum(lens) * HKV * D * 2)))  # >= 4x a 50 MB L2
                caches = []
                for _ in range(copies):
                    kc = torch.randn(batch * pages + 1, PAGE, HKV, D, device=dev, dtype=torch.bfloat16)
                    tables = torch.randperm(batch * pages + 1, device=dev)[:batch * pages].view(batch, pages).int()
                    caches.append((kc, torch.randn_like(kc), tables))
                seq_lens = torch.tensor(lens, device=dev, dtype=torch.int32)
                q = torch.randn(batch, HQ, D, device=dev, dtype=torch.bfloat16)
                out = torch.empty_like(q)
                cells, ref = [], None
                for rounding, mult in rules:
                    p = plan(lens, int(wave * mult), rounding)
                    fns = [lambda c=c: triton_ops.paged_decode_attention(q, c[0], c[1], c[2], seq_lens, D ** -0.5,
                                                                         out=out, plan=p) for c in caches]
                    got = fns[0]().float().clone()
                    if ref is None:
                        ref = got
                    err = (got - ref).abs().max().item()
                    assert err < 2e-2, err
                    units = int((p.units[0] >= 0).sum()) if p.split else batch
                    cells.append(f"{timed(fns):6.1f} ({units})")
                print(f"batch {batch:>3} mean {mean:>4} {kind:<6}: " + "  ".join(cells), flush=True)
                del caches


if __name__ == "__main__":
    main()
