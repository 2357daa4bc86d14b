"""How KV blocks move from a prefill worker's pool into blocks a decode worker reserved.

A transport is chosen per prefill-decode pair (`choose_transport`). The prefill side calls `send`,
then sends a `kv_handoff` record over the data channel followed by whatever payload frames `send`
returned; the decode side calls `receive` with those frames when the record arrives. When the record
arrives the blocks must be complete: transports that copy directly (CUDA IPC) finish the copy before
`send` returns.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from common.kv_pool import KVPool


class TransferError(RuntimeError):
    pass


class Transport(ABC):
    name: str = ""

    def __init__(self, pool: KVPool):
        self.pool = pool

    def descriptor(self) -> bytes:
        """What a peer needs to reach this pool (opaque bytes, shared through the router at hello)."""
        return b""

    @abstractmethod
    def send(self, peer_id: str, peer_descriptor: bytes, src_block_ids: list[int],
             dst_block_ids: list[int]) -> list[memoryview]:
        """Move the blocks (or stage them); returns the payload frames that follow the handoff record."""

    @abstractmethod
    def receive(self, peer_id: str, dst_block_ids: list[int], frames: list[memoryview]) -> None:
        """Land a handoff's payload in the reserved blocks."""

    def close(self) -> None:
        pass


def block_ids_tensor(ids: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64, device=device)
