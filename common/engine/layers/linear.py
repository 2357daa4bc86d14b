"""Linear layers split across tensor-parallel ranks; each parameter knows how to load its shard."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.engine.distributed import all_reduce, tp_rank, tp_size
from common.engine.layers.activation import silu_and_mul as silu_and_mul_
from common.engine.layers.fusion import skinny_gemm, split_k_gemm
from common.engine.layers.partial_sums import PartialSums


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's rows (the outputs) split across ranks; no communication."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        assert out_features % self.tp_size == 0, f"{out_features} outputs do not split over {self.tp_size} ranks"
        self.weight = _param(out_features // self.tp_size, in_features)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = _param(out_features // self.tp_size)
            self.bias.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        size = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (gemv := skinny_gemm(x, self.weight)) is not None:
            return gemv.gemv(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input packed into one matmul (gate and up)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int) -> None:
        size = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections packed; query heads split across ranks, KV heads split or replicated."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        tp = tp_size()
        if num_heads % tp:
            raise ValueError(f"num_attention_heads={num_heads} does not split over tensor_parallel_size={tp}")
        if (num_kv_heads % tp) if num_kv_heads >= tp else (tp % num_kv_heads):
            raise ValueError(f"num_key_value_heads={num_kv_heads} can be neither split nor replicated over {tp} ranks")
        self.head_dim = head_dim
        self.num_heads = num_heads // tp
        self.num_kv_heads = max(1, num_kv_heads // tp)
        # With fewer KV heads than ranks, consecutive ranks share (replicate) one KV head.
        self.kv_head_start = tp_rank() * num_kv_heads // tp
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden_size, out, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:
        d, hq, hkv = self.head_dim, self.num_heads, self.num_kv_heads
        if shard_id == "q":
            dst, src_start, size = 0, self.tp_rank * hq * d, hq * d
        else:
            dst = (hq + (hkv if shard_id == "v" else 0)) * d
            src_start, size = self.kv_head_start * d, hkv * d
        param.data.narrow(0, dst, size).copy_(loaded.narrow(0, src_start, size))


class RowParallelLinear(nn.Module):
    """y = x W^T with W's columns (the inputs) split across ranks; partial sums are all-reduced."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        assert in_features % self.tp_size == 0, f"{in_features} inputs do not split over {self.tp_size} ranks"
        self.weight = _param(out_features, in_features // self.tp_size)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = _param(out_features)
            self.bias.weight_loader = lambda p, w: p.data.copy_(w)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        size = param.shape[1]
        param.data.copy_(loaded.narrow(1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor, silu_and_mul: bool = False,
                to_norm: bool = False) -> torch.Tensor | PartialSums:
        """With `silu_and_mul`, x is [gate | up] and the layer computes down(silu(gate) * up): for a few rows one
        kernel (gemv.py), else the activation's kernel first. A decode batch through a weight of few outputs
        splits K (splitk.py); with `to_norm` (the caller is an RMSNorm, which can sum the parts itself) on one rank
        its parts come back as PartialSums."""
        bias = self.bias if self.tp_rank == 0 else None
        if (gemv := skinny_gemm(x, self.weight)) is not None:
            return all_reduce(gemv.gemv(x, self.weight, bias, silu=silu_and_mul))
        if silu_and_mul:
            x = silu_and_mul_(x)
        if bias is None and (splitk := split_k_gemm(x, self.weight)) is not None:
            if to_norm and self.tp_size == 1:
                return splitk.linear(x, self.weight, summed=False)
            return all_reduce(splitk.linear(x, self.weight))
        return all_reduce(F.linear(x, self.weight, bias))
