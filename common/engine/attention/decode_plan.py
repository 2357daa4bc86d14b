"""How the paged decode kernel (triton_ops) shares out a batch's attention: its plan cuts each context into
units, one program per unit and KV head, sized so that the units fill one wave of the GPU whatever the mix
of lengths. A plan depends on the context lengths, which the host knows when it builds a step; a CUDA
graph captures the plan's table, and each replay copies that step's table in.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

# A unit covers at least this many tokens of context (unless its sequence is shorter). 64 (one tile), not 128:
# the batch-1 decode step was faster with the finer units (docs/benchmarks.md, stop 12).
MIN_UNIT_TOKENS = 64
UNIT_GRANULE = 64  # unit lengths are multiples of this (the bf16/fp16 tile)
# Programs per SM in one wave. Whether to cut at all is judged against one wave: a batch whose sequences fill
# it runs one program a sequence, with no reduce (bench_attention --sweep, H200).
PROGRAMS_PER_SM = 4
# Once a plan cuts, it cuts units of at most sum / (SPLIT_WAVES x a wave) tokens, rounding each sequence's count
# up: with contexts of mixed lengths, the wave waits for its largest unit, and units rounded to nearest at one
# wave ran up to 1.5x the mean (docs/gpu_runs/stop19_plan_probe.py).
SPLIT_WAVES = 1.5
MAX_UNITS_PER_SEQ = 64  # a sequence cut finer gains little and gives the reduce more partials
PLAN_ROWS = 5


def _cdiv(a, b):
    return -(-a // b)


def _round_up(a, b):
    return _cdiv(a, b) * b


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 16  # Triton's interpreter runs programs one by one: a few splits keep CPU tests fast.
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass(frozen=True)
class DecodePlan:
    """Which context range of which sequence each decode program attends over (`plan_decode`).

    `units` [5, capacity] int32 on the device, by row: unit -> sequence (-1: unused), start, end;
    sequence -> first unit, number of units (0: a padded entry). `split` False: one unit per sequence,
    no table needed (`units` None) and no reduce kernel.
    """

    units: torch.Tensor | None
    split: bool


def wave_units(num_kv_heads: int, device: torch.device) -> int:
    """Units that fill one wave of the decode grid (units x kv_heads programs)."""
    return max(1, PROGRAMS_PER_SM * _num_sms(device) // num_kv_heads)


def split_units(target: int) -> int:
    """Units a split plan aims at, for `target` units a wave."""
    return math.ceil(target * SPLIT_WAVES)


def plan_capacity(batch: int, num_kv_heads: int, device: torch.device) -> int:
    """Units a plan for `batch` sequences may use at most (see plan_units): the grid of a split launch."""
    return batch + split_units(wave_units(num_kv_heads, device))


def plan_units(seq_lens: list[int], target: int, capacity: int,
               max_num_splits: int = MAX_UNITS_PER_SEQ) -> tuple[np.ndarray | None, bool]:
    """Cut each context into units of at most `sum(seq_lens) / split_units(target)` tokens (at least
    MIN_UNIT_TOKENS), at most `max_num_splits` a sequence: about equal work a program whatever the mix of
    lengths, so one long sequence among short ones no longer runs alone in one program. No cut at all when
    units of `sum / target` tokens, rounded to nearest, would leave every sequence whole (one wave holds
    them). Rounding up keeps sum(units) <= split_units(target) + len(seq_lens), the capacity it needs.

    Returns the [5, capacity] table of DecodePlan (unused units -1) and whether any sequence is split; no
    table when none is (the common case of a large batch: decided without numpy, a step's host time counts).
    """
    chunk = _round_up(max(MIN_UNIT_TOKENS, _cdiv(sum(seq_lens), max(target, 1))), UNIT_GRANULE)
    max_num_splits = max(1, min(max_num_splits, MAX_UNITS_PER_SEQ))
    if max_num_splits == 1 or 2 * max(seq_lens, default=0) < 3 * chunk:  # every length rounds to one unit
        return None, False
    chunk = _round_up(max(MIN_UNIT_TOKENS, _cdiv(sum(seq_lens), split_units(target))), UNIT_GRANULE)
    # Plain Python, a sequence at a time: for a step's few sequences it beats numpy's per-call overhead.
    seqs, starts, ends, firsts, counts = [], [], [], [], []
    for i, length in enumerate(seq_lens):
        n = min(max(_cdiv(length, chunk), 1), max_num_splits)
        per_unit = _round_up(max(_cdiv(length, n), 1), UNIT_GRANULE)
        n = _cdiv(length, per_unit)  # rounding up the unit length may leave fewer units; none for length 0
        firsts.append(len(seqs))
        counts.append(n)
        for k in range(n):
            seqs.append(i)
            starts.append(k * per_unit)
            ends.append(min((k + 1) * per_unit, length))
    assert len(seqs) <= capacity, f"{len(seqs)} decode units for a capacity of {capacity}"
    split = max(counts, default=0) > 1
    if not split:
        return None, False
    pad_units, pad_seqs = [0] * (capacity - len(seqs)), [0] * (capacity - len(firsts))
    table = np.array([seqs + [-1] * len(pad_units), starts + pad_units, ends + pad_units, firsts + pad_seqs,
                      counts + pad_seqs], np.int64)
    return table, True


def plan_table(seq_lens: list[int], num_kv_heads: int, device: torch.device, *, batch: int | None = None,
               max_num_splits: int = MAX_UNITS_PER_SEQ, target: int | None = None) -> np.ndarray | None:
    """The host table of the plan for these context lengths on `device` (None: one unit a sequence);
    `batch` (>= len(seq_lens)): the padded batch the kernel will see (a CUDA graph's), whose extra
    entries are empty; `target`: units per wave (default: what fills one on `device`)."""
    batch = len(seq_lens) if batch is None else batch
    target = wave_units(num_kv_heads, device) if target is None else target
    return plan_units(seq_lens, target, batch + split_units(target), max_num_splits)[0]


def plan_decode(seq_lens: list[int], num_kv_heads: int, device: torch.device, **kw) -> DecodePlan:
    """`plan_table`'s plan with its table on `device`."""
    table = plan_table(seq_lens, num_kv_heads, device, **kw)
    if table is None:
        return DecodePlan(None, False)
    return DecodePlan(torch.from_numpy(table).to(device=device, dtype=torch.int32), True)
