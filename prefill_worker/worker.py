"""The prefill worker: prompts in, KV blocks and first tokens out to the decode workers that reserved room."""
from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future

import zmq

from common import protocol as P
from common.config import EngineConfig
from common.engine.sequence import Sequence
from common.faults import crash
from common.worker.config import WorkerConfig
from kvtransfer.errors import TransferError
from kvtransfer.handoff import Handoff, HandoffState
from kvtransfer.kv_worker import KVWorker

log = logging.getLogger(__name__)


class PrefillWorker(KVWorker):
    """Prefills prompts in varlen batches, samples each first token, and hands the KV blocks to the decode
    worker that reserved room for them. A request's blocks stay held (and in its prefix cache) until the decode
    worker acknowledges the handoff or its deadline passes, and in any case until the transport has stopped
    reading them (`kvtransfer/handoff.py`)."""

    role = "prefill"
    data_records = (P.HandoffAck,)

    def __init__(self, config: WorkerConfig, engine_config: EngineConfig):
        # Its batches are prompts only: decode CUDA graphs would cost memory and start-up time for nothing.
        super().__init__(config, dataclasses.replace(engine_config, cuda_graph_max_bs=0))
        self.handlers[P.PrefillTask] = self.on_prefill_task
        self.handlers[P.OpenLink] = self.on_open_link
        self.opening: dict[str, Future] = {}  # decode worker -> its link's first message, in flight

    # ---- router -> prefill: a KV link before a handoff needs it ---------------------------------------
    def on_open_link(self, msg: P.OpenLink) -> None:
        """Open the KV link to a decode worker now: its first handoff would otherwise pay for it (the router asks
        as the two workers meet, and the cluster is ready once they are open)."""
        transport = self.kv.transports.get(msg.transport)
        try:
            if transport is None:
                raise TransferError(f"this prefill worker has no {msg.transport!r} transport")
            self.kv.channel.connect(msg.decode_kv_address)  # every handoff's record goes this way
            opened = transport.open(msg.decode_worker_id, msg.decode_kv)
        except (TransferError, zmq.ZMQError) as e:
            self.send(P.LinkOpened(decode_worker_id=msg.decode_worker_id, error=str(e)[:P.MAX_MESSAGE_LEN]))
            return
        if opened is None:  # nothing to set up
            self.send(P.LinkOpened(decode_worker_id=msg.decode_worker_id))
            return
        link, done = opened
        self.kv.channel.send(msg.decode_kv_address, P.KVLinkOpen(src_worker_id=self.config.worker_id,
                                                                 transport=msg.transport, link=link), [])
        self.opening[msg.decode_worker_id] = done
        done.add_done_callback(lambda _: self.wakeup.wake())

    def busy(self) -> bool:
        return super().busy() or bool(self.opening)

    def tick(self, now: float, expire: bool) -> None:
        super().tick(now, expire)
        for peer in [peer for peer, done in self.opening.items() if done.done()]:
            error = self.opening.pop(peer).exception()
            if error is not None:
                log.warning("KV link to %s did not open: %s", peer, error)
            self.send(P.LinkOpened(decode_worker_id=peer,
                                   error="" if error is None else str(error)[:P.MAX_MESSAGE_LEN]))

    # ---- router -> prefill -> KV blocks --------------------------------------------------------------
    def on_prefill_task(self, task: P.PrefillTask) -> None:
        """router -> prefill batch: queue the prompt; its blocks go to `task.dst_block_ids` once prefilled."""
        if self.faults.claim("crash_prefill", [task.token_ids], self.config.worker_id):
            crash()
        expected = self.engine.block_manager.blocks_needed(len(task.token_ids))
        if len(task.dst_block_ids) != expected:
            self.fail(task.request_id, P.BAD_REQUEST,
                      f"{len(task.dst_block_ids)} destination blocks for a prompt needing {expected}")
        elif task.transport not in self.kv.transports:
            self.fail(task.request_id, P.UNAVAILABLE, f"this prefill worker has no {task.transport!r} transport")
        elif self.add_request(task.request_id, task.token_ids, task.sampling, prefill_only=True):
            self.handoffs.open(Handoff(task.request_id, task.decode_worker_id, deadline=None, task=task))

    def on_step(self, updated: list[Sequence]) -> None:
        for seq in updated:
            if seq.finish_reason == "prefilled":
                self.timeline.mark(seq.request_id, "prefilled")
                self.timeline.forget(seq.request_id)
                self.hand_off(seq)

    def hand_off(self, seq: Sequence) -> None:
        """KV blocks -> transfer: move the prompt's blocks into the decode worker's, then announce them."""
        h = self.handoffs.get(seq.request_id)
        task = h.task
        fault = next((f for f in ("kv_send_error", "kv_drop", "kv_corrupt")
                      if self.faults.claim(f, [seq.token_ids], self.config.worker_id)), None)
        h.sent_at = began = time.monotonic()
        cpu = time.thread_time()
        h.sent_bytes = len(task.dst_block_ids) * self.engine.runner.kv_pool.layout.block_bytes
        try:
            if fault == "kv_send_error":
                raise TransferError("injected fault kv_send_error")
            sent = self.kv.transports[h.transport].send(seq.request_id, task.decode_worker_id, task.decode_kv,
                                                           seq.block_table[:len(task.dst_block_ids)],
                                                           task.dst_block_ids)
            h.moving(sent.done, HandoffState.SENDING, time.monotonic() + self.config.handoff_timeout)
            self.handoffs.watch(h)
            record = P.KVHandoff(request_id=seq.request_id, src_worker_id=self.config.worker_id,
                                 first_token=seq.last_token, num_tokens=seq.num_prompt_tokens,
                                 transport=task.transport, dst_block_ids=task.dst_block_ids,
                                 reply_to=self.kv.address, cached_tokens=seq.num_cached_tokens, nccl=sent.nccl)
            payload = [memoryview(b"\0")] if fault == "kv_corrupt" else sent.payload
            # before the send: the decode worker may mark its receipt first
            self.timeline.mark(seq.request_id, "kv_sent", send_us=round((time.monotonic() - began) * 1e6),
                               wait_us=round(sent.waited * 1e6), copy_us=round(sent.copy_gpu * 1e6),
                               cpu_us=round((time.thread_time() - cpu) * 1e6))
            if fault != "kv_drop":  # a dropped handoff is found out by the deadlines on both sides
                self.kv.channel.send(task.decode_kv_address, record, payload)
        except Exception as e:  # the request fails and its blocks are freed on both sides; the worker goes on
            log.exception("request %s: KV transfer to %s failed", seq.request_id, task.decode_worker_id)
            h.fail(P.ABORTED, f"KV transfer failed: {e}")
            self.settle(h)

    # ---- decode -> prefill: the acknowledgement -------------------------------------------------------
    def on_record(self, msg: P.HandoffAck, payload: list[memoryview]) -> None:
        h = self.handoffs.get(msg.request_id)
        if h is None:
            return
        if msg.ok:
            self.handoffs.acked(h, time.monotonic())
        else:  # the decode worker refused it and told the router: only the blocks are left to free here
            log.warning("request %s: decode worker refused the KV: %s", msg.request_id, msg.message)
            h.fail(P.ABORTED, msg.message, report=False)
        self.settle(h)

    # ---- the handoffs' lives ---------------------------------------------------------------------------
    def settle(self, h: Handoff) -> None:
        """LANDED: sent, the ack is awaited. ACKED or FAILED: report a failure (once), and free the blocks once no
        transport reads them."""
        if h.state is HandoffState.FAILED:
            self.report_failure(h)
        if h.state in (HandoffState.ACKED, HandoffState.FAILED) and not h.busy:
            self.engine.abort(h.request_id)
            self.handoffs.close(h.request_id)
