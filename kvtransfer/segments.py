"""How one transfer's blocks are cut into operations: runs of ids consecutive on both sides (one copy or message
each, straight between pool views), or fixed chunks gathered and scattered where a side is not consecutive."""
from __future__ import annotations

import numpy as np
import torch

from kvtransfer.errors import TransferError

# The most bytes one copy, gather buffer or message moves: bounds scratch memory; large enough that
# per-operation overhead is noise (64 MiB at 400 GB/s is 160 us).
CHUNK_BYTES = 64 << 20


def block_ids_tensor(ids: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64, device=device)


def joint_runs(src: list[int], dst: list[int], limit: int | None = None) -> list[tuple[int, int]] | None:
    """Split the pairs src[i] -> dst[i] into segments (offset, length) where both sides are consecutive: each
    is one plain copy (or one message) between two views of the pools. With `limit`: None as soon as there
    are more runs than that (the caller cuts the transfer another way). Plain Python, on purpose: scattered ids
    stop it within `limit` ids, where numpy's fixed cost was 20-40 us a handoff on the GPU host."""
    if len(src) != len(dst):
        raise TransferError(f"{len(src)} source blocks for {len(dst)} destination blocks")
    n = len(src)
    if not n:
        return []
    if single_run(src, dst):
        return [(0, n)]
    starts = [0]
    for i in range(1, n):
        if src[i] - src[i - 1] != 1 or dst[i] - dst[i - 1] != 1:
            if len(starts) == limit:
                return None
            starts.append(i)
    return [(a, b - a) for a, b in zip(starts, [*starts[1:], n])]


def single_run(src: list[int], dst: list[int]) -> bool:
    """Whether both sides are one run of consecutive ids, as C-speed list compares (the common case)."""
    return (len(src) > 0 and src[-1] - src[0] == len(src) - 1 == dst[-1] - dst[0]
            and src == [*range(src[0], src[-1] + 1)] and dst == [*range(dst[0], dst[-1] + 1)])


def fixed_chunks(n: int, max_blocks: int) -> list[tuple[int, int]]:
    """(offset, length) segments of `max_blocks` covering n blocks."""
    return [(i, min(max_blocks, n - i)) for i in range(0, n, max_blocks)]


def plan_segments(src: list[int], dst: list[int], block_bytes: int, strategy: str = "auto",
                  max_runs: int = 16) -> list[tuple[int, int]]:
    """How a transfer is cut into operations, in destination order.

    "runs": one per joint run (no gather or scatter: both sides are views of the pools, however long);
    "gather": fixed chunks of CHUNK_BYTES (at least one block), gathered and/or scattered where a side is
    not consecutive, so scratch memory stays bounded; "auto": runs when there are at most `max_runs` of
    them, chunks otherwise.
    """
    if strategy not in ("auto", "runs", "gather"):
        raise ValueError(f"strategy must be auto, runs or gather, got {strategy!r}")
    if strategy != "gather":
        runs = joint_runs(src, dst, None if strategy == "runs" else max_runs)
        if runs is not None:
            return runs
    return fixed_chunks(len(dst), max(1, CHUNK_BYTES // block_bytes))


class BlockIds:
    """One side's block ids of a transfer, cut into the transfer's segments: a segment whose ids are a run
    is a view of the pool; otherwise its ids go to the pool's device (once per transfer) to gather or
    scatter through."""

    def __init__(self, kv: torch.Tensor, ids: list[int]):
        self.kv = kv
        self.ids = np.asarray(ids, dtype=np.int64)
        self._jumps = np.concatenate([[0], np.cumsum(np.diff(self.ids) != 1)])  # jumps before each position
        self._index: torch.Tensor | None = None

    def run(self, off: int, n: int) -> torch.Tensor | None:
        """Blocks ids[off:off + n] as a view of the pool, if they are consecutive."""
        if self._jumps[off + n - 1] != self._jumps[off]:
            return None
        first = int(self.ids[off])
        return self.kv[first:first + n]

    def index(self, off: int, n: int) -> torch.Tensor:
        if self._index is None:
            self._index = torch.from_numpy(self.ids).to(self.kv.device, non_blocking=True)
        return self._index[off:off + n]

    def gather(self, off: int, n: int) -> torch.Tensor:
        view = self.run(off, n)
        return view if view is not None else self.kv.index_select(0, self.index(off, n))


def check_block_ids(ids: list[int], num_blocks: int, whose: str) -> None:
    """A bad id must fail here, not as an out-of-bounds write into a pool (or a device assert)."""
    if ids and (min(ids) < 0 or max(ids) >= num_blocks):
        bad = [i for i in ids if not 0 <= i < num_blocks]
        raise TransferError(f"{whose} block ids out of range [0, {num_blocks}): {bad[:8]}")
