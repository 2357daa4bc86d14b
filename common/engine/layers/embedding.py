from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.engine.distributed import all_gather_last_dim, all_reduce, tp_rank, tp_size
from common.engine.layers.fusion import fused_kernels, head_sampler


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary (padded so it splits evenly)."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.part = -(-vocab_size // self.tp_size)
        self.start = self.tp_rank * self.part
        self.weight = nn.Parameter(torch.zeros(self.part, dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        rows = loaded[self.start:self.start + self.part]
        param.data[:rows.shape[0]].copy_(rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mine = (local >= 0) & (local < self.part)
        y = F.embedding(local.clamp(0, self.part - 1), self.weight) * mine.unsqueeze(-1)
        return all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        return all_gather_last_dim(logits)[..., :self.vocab_size]

    def sample_one_pass(self, hidden: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
                        out: torch.Tensor) -> torch.Tensor:
        """A token a row into `out`: the one-pass sampler (fused.gumbel_argmax) over this head's logits. On one
        rank, a decode batch's logits are never written (head_sampler.py)."""
        if self.tp_size == 1 and (fused_head := head_sampler(hidden, self.weight)) is not None:
            return fused_head.sample(hidden, self.weight, temperatures, seeds, out, vocab_size=self.vocab_size)
        return fused_kernels().gumbel_argmax(self(hidden), temperatures, seeds, out)
