"""Records nested in messages: usage and timings of a request, a worker's load, one step's tokens of a request."""
from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from common.protocol.kv import TransportName
from common.protocol.schema import Count, FinishReason, Id, OptionalId, Record, Role, Seconds, TokenIds
from common.sampling_params import InvalidRequest


class Usage(Record, kw_only=True):
    prompt_tokens: Count
    completion_tokens: Count
    cached_tokens: Count

    def _check(self) -> None:
        if self.cached_tokens > self.prompt_tokens:
            raise InvalidRequest("cached_tokens", "more than prompt_tokens")


class Timings(Record, kw_only=True):
    """Seconds, measured at the router."""

    queued: Seconds
    ttft: Seconds | None  # None when no token was produced
    e2e: Seconds
    itl: list[Seconds]
    # Disaggregated: until the decode worker answered the reservation (then the prompt went to the prefill worker).
    reserved: Seconds | None = None


class TransportTotals(Record, kw_only=True):
    """A prefill worker's KV handoffs through one transport since it started: acknowledged ones, their bytes, and the
    seconds from each send to its acknowledgement, summed."""

    transport: TransportName
    count: Count = 0
    bytes: Count = 0
    seconds: Seconds = 0.0


class WorkerLoad(Record, kw_only=True):
    queued_requests: Count
    queued_tokens: Count
    running_requests: Count
    kv_blocks_total: Count
    kv_blocks_free: Count
    # Since the worker started, over the engine steps that ran (or collected) a batch: their number, their
    # wall time, the tokens they ran and the GPU time of their batches. Differences over a time span give
    # its mean step time and batch, and how busy the GPU was.
    busy_steps: Count = 0
    busy_seconds: Seconds = 0.0
    prefill_tokens_run: Count = 0
    decode_tokens_run: Count = 0
    gpu_seconds: Seconds = 0.0
    # Of those, the steps that launched or collected a batch with prompt tokens (a decode worker's local prefill
    # chunks) and their wall time, and the batches with prompt tokens launched: against the decode-only steps they
    # give what a chunk adds to a step (router/disagg_policy.py).
    prompt_steps: Count = 0
    prompt_seconds: Seconds = 0.0
    prompt_batches: Count = 0
    handoffs: Annotated[list[TransportTotals], Meta(max_length=16)] = []  # prefill workers: by transport
    # Since the worker started: prompt tokens looked up in its prefix cache, and those found there.
    prefix_query_tokens: Count = 0
    prefix_hit_tokens: Count = 0

    def _check(self) -> None:
        if self.kv_blocks_free > self.kv_blocks_total:
            raise InvalidRequest("kv_blocks_free", "more than kv_blocks_total")
        if self.prompt_steps > self.busy_steps:
            raise InvalidRequest("prompt_steps", "more than busy_steps")
        if self.prompt_batches > self.busy_steps:
            raise InvalidRequest("prompt_batches", "more than busy_steps")
        if self.prompt_seconds > self.busy_seconds:
            raise InvalidRequest("prompt_seconds", "more than busy_seconds")


class WorkerStats(WorkerLoad, kw_only=True):
    worker_id: Id
    role: Role
    alive: bool
    draining: bool = False  # being removed: gets no new requests, finishes the ones it has
    node_id: OptionalId = ""


class RouterTotals(Record, kw_only=True):
    """Since the router started, over the requests that ended with a result: their prompt tokens, and how many of
    those the prefix caches held (cached / prompt is the cluster's hit rate)."""

    prompt_tokens: Count = 0
    cached_tokens: Count = 0
    migrations: Count = 0  # streamed requests moved to other workers after theirs died
    # disagg: prompts prefilled by the decode worker itself, and on a prefill worker (--disagg-policy)
    local_prefills: Count = 0
    remote_prefills: Count = 0
    kv_links_opened: Count = 0  # prefill -> decode KV links opened ahead of any handoff (`open_link`)
    # Its own stalls (common/stalls.py): its event loop waking 20 ms or more late, and full garbage collections
    loop_stalls: Count = 0
    loop_stall_seconds: Seconds = 0.0
    gc_pauses: Count = 0
    gc_seconds: Seconds = 0.0


class TokenUpdate(Record, kw_only=True):
    request_id: Id
    token_ids: TokenIds
    finish_reason: FinishReason | None = None
    cached_tokens: Count = 0
