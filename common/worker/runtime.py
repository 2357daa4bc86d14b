"""A worker: one engine behind a ZMQ connection to the router, plus a KV data channel to its peers.

`Worker` owns the loop (messages in, one engine step, token updates out, heartbeats, leases);
the roles (`ColocatedWorker` here, `PrefillWorker`, `DecodeWorker`) only add their handlers.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

import zmq

from common import auth
from common import protocol as P
from common.config import EngineConfig
from common.worker.config import WorkerConfig, model_fingerprint
from common.engine.llm_engine import LLMEngine
from common.faults import Faults, crash
from common.sampling_params import InvalidRequest
from common.engine.sequence import Sequence
from kvtransfer.channel import DataChannel
from kvtransfer.choice import available_transports
from kvtransfer.descriptors import TransferError, pack_descriptors
from kvtransfer.endpoint import make_transport

log = logging.getLogger(__name__)


class Worker:
    role = ""

    def __init__(self, config: WorkerConfig, engine_config: EngineConfig):
        self.config = config
        self.engine = LLMEngine(engine_config)
        self.faults = Faults(config.fault_dir)
        self.ctx = zmq.Context()
        keys = auth.keys_from_token(config.auth_token) if config.auth_token else None
        self._authenticator = auth.start_authenticator(self.ctx, keys) if keys else None
        self.router = self.ctx.socket(zmq.DEALER)
        self.router.setsockopt(zmq.IDENTITY, config.worker_id.encode())
        self.router.setsockopt(zmq.LINGER, 0)
        if keys:
            auth.secure_client(self.router, keys)
        self.router.connect(config.router_address)
        def secure(sock: zmq.Socket, server: bool) -> None:
            (auth.secure_server if server else auth.secure_client)(sock, keys)
        self.channel = DataChannel(self.ctx, config.host, secure if keys else None)
        pool = self.engine.runner.kv_pool
        names = config.kv_transports or available_transports(self.engine.config.device)
        self.transports = {}
        for name in names:
            try:
                self.transports[name] = make_transport(name, pool, config.host, config.handoff_timeout)
            except TransferError as e:
                if config.kv_transports:  # asked for by name: fail fast
                    raise
                log.warning("KV transport %s is not available: %s", name, e)
        self.layout = P.KVLayout(block_size=pool.layout.block_size, num_layers=pool.layout.num_layers,
                                 num_kv_heads=pool.layout.num_kv_heads, head_dim=pool.layout.head_dim,
                                 dtype=str(pool.layout.dtype).removeprefix("torch."))
        self._stopped = threading.Event()
        self.leases: dict[str, float] = {}  # request id -> deadline of its pending handoff
        # KV transfers still reading or writing a request's blocks (nccl): the blocks are freed only after.
        self.transfers: dict[str, Future] = {}
        self._abort_after_transfer: set[str] = set()

    # ---- the loop -----------------------------------------------------------------------------------
    def run(self) -> None:
        self.send(self.hello())
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.channel.inbox, zmq.POLLIN)
        next_heartbeat = 0.0
        try:
            while not self._stopped.is_set():
                if self.engine.has_unfinished():  # take messages until the next step is due (whole ms)
                    timeout = int(self.engine.launch_delay() * 1e3)
                else:
                    timeout = 1 if self.transfers else 20
                ready = dict(poller.poll(timeout))
                if self.router in ready:
                    self._drain(self.router, self._on_router_frame)
                if self.channel.inbox in ready:
                    self._drain(self.channel.inbox, self._on_data_frames)
                if self.transfers:
                    self._poll_transfers()
                if self.engine.has_unfinished() and self.engine.launch_delay() <= 0:
                    self.on_step(self.engine.step())
                now = time.monotonic()
                if now >= next_heartbeat:
                    self.send(P.Heartbeat(worker_id=self.config.worker_id, **self.engine.load()))
                    next_heartbeat = now + self.config.heartbeat_interval
                    self._expire_leases(now)
        finally:
            self.close()

    def stop(self) -> None:
        self._stopped.set()

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()
        self.channel.close()
        self.router.close()
        if self._authenticator is not None:
            self._authenticator.stop()
        self.ctx.term()
        self.engine.close()

    def _drain(self, sock: zmq.Socket, handle) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            handle(frames)

    def _on_router_frame(self, frames: list[zmq.Frame]) -> None:
        try:
            msg = P.decode(frames[0].buffer, expect=P.ROUTER_TO_WORKER)
        except P.ProtocolError as e:
            log.warning("bad frame from router: %s", e)
            self.send(e.to_error())
            return
        if isinstance(msg, P.Ping):
            self.send(P.Pong(nonce=msg.nonce))
        elif isinstance(msg, P.Shutdown):
            self.stop()
        elif isinstance(msg, P.AbortRequest):
            self.abort(msg.request_id)
        else:
            self.on_message(msg)

    def _on_data_frames(self, frames: list[zmq.Frame]) -> None:
        try:
            msg = P.decode(frames[0].buffer, expect=P.DATA_PLANE)
        except P.ProtocolError as e:
            log.warning("bad frame on the data channel: %s", e)
            return
        self.on_data(msg, [f.buffer for f in frames[1:]])

    def _poll_transfers(self) -> None:
        for request_id in [r for r, f in self.transfers.items() if f.done()]:
            future = self.transfers.pop(request_id)
            aborted = request_id in self._abort_after_transfer
            self._abort_after_transfer.discard(request_id)
            self.on_transfer_done(request_id, future, aborted)

    def _expire_leases(self, now: float) -> None:
        for request_id in [r for r, deadline in self.leases.items() if deadline < now]:
            log.warning("request %s: KV handoff timed out", request_id)
            self.abort(request_id)
            self.send(P.Error(request_id=request_id, code=P.TIMEOUT, message="KV handoff timed out"))

    # ---- shared by the roles ------------------------------------------------------------------------
    def send(self, msg: P.Message) -> None:
        self.router.send(P.encode(msg), copy=False)

    def hello(self) -> P.WorkerHello:
        cfg, ecfg = self.config, self.engine.config
        descriptors = {name: t.descriptor() for name, t in self.transports.items()}
        return P.WorkerHello(
            worker_id=cfg.worker_id, role=self.role, model_fingerprint=model_fingerprint(ecfg),
            num_blocks=self.engine.block_manager.num_blocks, layout=self.layout, max_model_len=ecfg.max_model_len,
            vocab_size=ecfg.model_config.vocab_size, transports=list(self.transports),
            kv_address=self.channel.address, kv_descriptor=pack_descriptors(descriptors),
            node_id=cfg.node_id, device_index=cfg.device_index)

    def add_request(self, request_id: str, token_ids: list[int], sampling, **kw) -> bool:
        try:
            self.engine.add_request(request_id, token_ids, sampling, **kw)
            return True
        except InvalidRequest as e:
            self.send(P.Error(request_id=request_id, code=P.BAD_REQUEST, message=str(e)))
            return False

    def abort(self, request_id: str) -> None:
        self.leases.pop(request_id, None)
        if request_id in self.transfers:  # a transport still touches its blocks: free them when it is done
            self._abort_after_transfer.add(request_id)
            return
        self.engine.abort(request_id)

    def report(self, seqs: list[Sequence]) -> None:
        """One token_batch for the sequences that got a token this step."""
        updates = [P.TokenUpdate(request_id=s.request_id, token_ids=[s.last_token],
                                 finish_reason=s.finish_reason if s.is_finished else None,
                                 cached_tokens=s.num_cached_tokens) for s in seqs]
        if updates:
            self.send(P.TokenBatch(updates=updates))

    # ---- what the roles implement -------------------------------------------------------------------
    def on_message(self, msg: P.Message) -> None:
        self.send(P.Error(request_id=getattr(msg, "request_id", ""), code=P.UNKNOWN_TYPE,
                          message=f"a {self.role} worker does not take {msg.TYPE}"))

    def on_data(self, msg: P.Message, frames: list[memoryview]) -> None:
        log.warning("a %s worker got an unexpected %s on its data channel", self.role, msg.TYPE)

    def on_step(self, updated: list[Sequence]) -> None:
        self.report(updated)
        if self.faults.claim("crash_decode", (s.token_ids for s in updated), self.config.worker_id):
            crash()

    def on_transfer_done(self, request_id: str, future: Future, aborted: bool) -> None:
        """A KV transfer in `transfers` ended (`future` holds its outcome); `aborted`: the request was
        aborted meanwhile and its blocks wait to be freed."""
        if aborted:
            self.abort(request_id)


class ColocatedWorker(Worker):
    """Prefill and decode in one engine: the baseline disaggregation is measured against."""

    role = "colocated"

    def on_message(self, msg: P.Message) -> None:
        if isinstance(msg, P.GenerateTask):
            self.add_request(msg.request_id, msg.token_ids, msg.sampling)
        else:
            super().on_message(msg)
