"""A projection's output left as float32 parts, one per chunk of its inputs, for the kernel that reads it next to
sum: in a decode step the split-K projections (splitk.py) hand their parts to the add+RMSNorm after them, which
saves the launch of a kernel that would only add them up."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PartialSums:
    parts: torch.Tensor  # [splits, padded rows, N] float32: row r of the output is parts[:, r].sum(0)
    rows: int  # the output's rows (the padded rows past them are garbage)
    dtype: torch.dtype  # the output's: the sum is rounded to it once

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.rows, self.parts.shape[-1]))

    def total(self) -> torch.Tensor:
        """The output, summed in the parts' order and rounded once, as the kernels do."""
        acc = self.parts[0, :self.rows].clone()
        for part in self.parts[1:]:
            acc += part[:self.rows]
        return acc.to(self.dtype)
