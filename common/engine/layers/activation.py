from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.engine.layers.fusion import fused_kernels


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up] along the last dim."""
    if x.is_cuda and (fused := fused_kernels()) is not None:
        return fused.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)
