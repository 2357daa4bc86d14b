"""A process capped to a share of the SMs under CUDA MPS checks its model's GEMMs before it serves.

On the H200s of stop 53 (CUDA 13's cuBLAS), bf16 products came back wrong (NaN, or off by a fifth of their norm and
more) in a process capped to 60, 70 or 80% of the SMs, for many of Qwen3-0.6B's projection shapes at 64 to 100 rows
and more; at 50 and 90%, and uncapped, every one was right (docs/benchmarks.md, "Stop 53"). A worker so capped would
serve garbage at full speed, so it refuses to start instead, naming the share. Uncapped processes are not checked.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from common.config import ConfigError

ROWS = (1, 8, 64, 100, 128, 256, 512, 1024)  # decode batches and prompt steps, where wrong shapes were seen
CHUNK = 1024  # weight rows (output features) taken to float32 at a time: the check's memory stays small
PROBES = 16  # random vectors the product is projected on: one alone may nearly cancel, and its error look large
TOLERANCE = 5e-2  # relative error of the projections against float32: bf16's rounding gives a few 1e-3, the wrong
# products were off by 0.2 and more, or NaN


def wrong_gemms(model: torch.nn.Module, max_rows: int, seed: int = 0) -> list[str]:
    """The model's distinct 2-D weight shapes whose `F.linear` on random rows (up to `max_rows`) is wrong: one line
    each. Freivalds' check: the product times random vectors V against the rows times (W^T V), worked out in float32
    in one pass over the weight, so no float32 copy of a weight or of a product is made."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    weights = {tuple(p.shape): p for p in model.parameters() if p.dim() == 2}
    wrong = []
    for (n, k), w in weights.items():
        v = torch.randn(n, PROBES, generator=gen).to(w.device)
        wtv = sum(w[lo:lo + CHUNK].float().t() @ v[lo:lo + CHUNK] for lo in range(0, n, CHUNK))
        for m in (r for r in ROWS if r <= max_rows):
            x = torch.randn(m, k, generator=gen).to(device=w.device, dtype=w.dtype)
            got = F.linear(x, w)
            projected = sum(got[:, lo:lo + CHUNK].float() @ v[lo:lo + CHUNK] for lo in range(0, n, CHUNK))
            ref = x.float() @ wtv
            err = ((projected - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            if not err <= TOLERANCE:  # NaN fails too
                wrong.append(f"{m} x {k} by {k} x {n}: relative error {err:.3g}")
                break
    return wrong


def check_under_cap(model: torch.nn.Module, max_rows: int, share: str | None) -> None:
    """Raises ConfigError where the process is capped (`share`, percent of the SMs) and a GEMM comes back wrong."""
    if share is None:
        return
    wrong = wrong_gemms(model, max_rows)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the check's products go back before the KV pool is sized from free memory
    if wrong:
        raise ConfigError(f"mps: at {share}% of the SMs cuBLAS returns wrong products for {len(wrong)} of this model's "
                          f"GEMMs (first: {wrong[0]}); serve with another --mps-shares (50 and 90 were right on an "
                          f"H200 where 60-80 were not) or without --mps")
