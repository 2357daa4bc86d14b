"""How KV blocks move from a prefill worker's pool into blocks a decode worker reserved.

A transport is chosen per prefill-decode pair (`choose_transport`). The prefill side calls `send`,
then sends a `kv_handoff` record over the data channel followed by the payload frames `send` returned;
the decode side calls `receive` with those frames when the record arrives, and acknowledges once the
blocks are in place. Transports that copy directly (CUDA IPC) finish the copy before `send` returns;
transports that stream (NCCL) return futures instead, and the worker keeps the request's blocks until
they resolve (`common/worker.py`), so nothing is read from or written to a block that was freed.

Every handoff is keyed on the request id the router assigned (one id end to end).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from common.engine.kv_pool import KVLayout, KVPool
from kvtransfer.descriptors import TransferError

# The most bytes one copy, gather buffer or message moves: bounds scratch memory; large enough that
# per-operation overhead is noise (64 MiB at 400 GB/s is 160 us).
CHUNK_BYTES = 64 << 20


@dataclass
class Sent:
    """What `Transport.send` hands back: the payload frames for the `kv_handoff` record, and, for a
    transport still reading the source blocks when it returns, a future that resolves when it stops."""

    frames: list = field(default_factory=list)
    done: Future | None = None


class Transport(ABC):
    name: str = ""

    def __init__(self, pool: KVPool, host: str = "127.0.0.1", timeout: float = 60.0):
        self.pool = pool
        self.host = host  # the interface this worker's peers reach it on
        self.timeout = timeout  # how long one transfer may take before it fails

    def descriptor(self) -> bytes:
        """What a peer needs to reach this pool (msgpack bytes, shared through the router at hello)."""
        return b""

    @abstractmethod
    def send(self, request_id: str, peer_id: str, peer_descriptor: bytes, src_block_ids: list[int],
             dst_block_ids: list[int]) -> Sent:
        """Move (or start moving) the blocks; `src_block_ids[i]` lands in the peer's `dst_block_ids[i]`. The
        source blocks are complete: the caller has seen the work that wrote them finish. A transport orders its
        reads after nothing else on the compute stream, where the engine may have queued its next step."""

    @abstractmethod
    def receive(self, request_id: str, peer_id: str, dst_block_ids: list[int],
                frames: list[memoryview]) -> Future | None:
        """Land a handoff's payload in the reserved blocks: None when they are in place on return, or a
        future that resolves (or fails with TransferError) when they are."""

    def discard(self, request_id: str, peer_id: str, frames: list[memoryview]) -> Future | None:
        """The handoff was refused: consume whatever the sender streams, so later handoffs stay aligned."""
        return None

    def close(self) -> None:
        pass


# ---- block ids ---------------------------------------------------------------------------------------

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


# ---- layouts and descriptors ----------------------------------------------------------------------------

def layout_record(layout: KVLayout) -> dict:
    return {"num_layers": layout.num_layers, "block_size": layout.block_size, "num_kv_heads": layout.num_kv_heads,
            "head_dim": layout.head_dim, "dtype": str(layout.dtype).removeprefix("torch.")}


def check_layout(mine: KVLayout, theirs: dict, peer: str) -> None:
    """Fail fast, naming every field that differs: the bytes of a block mean nothing otherwise."""
    ours = layout_record(mine)
    diffs = [f"{k} {ours[k]} here, {theirs.get(k)!r} on {peer}" for k in ours if theirs.get(k) != ours[k]]
    if diffs:
        raise TransferError(f"KV layout mismatch with {peer}: " + "; ".join(diffs))
