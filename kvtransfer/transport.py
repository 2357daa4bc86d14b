"""How KV blocks move from a prefill worker's pool into blocks a decode worker reserved.

A transport is chosen per prefill-decode pair (`choice.choose_transport`). The prefill side calls `send`, then sends
the `kv_handoff` record over the data channel, followed by the payload frames `send` returned (host) and carrying
its nccl stream (nccl); the decode side calls `receive` with the record and those frames when the record arrives,
and acknowledges once the blocks are in place. Transports that copy directly (CUDA IPC) finish the copy before
`send` returns; transports that stream (NCCL) return futures instead, and the worker's handoff keeps the request's
blocks until they resolve (`handoff.py`), so nothing is read from or written to a block that was freed.

Every handoff is keyed on the request id the router assigned (one id end to end). A transport checks a peer's
descriptor (its KV layout included) once, the first time it connects to that peer.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass, field

from common.engine.kv_pool import KVPool
from common.protocol import KVDescriptors, KVHandoff, KVLayout, NcclStream, Record
from kvtransfer.errors import TransferError


@dataclass
class Sent:
    """What `Transport.send` hands back: payload frames to follow the `kv_handoff` record (host), the stream its
    bytes follow on (nccl), and, for a transport still reading the source blocks, a future resolving when it stops."""

    payload: list = field(default_factory=list)
    nccl: NcclStream | None = None
    done: Future | None = None
    # A direct copy's (cuda_ipc) seconds: `send`'s wait for it, and its GPU time; the rest of a send is host work
    waited: float = 0.0
    copy_gpu: float = 0.0


class Transport(ABC):
    name: str = ""

    def __init__(self, pool: KVPool, host: str = "127.0.0.1", timeout: float = 60.0):
        self.pool = pool
        self.host = host  # the interface this worker's peers reach it on
        self.timeout = timeout  # how long one transfer may take before it fails

    def descriptor(self) -> Record | None:
        """What a peer needs to reach this pool (its field of the hello's KVDescriptors); None: nothing."""
        return None

    @abstractmethod
    def send(self, request_id: str, peer_id: str, peer: KVDescriptors, src_block_ids: list[int],
             dst_block_ids: list[int]) -> Sent:
        """Move (or start moving) the blocks; `src_block_ids[i]` lands in the peer's `dst_block_ids[i]`. The
        source blocks are complete: the caller has seen the work that wrote them finish. A transport orders its
        reads after nothing else on the compute stream, where the engine may have queued its next step."""

    @abstractmethod
    def receive(self, record: KVHandoff, dst_block_ids: list[int], frames: list[memoryview]) -> Future | None:
        """Land a handoff's KV in the reserved blocks: None when they are in place on return, or a future that
        resolves (or fails with TransferError) when they are."""

    def open(self, peer_id: str, peer: KVDescriptors) -> tuple[str, Future] | None:
        """Prefill side, before any handoff to `peer_id`: set up what its first handoff would otherwise set up.
        None where nothing is left to set up once it returns; else the link's name (for the peer's `join`) and a
        future that resolves once the link works both ways."""
        return None

    def join(self, peer_id: str, link: str) -> Future | None:
        """Decode side: join the link a prefill worker `open`ed."""
        raise TransferError(f"the {self.name} transport opens no links")

    def discard(self, record: KVHandoff, frames: list[memoryview]) -> Future | None:
        """The handoff was refused: consume whatever the sender streams, so later handoffs stay aligned."""
        return None

    def close(self) -> None:
        pass

    def check_peer_layout(self, theirs: KVLayout, peer_id: str) -> None:
        """Fail fast, naming every field that differs: the bytes of a block mean nothing otherwise."""
        diffs = self.pool.layout.differences(theirs)
        if diffs:
            raise TransferError(f"KV layout mismatch with {peer_id} (here vs there): " + "; ".join(diffs))
