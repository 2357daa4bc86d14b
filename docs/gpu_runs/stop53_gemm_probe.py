"""Stop 53: which bf16 GEMMs (F.linear, cuBLAS) go wrong in a process capped to an MPS share of the SMs: Qwen3-0.6B's
and Qwen3-8B's projections at decode and prefill row counts, each against the same product in float32. Prints the
SMs the process sees and each bad shape (NaN, or a relative error above 2e-2). Run as an MPS client."""
from __future__ import annotations

import torch
import torch.nn.functional as F

SHAPES = {  # name: (outputs, inputs)
    "0.6b qkv": (4096, 1024), "0.6b o": (1024, 2048), "0.6b gate_up": (6144, 1024), "0.6b down": (1024, 3072),
    "0.6b head": (151936, 1024),
    "8b qkv": (6144, 4096), "8b o": (4096, 4096), "8b gate_up": (24576, 4096), "8b down": (4096, 12288),
}
ROWS = [1, 8, 16, 64, 100, 128, 192, 256, 384, 512, 1024, 2048, 4096]


def main() -> None:
    torch.manual_seed(0)
    print("SMs seen:", torch.cuda.get_device_properties(0).multi_processor_count, flush=True)
    bad = total = 0
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        for m in ROWS:
            if name.endswith("head") and m > 256:
                continue
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            got = F.linear(x, w).float()
            ref = x.float() @ w.float().t()
            err = ((got - ref).norm() / ref.norm()).item()
            total += 1
            if torch.isnan(got).any().item() or not err < 2e-2:
                bad += 1
                print(f"BAD {name} rows {m}: nan {torch.isnan(got).sum().item()} of {got.numel()}, rel err {err:.3g}",
                      flush=True)
    print(f"{bad} of {total} shapes bad", flush=True)


if __name__ == "__main__":
    main()
