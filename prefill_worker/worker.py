from __future__ import annotations

import dataclasses
import logging
import time

from common import protocol as P
from common.faults import crash
from common.engine.sequence import Sequence
from common.config import EngineConfig
from common.worker.runtime import Worker, WorkerConfig
from kvtransfer.descriptors import TransferError, unpack_descriptors

log = logging.getLogger(__name__)


class PrefillWorker(Worker):
    """Prefills prompts in varlen batches, samples each first token, and hands the KV blocks to the decode
    worker that reserved room for them. Its blocks stay held (and stay in its prefix cache) until the
    decode worker acknowledges the handoff, or the lease runs out, and in any case until the transport
    has stopped reading them."""

    role = "prefill"

    def __init__(self, config: WorkerConfig, engine_config: EngineConfig):
        # Its batches are prompts only: decode CUDA graphs would cost memory and start-up time for nothing.
        super().__init__(config, dataclasses.replace(engine_config, enforce_eager=True))
        self.tasks: dict[str, P.PrefillTask] = {}

    def on_message(self, msg: P.Message) -> None:
        if not isinstance(msg, P.PrefillTask):
            return super().on_message(msg)
        if self.faults.claim("crash_prefill", [msg.token_ids], self.config.worker_id):
            crash()
        expected = self.engine.block_manager.blocks_needed(len(msg.token_ids))
        if len(msg.dst_block_ids) != expected:
            self.send(P.Error(request_id=msg.request_id, code=P.BAD_REQUEST,
                              message=f"{len(msg.dst_block_ids)} destination blocks for a prompt needing {expected}"))
        elif msg.transport not in self.transports:
            self.send(P.Error(request_id=msg.request_id, code=P.UNAVAILABLE,
                              message=f"this prefill worker has no {msg.transport!r} transport"))
        elif self.add_request(msg.request_id, msg.token_ids, msg.sampling, prefill_only=True):
            self.tasks[msg.request_id] = msg

    def on_step(self, updated: list[Sequence]) -> None:
        for seq in updated:
            if seq.finish_reason == "prefilled":
                self.hand_off(seq)

    def hand_off(self, seq: Sequence) -> None:
        """prefill batch -> KV blocks -> transfer: move the prompt's blocks into the decode worker's."""
        task = self.tasks[seq.request_id]
        n = len(task.dst_block_ids)
        fault = next((f for f in ("kv_send_error", "kv_drop", "kv_corrupt")
                      if self.faults.claim(f, [seq.token_ids], self.config.worker_id)), None)
        try:
            if fault == "kv_send_error":
                raise TransferError("injected fault kv_send_error")
            descriptor = unpack_descriptors(task.decode_kv_descriptor).get(task.transport, b"")
            sent = self.transports[task.transport].send(seq.request_id, task.decode_worker_id, descriptor,
                                                        seq.block_table[:n], task.dst_block_ids)
            frames = [memoryview(b"\0")] if fault == "kv_corrupt" else sent.frames
            handoff = P.KVHandoff(request_id=seq.request_id, src_worker_id=self.config.worker_id,
                                  first_token=seq.last_token, num_tokens=seq.num_prompt_tokens,
                                  transport=task.transport, layout=self.layout, dst_block_ids=task.dst_block_ids,
                                  reply_to=self.channel.address, cached_tokens=seq.num_cached_tokens)
            if sent.done is not None:  # still streaming from our blocks: keep them until it is done
                self.transfers[seq.request_id] = sent.done
            if fault != "kv_drop":  # a dropped handoff is found out by the leases on both sides
                self.channel.send(task.decode_kv_address, handoff, frames)
        except Exception as e:  # the request fails and its blocks are freed on both sides; the worker goes on
            log.exception("request %s: KV transfer to %s failed", seq.request_id, task.decode_worker_id)
            self.fail_transfer(seq.request_id, e)
            return
        self.leases[seq.request_id] = time.monotonic() + self.config.handoff_timeout

    def on_transfer_done(self, request_id: str, future, aborted: bool) -> None:
        if aborted:
            self.abort(request_id)
        elif future.exception() is not None:
            log.error("request %s: KV transfer failed: %s", request_id, future.exception())
            self.fail_transfer(request_id, future.exception())

    def fail_transfer(self, request_id: str, e: BaseException) -> None:
        self.abort(request_id)
        message = f"KV transfer failed: {e}"[:P.MAX_MESSAGE_LEN]
        self.send(P.Error(request_id=request_id, code=P.ABORTED, message=message))

    def on_data(self, msg: P.Message, frames: list[memoryview]) -> None:
        if isinstance(msg, P.HandoffAck):
            if not msg.ok:
                log.warning("request %s: decode worker refused the KV: %s", msg.request_id, msg.message)
            self.abort(msg.request_id)  # frees the held blocks either way
        else:
            super().on_data(msg, frames)

    def abort(self, request_id: str) -> None:
        self.tasks.pop(request_id, None)
        super().abort(request_id)
