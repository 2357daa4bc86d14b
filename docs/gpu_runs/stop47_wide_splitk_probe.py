"""Stop 47 (issue 20): qkv and gate_up of Qwen3-0.6B's batch-64 decode step as split-K Triton kernels (the weights
loaded before the PDL wait, as o and down are), the step timed in one process against the engine's (cuBLAS), modes
alternated, two rounds (CUDA graphs, context 1,024, warm):

- `engine`: as it is;
- `sum{BN}x{BK}`: the split-K parts summed by a kernel of their own, then the engine's q/k-norm + RoPE and
  SiLU-and-mul kernels as they are;
- `nosum{BN}x{BK}`: the parts left unsummed, the output a zero buffer (no kernel writes it): what the step would
  cost were the sum folded into the q/k-norm + RoPE and the SiLU-and-mul kernels that read the output next, as the
  add+RMSNorm sums o's and down's parts.

Stop 42's probe had the `sum64x512` mode (`--splitk-all`); its figures were never recorded.

Run: python docs/gpu_runs/stop47_wide_splitk_probe.py [MODE ...]
"""
from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.bench_engine import model_dir, step_per_mode  # noqa: E402
from common.engine.layers import linear, splitk  # noqa: E402
from common.engine.pdl import launch_kwargs  # noqa: E402

REAL_COLUMN_FORWARD = linear.ColumnParallelLinear.forward
_spec = importlib.util.spec_from_file_location("stop42_fold_probe", Path(__file__).with_name("stop42_fold_probe.py"))
_stop42 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_stop42)
_sum_kernel = _stop42._sum_kernel  # the parts' own sum kernel, as stop 42's `--splitk-all` launched it
ZEROS: dict[torch.device, torch.Tensor] = {}


def column_splitk(x: torch.Tensor, weight: torch.Tensor, block_n: int, block_k: int, summed: bool) -> torch.Tensor:
    m, (n, k) = x.shape[0], weight.shape
    splits = k // block_k
    part = torch.empty(splits, splitk.MAX_ROWS, n, dtype=torch.float32, device=x.device)
    pdl = launch_kwargs(x.device)
    splitk._partial_kernel[(n // block_n, splits)](x, weight, part, m, x.stride(0), N=n, K=k, ROWS=splitk.MAX_ROWS,
                                                   BLOCK_N=block_n, BLOCK_K=block_k,
                                                   num_warps=splitk.PARTIAL_WARPS, **pdl)
    if not summed:
        zeros = ZEROS[x.device]  # made before capture; kernels after write it in place, finite values only
        return zeros.view(-1)[:m * n].view(m, n)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _sum_kernel[(m, n // 1024)](part, out, N=n, ROWS=splitk.MAX_ROWS, SPLITS=splits, BLOCK=1024, **pdl)
    return out


def forward_for(block_n: int, block_k: int, summed: bool):
    def forward(self, x):
        n, k = self.weight.shape
        if not (x.dim() == 2 and 8 < x.shape[0] <= 64 and k % block_k == 0 and n % 1024 == 0 and n > 1024
                and self.bias is None and x.stride(-1) == 1 and x.dtype == torch.bfloat16):
            return REAL_COLUMN_FORWARD(self, x)
        return column_splitk(x, self.weight, block_n, block_k, summed)
    return forward


def parse(mode: str) -> tuple[int, int, bool]:
    summed = mode.startswith("sum")
    bn, bk = mode.removeprefix("no").removeprefix("sum").split("x")
    return int(bn), int(bk), summed


def set_mode(mode: str) -> None:
    linear.ColumnParallelLinear.forward = REAL_COLUMN_FORWARD
    if mode != "engine":
        linear.ColumnParallelLinear.forward = forward_for(*parse(mode))


def check(modes: list[str]) -> None:
    """The summed modes give F.linear's products at qkv's and gate_up's shapes (so their time is a real
    projection's)."""
    for n in (4096, 6144):
        w = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16) * 0.03
        x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
        for mode in modes:
            if mode.startswith("sum"):
                bn, bk, _ = parse(mode)
                torch.testing.assert_close(column_splitk(x, w, bn, bk, True), F.linear(x, w), atol=2e-2, rtol=2e-2)
    print("checked: the summed split-K modes match F.linear", flush=True)


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    modes = sys.argv[1:] or ["sum64x512", "nosum64x512", "nosum32x512", "nosum64x256"]
    ZEROS[torch.device("cuda", 0)] = torch.zeros(64 * 6144, dtype=torch.bfloat16, device="cuda")
    check(modes)
    with tempfile.TemporaryDirectory() as d:
        path = model_dir("qwen3-0.6b", Path(d))
        for mode, ms, roof in step_per_mode(path, ["engine", *modes], set_mode):
            print(f"decode {mode:12s} batch 64: {ms:.3f} ms, {ms / roof:.3f}x the roofline ({roof:.3f} ms)",
                  flush=True)


if __name__ == "__main__":
    main()
