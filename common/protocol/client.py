"""Messages between clients and the router (docs/protocol.md, "Client <-> router messages")."""
from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from common.protocol.errors import ERROR_CODES
from common.protocol.records import RouterTotals, Timings, Usage, WorkerStats
from common.protocol.schema import (
    MAX_SCALE_DELTA, Count, FinishReason, Id, Message, Message_, OptionalId, Prompt, Role, Seconds, Text, TokenIds,
    message,
)
from common.sampling_params import InvalidRequest, SamplingParams

# The wire record for sampling *is* the engine's SamplingParams: one set of defaults and checks.
Sampling = SamplingParams
ErrorCode = Literal[ERROR_CODES]
# Stop strings: matched by the router on the detokenized completion (the engine sees only token ids).
MAX_STOP_STRINGS = 16
StopStrings = Annotated[list[Annotated[str, Meta(min_length=1, max_length=256)]], Meta(max_length=MAX_STOP_STRINGS)]


@message
class Submit(Message, tag="submit", kw_only=True):
    request_id: Id
    prompt: Text | None = None
    token_ids: Prompt | None = None
    chat: bool = False
    sampling: Sampling = Sampling()
    stream: bool = False
    stop: StopStrings = []
    migrate: bool = True  # a streamed request whose worker dies continues on another (False: it ends `aborted`)

    def _check(self) -> None:
        if (self.prompt is None) == (self.token_ids is None):
            raise InvalidRequest("prompt", "exactly one of prompt and token_ids must be given")
        if self.chat and self.prompt is None:
            raise InvalidRequest("chat", "the chat template applies to a prompt, not to token_ids")


@message
class Abort(Message, tag="abort", kw_only=True):
    request_id: Id


@message
class Ping(Message, tag="ping", kw_only=True):
    nonce: int | None = None


@message
class Pong(Message, tag="pong", kw_only=True):
    nonce: int | None = None


@message
class StatsRequest(Message, tag="stats_request", kw_only=True):
    pass


@message
class Stats(Message, tag="stats", kw_only=True):
    uptime: Seconds
    requests_in_flight: Count
    queued_requests: Count
    workers: list[WorkerStats]
    totals: RouterTotals = RouterTotals()
    kv_links_opening: Count = 0  # prefill -> decode KV links the router asked for that are not open yet


@message
class ScaleRequest(Message, tag="scale_request", kw_only=True):
    role: Role
    delta: Annotated[int, Meta(ge=-MAX_SCALE_DELTA, le=MAX_SCALE_DELTA)]
    nonce: int | None = None

    def _check(self) -> None:
        if self.delta == 0:
            raise InvalidRequest("delta", "must not be 0")


@message
class ScaleReply(Message, tag="scale_reply", kw_only=True):
    nonce: int | None = None
    ok: bool
    message: Message_ = ""
    workers: Annotated[list[Id], Meta(max_length=MAX_SCALE_DELTA)] = []  # the ids started or removed


@message
class Delta(Message, tag="delta", kw_only=True):
    request_id: Id
    token_ids: TokenIds
    text: Text
    index: Count


@message
class Result(Message, tag="result", kw_only=True):
    request_id: Id
    token_ids: TokenIds
    text: Text
    finish_reason: FinishReason
    usage: Usage
    timings: Timings


@message
class Error(Message, tag="error", kw_only=True):
    request_id: OptionalId  # "" when the error concerns no request
    code: ErrorCode
    message: Message_
    retry_after: Seconds | None = None
