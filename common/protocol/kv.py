"""What crosses the wire about KV caches: a pool's layout, each transport's descriptor of a worker's pool, and
how an nccl handoff's bytes follow its record. Checked once, where a pair of workers first connects."""
from __future__ import annotations

from typing import Annotated, Literal, get_args

from msgspec import Meta

from common.protocol.schema import MAX_LIST_LEN, Address, Count, Id, Record

Dtype = Literal["float32", "bfloat16", "float16"]  # the dtypes a KV cache (and the engine) runs in
DTYPES: tuple[str, ...] = get_args(Dtype)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TransportName = Literal["cuda_ipc", "nccl", "host"]
TRANSPORT_NAMES: tuple[str, ...] = get_args(TransportName)  # best first
Positive = Annotated[int, Meta(ge=1)]


class KVLayout(Record, kw_only=True):
    """What a peer needs to interpret the bytes of one KV block: [num_layers, 2 (K, V), block_size, num_kv_heads,
    head_dim] of `dtype`, contiguous (docs/design.md). The one layout type: engine, transports and wire."""

    block_size: Positive
    num_layers: Positive
    num_kv_heads: Positive
    head_dim: Positive
    dtype: Dtype

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers, K and V."""
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    def differences(self, other: KVLayout) -> list[str]:
        """The fields that differ, as "name here vs there" (empty when the layouts match)."""
        return [f"{name} {getattr(self, name)} vs {getattr(other, name)}" for name in self.__struct_fields__
                if getattr(self, name) != getattr(other, name)]


class CudaIpcPool(Record, kw_only=True):
    """The pool tensor's CUDA IPC export: the fields of torch.multiprocessing's `reduce_tensor`."""

    shape: list[int]
    stride: list[int]
    offset: int
    dtype: Dtype
    device: int
    handle: bytes
    storage_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes | None
    event_sync_required: bool


class CudaIpcDescriptor(Record, kw_only=True):
    """Where a decode worker's pool lives, so a prefill worker that can see its GPU maps it and copies into it."""

    pid: int
    gpu: str  # UUID of the GPU holding the pool
    visible: list[str]  # UUIDs of the GPUs this worker's process can see
    layout: KVLayout
    num_blocks: Count
    pool: CudaIpcPool


class NcclDescriptor(Record, kw_only=True):
    """Where a prefill worker meets a decode worker to open a link (the decode worker's TCPStore)."""

    backend: Literal["nccl", "gloo"]  # gloo: a CPU worker
    host: Address
    port: Annotated[int, Meta(ge=0, le=65535)]
    gpu: str = ""  # UUID of the worker's GPU; "" on CPU
    layout: KVLayout
    num_blocks: Count


class KVDescriptors(Record, kw_only=True):
    """A worker's descriptors, one per transport that needs one (host needs none)."""

    cuda_ipc: CudaIpcDescriptor | None = None
    nccl: NcclDescriptor | None = None


class NcclStream(Record, kw_only=True):
    """How an nccl handoff's bytes follow its record over the pair's link (docs/protocol.md)."""

    link: Id  # a two-rank process group under this name in the decode worker's store; a new name: a new link
    seq: Count  # 0, 1, 2, ... per link, in record order
    block_bytes: Positive
    segments: Annotated[list[Positive], Meta(min_length=1, max_length=MAX_LIST_LEN)]  # blocks per message
