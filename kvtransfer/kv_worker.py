"""The part of a worker that takes part in KV handoffs: its data-plane endpoint, published in its hello, and its
handoff table, polled by the worker's loop. The prefill and decode workers are its two sides."""
from __future__ import annotations

import logging
import sys

import msgspec
import zmq

from common import auth
from common import protocol as P
from common.config import EngineConfig
from common.worker.config import WorkerConfig
from common.worker.runtime import Worker
from kvtransfer.endpoint import KVEndpoint
from kvtransfer.handoff import Handoff, HandoffTable

log = logging.getLogger(__name__)

# The GIL switch interval of a KV worker's process: a link thread waiting for the GIL gets it back from a main
# thread busy in Python within this, not the interpreter's default 5 ms (docs/benchmarks.md, stop 25).
SWITCH_INTERVAL_S = 0.0005


class KVWorker(Worker):
    """A role says which records it takes on its data channel (`data_records`, handled by `on_record`) and how it
    settles a handoff the table returns (`settle`)."""

    data_records: tuple[type[P.Message], ...] = ()

    def __init__(self, config: WorkerConfig, engine_config: EngineConfig):
        super().__init__(config, engine_config)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.kv = KVEndpoint(self.ctx, self.engine.runner.kv_pool, self.engine.config.device, config.kv_transports,
                             config.host, config.handoff_timeout, auth.socket_security(self.keys))
        self.handoffs = HandoffTable(on_transfer_end=self.wakeup.wake)
        self.inputs[self.kv.channel.inbox] = self._on_data_frames

    def hello(self) -> P.WorkerHello:
        return msgspec.structs.replace(super().hello(), transports=list(self.kv.transports),
                                       kv_address=self.kv.address, kv=self.kv.descriptors())

    def load(self) -> P.WorkerLoad:
        return msgspec.structs.replace(super().load(), handoffs=self.handoffs.totals())

    def close(self) -> None:
        self.kv.close()
        super().close()

    def _on_data_frames(self, frames: list[zmq.Frame]) -> None:
        try:
            record = P.decode(frames[0].buffer, expect=self.data_records)
        except P.ProtocolError as e:
            log.warning("bad frame on the data channel: %s", e)
            return
        self.on_record(record, [f.buffer for f in frames[1:]])

    def on_record(self, record: P.Message, payload: list[memoryview]) -> None:
        raise NotImplementedError

    # ---- the handoffs' lives ---------------------------------------------------------------------------
    def busy(self) -> bool:
        return self.handoffs.transferring

    def tick(self, now: float, expire: bool) -> None:
        for h in self.handoffs.transfers_ended() + (self.handoffs.expired(now) if expire else []):
            self.settle(h)

    def settle(self, h: Handoff) -> None:
        raise NotImplementedError

    def abort(self, request_id: str) -> None:
        """The router gave the request up. A handoff in flight fails (nothing reported back) and its blocks are
        freed once no transport touches them."""
        h = self.handoffs.get(request_id)
        if h is None:
            self.engine.abort(request_id)
            return
        h.fail(P.ABORTED, "aborted", report=False)
        self.settle(h)

    def report_failure(self, h: Handoff) -> None:
        """A FAILED handoff's error, to the router, once (not for a request the router itself aborted)."""
        if h.report and not h.reported:
            h.reported = True
            log.warning("request %s: %s", h.request_id, h.reason)
            self.fail(h.request_id, h.code, h.reason)
