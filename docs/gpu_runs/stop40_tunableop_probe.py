"""Probe (stop 40): does PyTorch's TunableOp find faster cuBLAS / cuBLASLt algorithms for the batch-64 decode GEMMs?

cuBLAS picks each GEMM's algorithm by its heuristic. TunableOp (torch.cuda.tunable) times the candidates, the
default cuBLAS call and cuBLASLt's heuristic algorithms, and keeps the fastest. This times Qwen3-0.6B's four
projections at 64 rows, 28 back to back in a CUDA graph with distinct weights (as in a decode step), us each: with
TunableOp off, then tuned (the tuning runs eagerly, before the graph is captured). The tuned results go to $TUNED
(default tunableop_results.csv) at exit, which `PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_TUNING=0
PYTORCH_TUNABLEOP_FILENAME=...` then lets an engine read (stop40_tunableop.sh).

    PYTHONPATH=... python docs/gpu_runs/stop40_tunableop_probe.py
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

ROWS, REPS = 64, 28
SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}


def chain(x: torch.Tensor, weights: list[torch.Tensor]):
    def run() -> None:
        for w in weights:
            F.linear(x, w)
    return run


def main() -> None:
    from scripts.bench_gpu import graph_us

    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, cuda {torch.version.cuda}")
    cases = {}
    for name, (n, k) in SHAPES.items():
        x = torch.randn(ROWS, k, device=dev, dtype=torch.bfloat16)
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5 for _ in range(REPS)]
        cases[name] = (x, ws)
    base = {name: graph_us(chain(x, ws)) / REPS for name, (x, ws) in cases.items()}
    want = {name: F.linear(x, ws[0]) for name, (x, ws) in cases.items()}

    tunable = torch.cuda.tunable
    tunable.enable(True)
    tunable.tuning_enable(True)
    tunable.set_filename(os.environ.get("TUNED", "tunableop_results.csv"), insert_device_ordinal=False)
    for name, (x, ws) in cases.items():
        F.linear(x, ws[0])  # tunes this shape, eagerly
    torch.cuda.synchronize()
    tunable.tuning_enable(False)
    tuned = {name: graph_us(chain(x, ws)) / REPS for name, (x, ws) in cases.items()}
    for name, (x, ws) in cases.items():
        got = F.linear(x, ws[0])
        err = ((got.float() - want[name].float()).norm() / want[name].float().norm()).item()
        print(f"{name:8s} default {base[name]:6.2f} us  tuned {tuned[name]:6.2f} us  ({tuned[name] / base[name]:.3f}x)"
              f"  relative difference {err:.1e}")
    print(f"chain of four: default {sum(base.values()):.2f} us, tuned {sum(tuned.values()):.2f} us a layer")
    for row in tunable.get_results():  # the file itself is written at exit
        print("tuned:", *row)


if __name__ == "__main__":
    main()
