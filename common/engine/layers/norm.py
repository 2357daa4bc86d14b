from __future__ import annotations

import torch
from torch import nn

from common.engine.layers.fusion import fused_kernels
from common.engine.layers.partial_sums import PartialSums


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def forward(self, x: torch.Tensor | PartialSums, residual: torch.Tensor | None = None):
        """With `residual`, adds it first and returns (normed, new residual): the pre-norm block's fused step.
        On CUDA one kernel, which updates `residual` in place and sums `x` if it is a projection's parts."""
        if isinstance(x, PartialSums):
            if (fused := fused_kernels()) is not None and x.parts.is_cuda:
                return fused.rms_norm(x, self.weight, self.eps, residual)
            x = x.total()
        if x.is_cuda and x.stride(-1) == 1 and (fused := fused_kernels()) is not None:
            return fused.rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
