"""Stop 42 (issue 20): split-K's partial kernel (Qwen3-0.6B's o and down, as the engine launches it: 64 x 512
tiles) at 4 warps, where ptxas reports 255 registers and spills (stop42_kernel_registers.py), against 8, timed alone:
a CUDA graph of 200 launches replayed 5 times (the mean a launch, CUDA events), bf16, at 8, 32 and 64 rows;
alternated, two rounds (`scripts/bench_gpu.graph_us`; the figures in docs/benchmarks.md, stop 42, were taken at
398b91b with the same graph, replays and warm replay timed by hand). Alone, not in the step (no kernel before it to
overlap its weight loads with), so a lead for the step's A/B, not its figure.

Run: python docs/gpu_runs/stop42_splitk_warps.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.engine.layers import splitk  # noqa: E402
from scripts.bench_gpu import graph_us  # noqa: E402


def partial_us(x: torch.Tensor, w: torch.Tensor, warps: int, launches: int = 200, replays: int = 5) -> float:
    (m, k), n = x.shape, w.shape[0]
    part = torch.empty(k // splitk.BLOCK_K, splitk.MAX_ROWS, n, dtype=torch.float32, device=x.device)

    def launches_() -> None:
        for _ in range(launches):
            splitk._partial_kernel[(n // splitk.BLOCK_N, k // splitk.BLOCK_K)](
                x, w, part, m, x.stride(0), N=n, K=k, ROWS=splitk.MAX_ROWS, BLOCK_N=splitk.BLOCK_N,
                BLOCK_K=splitk.BLOCK_K, PDL=False, num_warps=warps)
    return graph_us(launches_, reps=replays, warmup=1) / launches


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    for name, (n, k) in {"o": (1024, 2048), "down": (1024, 3072)}.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for rows in (8, 32, 64):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            got = {4: [], 8: []}
            for _ in range(2):
                for warps in (4, 8):
                    got[warps].append(partial_us(x, w, warps))
            print(f"{name:4s} rows {rows:2d}: 4 warps " + " / ".join(f"{t:.2f}" for t in got[4]) +
                  " us, 8 warps " + " / ".join(f"{t:.2f}" for t in got[8]) + " us", flush=True)


if __name__ == "__main__":
    main()
