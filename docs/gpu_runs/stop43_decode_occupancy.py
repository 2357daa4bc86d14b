"""Stop 43 (issue 20): decode attention's registers, spills and shared memory as compiled on the GPU, and how many of
its programs an SM holds, for the engine's Qwen3-0.6B variants (batch 64: one program a sequence; batch 8: a split
plan), with the kernel alone timed at batch 64. Run from a tree's root to read that tree's kernel (the early-tile
patch, docs/gpu_runs/stop43_decode_early_tile.patch, against the engine's).

Run: python docs/gpu_runs/stop43_decode_occupancy.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd()))
from common.engine.attention import triton_ops  # noqa: E402
from common.engine.attention.decode_plan import plan_decode  # noqa: E402
from scripts.bench_gpu import graph_us  # noqa: E402

HQ, HKV, D, PAGE, CONTEXT = 16, 8, 128, 16, 1024


def main() -> None:
    props = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(), f"{props.multi_processor_count} SMs", flush=True)
    for batch in (64, 8):
        blocks = batch * CONTEXT // PAGE
        k_cache = torch.randn(blocks, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        tables = torch.arange(blocks, device="cuda", dtype=torch.int32).view(batch, -1)
        lens = torch.full((batch,), CONTEXT, device="cuda", dtype=torch.int32)
        q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
        plan = plan_decode([CONTEXT] * batch, HKV, q.device)
        run = lambda: triton_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, D ** -0.5,  # noqa: E731
                                                        plan=plan)
        us = graph_us(run, reps=50)
        print(f"batch {batch}: split plan {plan.split}; {us:.1f} us a launch", flush=True)
    for key, kernel in triton_ops._decode_kernel.device_caches[0][0].items():
        regs, spills, shared = kernel.n_regs, kernel.n_spills, kernel.metadata.shared
        threads = kernel.metadata.num_warps * 32
        by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs * threads) if regs else 0
        by_shared = props.shared_memory_per_multiprocessor // shared if shared else 0
        print(f"decode kernel variant: {regs} registers, {spills} spills, {shared} B shared, {threads} threads: "
              f"{min(by_regs, by_shared)} programs an SM (registers {by_regs}, shared {by_shared})", flush=True)


if __name__ == "__main__":
    main()
