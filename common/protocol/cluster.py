"""Messages inside the cluster: router <-> workers, and the KV data plane between workers (docs/protocol.md).
All of a cluster's components come from one installation, so these may change between releases (see Versioning)."""
from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from common.protocol.kv import KVDescriptors, KVLayout, NcclStream, TransportName
from common.protocol.records import TokenUpdate, WorkerLoad
from common.protocol.schema import (
    Address, BlockIds, Count, Id, Message, Message_, OptionalId, Prompt, Role, TokenId, message,
)
from common.sampling_params import SamplingParams

Positive = Annotated[int, Meta(ge=1)]
Transports = Annotated[list[TransportName], Meta(max_length=16)]


@message
class WorkerHello(Message, tag="worker_hello", kw_only=True):
    worker_id: Id
    role: Role
    model_fingerprint: Annotated[str, Meta(min_length=1, max_length=256)]
    num_blocks: Count
    layout: KVLayout
    max_model_len: Positive
    vocab_size: Positive
    transports: Transports = []  # KV transports the worker offers, best first (none: a colocated worker)
    kv_address: Address = ""  # its data-plane inbox
    kv: KVDescriptors = KVDescriptors()
    node_id: OptionalId = ""
    device_index: Count = 0


@message
class Reserve(Message, tag="reserve", kw_only=True):
    request_id: Id
    token_ids: Prompt
    sampling: SamplingParams
    prefill_worker_id: Id


@message
class Reserved(Message, tag="reserved", kw_only=True):
    request_id: Id
    block_ids: BlockIds


@message
class PrefillTask(Message, tag="prefill_task", kw_only=True):
    request_id: Id
    token_ids: Prompt
    sampling: SamplingParams
    decode_worker_id: Id
    decode_kv_address: Address
    dst_block_ids: BlockIds
    transport: TransportName = "host"
    decode_kv: KVDescriptors = KVDescriptors()  # the decode worker's descriptors, from its hello


@message
class OpenLink(Message, tag="open_link", kw_only=True):
    """router -> prefill worker: open the KV link to this decode worker now, before a handoff needs it."""

    decode_worker_id: Id
    decode_kv_address: Address
    transport: TransportName
    decode_kv: KVDescriptors = KVDescriptors()


@message
class LinkOpened(Message, tag="link_opened", kw_only=True):
    """prefill worker -> router: its KV link to `decode_worker_id` is open, or could not be opened (`error`)."""

    decode_worker_id: Id
    error: Message_ = ""


@message
class KVLinkOpen(Message, tag="kv_link_open", kw_only=True):
    """prefill -> decode, on the data channel: join the link `link` now (nccl: a two-rank group in the decode
    worker's store); its first message follows over the link."""

    src_worker_id: Id
    transport: TransportName
    link: Id


@message
class GenerateTask(Message, tag="generate_task", kw_only=True):
    request_id: Id
    token_ids: Prompt
    sampling: SamplingParams


@message
class KVHandoff(Message, tag="kv_handoff", kw_only=True):
    request_id: Id
    src_worker_id: Id
    first_token: TokenId
    num_tokens: Positive
    transport: TransportName
    dst_block_ids: BlockIds
    reply_to: Address
    cached_tokens: Count = 0
    nccl: NcclStream | None = None  # with transport nccl: how its bytes follow over the link


@message
class HandoffAck(Message, tag="handoff_ack", kw_only=True):
    request_id: Id
    ok: bool
    message: Message_ = ""


@message
class TokenBatch(Message, tag="token_batch", kw_only=True):
    updates: list[TokenUpdate]


@message
class Heartbeat(Message, tag="heartbeat", kw_only=True):
    worker_id: Id
    load: WorkerLoad


@message
class Alive(Message, tag="alive", kw_only=True):
    """From a worker's liveness thread, on its own connection (`liveness_identity`), while the worker's loop is
    inside a step longer than the heartbeat interval: the process lives, it is busy, not dead."""
    worker_id: Id
    busy_seconds: Annotated[float, Meta(ge=0)] = 0.0  # how long the current step has run


def liveness_identity(worker_id: str) -> bytes:
    """The ZMQ identity of a worker's liveness connection (its main connection's identity is its worker_id)."""
    return f"{worker_id}/liveness".encode()


@message
class AbortRequest(Message, tag="abort_request", kw_only=True):
    request_id: Id


@message
class Shutdown(Message, tag="shutdown", kw_only=True):
    reason: Message_ = ""
