from __future__ import annotations

import logging
import time

from common import protocol as P
from common.sampling_params import InvalidRequest
from common.worker.runtime import Worker

log = logging.getLogger(__name__)


class DecodeWorker(Worker):
    """Reserves blocks for a prompt before any KV is sent (a transfer never writes blocks this worker
    does not own), admits the request into continuous batching when its KV lands, and streams tokens."""

    role = "decode"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.handoffs: dict[str, P.KVHandoff] = {}  # handoffs whose KV is still arriving (streaming transports)

    def on_message(self, msg: P.Message) -> None:
        if not isinstance(msg, P.Reserve):
            return super().on_message(msg)
        try:
            blocks = self.engine.reserve(msg.request_id, msg.token_ids, msg.sampling)
        except InvalidRequest as e:
            self.send(P.Error(request_id=msg.request_id, code=P.BAD_REQUEST, message=str(e)))
            return
        if blocks is None:
            self.send(P.Error(request_id=msg.request_id, code=P.OVERLOADED, retry_after=0.05,
                              message=f"decode worker {self.config.worker_id} has no free KV blocks"))
            return
        self.leases[msg.request_id] = time.monotonic() + self.config.handoff_timeout
        self.send(P.Reserved(request_id=msg.request_id, block_ids=blocks))

    def on_data(self, msg: P.Message, frames: list[memoryview]) -> None:
        if isinstance(msg, P.KVHandoff):
            self.receive(msg, frames)
        else:
            super().on_data(msg, frames)

    def receive(self, h: P.KVHandoff, frames: list[memoryview]) -> None:
        """transfer -> decode batch: land the KV in the reserved blocks, admit the request, report its first token."""
        reserved = self.engine.reserved.get(h.request_id)
        transport = self.transports.get(h.transport)
        problem = None
        if h.request_id in self.transfers:
            problem = "a handoff of this request is already arriving"
        elif reserved is None:
            problem = "no reservation (aborted or timed out)"
        elif h.layout != self.layout:
            problem = f"KV layout mismatch: sender {h.layout}, receiver {self.layout}"
        elif h.dst_block_ids != reserved.block_table or h.num_tokens != reserved.num_prompt_tokens:
            problem = "handoff does not match the reservation"
        elif transport is None:
            problem = f"no {h.transport!r} transport here"
        pending = None
        code = P.INTERNAL  # a mismatch is a bug or a misconfiguration
        if problem is None:
            try:
                pending = transport.receive(h.request_id, h.src_worker_id, h.dst_block_ids, frames)
            except Exception as e:
                log.exception("request %s: receiving KV failed", h.request_id)
                problem, code = f"receiving KV failed: {e}", P.ABORTED
        elif transport is not None:
            try:  # a streaming sender still sends the bytes: take them off the wire, or later handoffs misalign
                transport.discard(h.request_id, h.src_worker_id, frames)
            except Exception as e:
                log.warning("request %s: could not discard the refused KV: %s", h.request_id, e)
        if pending is not None:  # the KV is on its way: admit the request once it has landed
            self.transfers[h.request_id] = pending
            self.handoffs[h.request_id] = h
            return
        self.finish_receive(h, problem, code)

    def on_transfer_done(self, request_id: str, future, aborted: bool) -> None:
        h = self.handoffs.pop(request_id)
        if aborted:
            self.channel.send(h.reply_to, P.HandoffAck(request_id=request_id, ok=False, message="aborted"))
            self.abort(request_id)
        elif future.exception() is not None:
            log.error("request %s: receiving KV failed: %s", request_id, future.exception())
            self.finish_receive(h, f"receiving KV failed: {future.exception()}", P.ABORTED)
        else:
            self.finish_receive(h, None)

    def finish_receive(self, h: P.KVHandoff, problem: str | None, code: str = P.INTERNAL) -> None:
        """Acknowledge the handoff; admit the request, or fail it when its KV did not land."""
        problem = problem if problem is None else problem[:P.MAX_MESSAGE_LEN]
        # Acked either way: the prefill worker frees its blocks now, not when its lease runs out.
        self.channel.send(h.reply_to, P.HandoffAck(request_id=h.request_id, ok=problem is None, message=problem or ""))
        if problem is not None:
            if h.request_id in self.engine.reserved and h.request_id not in self.transfers:
                self.abort(h.request_id)
                self.send(P.Error(request_id=h.request_id, code=code, message=problem))
            return
        self.leases.pop(h.request_id, None)
        seq = self.engine.admit_prefilled(h.request_id, h.first_token)
        seq.num_cached_tokens = h.cached_tokens
        self.report([seq])
