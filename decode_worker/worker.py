"""The decode worker: reserves blocks, lands the KV a prefill worker sends into them, and decodes in batches; a
prompt the router sends it whole (`generate_task`) it prefills itself, in small chunks between decode steps."""
from __future__ import annotations

import logging
import time

from common import protocol as P
from common.config import EngineConfig
from common.sampling_params import InvalidRequest
from common.worker.config import WorkerConfig
from kvtransfer.errors import TransferError
from kvtransfer.handoff import Handoff, HandoffState
from kvtransfer.kv_worker import KVWorker

log = logging.getLogger(__name__)


class DecodeWorker(KVWorker):
    """Reserves blocks for a prompt before any KV is sent (a transfer never writes blocks this worker does not
    own), admits the request into continuous batching once its KV has landed, and streams its tokens. A request
    aborted or timed out while its KV still lands keeps its blocks until the transport is done with them."""

    role = "decode"
    data_records = (P.KVHandoff, P.KVLinkOpen)

    def __init__(self, config: WorkerConfig, engine_config: EngineConfig):
        super().__init__(config, engine_config)
        self.handlers[P.Reserve] = self.on_reserve
        # A prompt the router has this worker prefill itself (--disagg-policy): chunks small enough that the
        # running decodes keep their pace.
        self.handlers[P.GenerateTask] = lambda msg: self.add_request(msg.request_id, msg.token_ids, msg.sampling)
        self.engine.scheduler.max_prefill_tokens = config.local_prefill_chunk

    # ---- router -> decode: room for the KV ------------------------------------------------------------
    def on_reserve(self, msg: P.Reserve) -> None:
        self.timeline.mark(msg.request_id, "received", tokens=len(msg.token_ids))
        try:
            blocks = self.engine.reserve(msg.request_id, msg.token_ids, msg.sampling)
        except InvalidRequest as e:
            self.fail(msg.request_id, P.BAD_REQUEST, str(e))
            return
        if blocks is None:
            self.fail(msg.request_id, P.OVERLOADED, f"decode worker {self.config.worker_id} has no free KV blocks",
                      retry_after=0.05)
            return
        # No deadline while the prefill runs, however long: the router owns that wait (kvtransfer/handoff.py).
        self.handoffs.open(Handoff(msg.request_id, msg.prefill_worker_id, deadline=None))
        self.send(P.Reserved(request_id=msg.request_id, block_ids=blocks))

    # ---- transfer -> decode batch --------------------------------------------------------------------
    def on_record(self, record: P.KVHandoff | P.KVLinkOpen, payload: list[memoryview]) -> None:
        if isinstance(record, P.KVLinkOpen):
            self.join(record)
        else:
            self.receive(record, payload)

    def join(self, record: P.KVLinkOpen) -> None:
        """A prefill worker opened its KV link to this one ahead of any handoff: take its end. A link that fails
        to open fails there too, and the prefill worker's next handoff opens another."""
        transport = self.kv.transports.get(record.transport)
        try:
            if transport is None:
                raise TransferError(f"no {record.transport!r} transport here")
            transport.join(record.src_worker_id, record.link)
        except TransferError as e:
            log.warning("KV link %s from %s: %s", record.link, record.src_worker_id, e)

    def receive(self, record: P.KVHandoff, frames: list[memoryview]) -> None:
        """Land the KV in the reserved blocks (now, or when the transport is done), then admit the request."""
        self.timeline.mark(record.request_id, "kv_record")
        h = self.handoffs.get(record.request_id)
        seq = self.engine.get(record.request_id)
        transport = self.kv.transports.get(record.transport)
        problem = None
        if h is None:
            problem = "no reservation (aborted or timed out)"
        elif h.state is not HandoffState.RESERVED:
            problem = "a handoff of this request is already arriving"
        elif record.dst_block_ids != seq.block_table or record.num_tokens != seq.num_prompt_tokens:
            problem = "handoff does not match the reservation"
        elif transport is None:
            problem = f"no {record.transport!r} transport here"
        if problem is not None:
            self.refuse(record, frames, transport, problem)
            if h is not None and h.state is HandoffState.RESERVED:  # a mismatch: a bug or a misconfiguration
                h.fail(P.INTERNAL, problem)
                self.settle(h)
            return
        h.record = record
        try:
            pending = transport.receive(record, seq.block_table, frames)
        except Exception as e:
            log.exception("request %s: receiving KV failed", record.request_id)
            h.fail(P.ABORTED, f"receiving KV failed: {e}")
            self.settle(h)
            return
        h.moving(pending, HandoffState.LANDING, time.monotonic() + self.config.handoff_timeout)
        self.handoffs.watch(h)
        if h.state is HandoffState.LANDED:
            self.settle(h)

    def refuse(self, record: P.KVHandoff, frames: list[memoryview], transport, problem: str) -> None:
        """Acknowledge a handoff this worker will not take; a streaming sender's bytes are still taken off the
        wire, or the handoffs after it would misalign."""
        if transport is not None:
            try:
                transport.discard(record, frames)
            except Exception as e:
                log.warning("request %s: could not discard the refused KV: %s", record.request_id, e)
        self.kv.channel.send(record.reply_to, P.HandoffAck(request_id=record.request_id, ok=False,
                                                           message=problem[:P.MAX_MESSAGE_LEN]))

    # ---- the handoffs' lives ---------------------------------------------------------------------------
    def settle(self, h: Handoff) -> None:
        """LANDED: admit the request and acknowledge. FAILED: acknowledge (the prefill worker frees its blocks now),
        report (once), and free the reserved blocks once no transport writes into them."""
        if h.state is HandoffState.LANDED:
            self.answer(h, ok=True)
            self.timeline.mark(h.request_id, "landed")
            seq = self.engine.admit_prefilled(h.request_id, h.record.first_token, h.record.cached_tokens)
            h.state = HandoffState.ACKED
            self.handoffs.close(h.request_id)
            self.report([seq])
            return
        if h.state is not HandoffState.FAILED:
            return
        self.answer(h, ok=False)
        self.report_failure(h)
        if not h.busy:
            self.engine.abort(h.request_id)
            self.handoffs.close(h.request_id)

    def answer(self, h: Handoff, ok: bool) -> None:
        """The handoff_ack, once, to the prefill worker that sent the KV (if it came)."""
        if h.record is None or h.answered:
            return
        h.answered = True
        self.kv.channel.send(h.record.reply_to, P.HandoffAck(request_id=h.request_id, ok=ok,
                                                             message="" if ok else h.reason[:P.MAX_MESSAGE_LEN]))
