"""A worker: one engine behind a ZMQ connection to the router.

`Worker` owns the loop: messages in, one engine step when it is due, token updates out, heartbeats. Messages are
also taken while the GPU runs a step (`_meanwhile`). What ends on another thread (a step's GPU work, a KV transfer)
wakes the loop through its `Wakeup`. A role (the colocated one below; `prefill_worker/`,
`decode_worker/`) says which messages it takes (`handlers`), may add sockets of its own to the loop (`inputs`: the
KV data channel) and work to do outside the engine (`tick`), and what follows a step (`on_step`).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import zmq

from common import auth
from common import protocol as P
from common.config import EngineConfig
from common.engine.llm_engine import LLMEngine
from common.engine.sequence import Sequence
from common.faults import Faults, crash
from common.sampling_params import InvalidRequest
from common.worker.config import WorkerConfig, model_fingerprint
from common.worker.liveness import Liveness
from common.stalls import startup_heap_frozen
from common.worker.timeline import Timeline
from common.worker.wakeup import Event, Wakeup

log = logging.getLogger(__name__)

IDLE_POLL_MS = 20  # between messages when nothing runs (what ends on another thread wakes the loop sooner)


class Worker:
    role = ""

    def __init__(self, config: WorkerConfig, engine_config: EngineConfig):
        self.config = config
        self.engine = LLMEngine(engine_config)
        self.faults = Faults(config.fault_dir)
        self.timeline = Timeline(config.timeline_dir, config.worker_id, self.role)
        self.ctx = zmq.Context()
        self.keys = auth.keys_from_token(config.auth_token) if config.auth_token else None
        self._authenticator = auth.start_authenticator(self.ctx, self.keys) if self.keys else None
        self.router = self.ctx.socket(zmq.DEALER)
        self.router.setsockopt(zmq.IDENTITY, config.worker_id.encode())
        self.router.setsockopt(zmq.LINGER, 0)
        if self.keys:
            auth.secure_client(self.router, self.keys)
        self.router.connect(config.router_address)
        self.liveness = Liveness(self.ctx, config.worker_id, config.router_address, config.heartbeat_interval,
                                 self.keys)
        self._stopped = threading.Event()
        self.handlers: dict[type[P.Message], Callable] = {
            P.Ping: lambda msg: self.send(P.Pong(nonce=msg.nonce)),
            P.Shutdown: lambda msg: self.stop(),
            P.AbortRequest: lambda msg: self.abort(msg.request_id),
        }
        self.inputs: dict[zmq.Socket, Callable[[list[zmq.Frame]], None]] = {self.router: self._on_router_frames}
        self.wakeup = Wakeup()
        self._poller: zmq.Poller | None = None  # over `inputs` and `wakeup`'s descriptor, once `run` starts

    # ---- the loop -----------------------------------------------------------------------------------
    def run(self) -> None:
        with startup_heap_frozen():
            self.timeline.watch_gc()
            try:
                self._run()
            finally:
                self.timeline.unwatch_gc()

    def _run(self) -> None:
        self.send(self.hello())
        self.liveness.start()
        poller = self._poller = zmq.Poller()
        for sock in (*self.inputs, self.wakeup.fileno()):
            poller.register(sock, zmq.POLLIN)
        next_heartbeat = 0.0
        try:
            while not self._stopped.is_set():
                # take messages until the next step is due (whole ms)
                timeout = int(self.engine.launch_delay() * 1e3) if self.engine.has_unfinished() else IDLE_POLL_MS
                end = self.engine.early_launch_event() if timeout > 0 else None
                if end is not None:  # a step in flight that ends before the clock said launches the next
                    self.wakeup.watch(end)
                self._poll(timeout)
                now = time.monotonic()
                self.tick(now, expire=now >= next_heartbeat)
                if self.engine.has_unfinished() and self.engine.launch_delay() <= 0:
                    self.on_step(self._step())
                if now >= next_heartbeat:
                    self.send(P.Heartbeat(worker_id=self.config.worker_id, load=self.load()))
                    self.timeline.flush()
                    next_heartbeat = now + self.config.heartbeat_interval
        finally:
            self.close()

    def stop(self) -> None:
        self._stopped.set()

    def _step(self) -> list[Sequence]:
        self.liveness.step_started()
        try:
            if self.faults.folder is not None:
                time.sleep(self.faults.claim_seconds("slow_step", self._prompts(), self.config.worker_id))
            started = time.monotonic()
            updated = self.engine.step(idle=self._meanwhile)
            if self.timeline.on:
                if self.engine.launched is not None:
                    for seq in self.engine.launched.seqs:
                        self.timeline.first(seq.request_id, "launched", started)
                step = self.engine.last_step
                if step.steps:
                    self.timeline.step(step.seconds, step.gpu_seconds, len(updated))
            return updated
        finally:
            self.liveness.step_ended()

    def _meanwhile(self, step: Event) -> None:
        """While the GPU runs a step (`step`: its event; called until it has completed): take messages and end
        finished transfers as they come, not when the step is over. With overlap the next step is already launched,
        so a request that comes now joins the one after it either way; but a reservation is answered, and a landed
        handoff's first token reported, that much sooner. With work on another thread (`busy`: a KV transfer), wait
        blocked, woken by a message, that work's end or the step's: a KV link thread needs the GIL between its
        operations, and a loop that polls holds it. Otherwise poll: the step's end is seen soonest."""
        if self.busy():
            self.wakeup.watch(step)
            self._poll(IDLE_POLL_MS)
        else:
            self._poll(0)
        self.tick(time.monotonic(), expire=False)

    def _poll(self, timeout_ms: int) -> None:
        """Take what has come (waiting up to `timeout_ms` for something to)."""
        for sock, _ in self._poller.poll(timeout_ms):
            if sock == self.wakeup.fileno():  # a file descriptor comes back as its number
                self.wakeup.clear()
            else:
                self._drain(sock, self.inputs[sock])

    def _prompts(self):
        return (seq.token_ids for seq in self.engine.requests.values())

    def close(self) -> None:
        self.timeline.flush()
        self.liveness.stop()
        self.router.close()
        if self._authenticator is not None:
            self._authenticator.stop()
        self.ctx.term()
        self.wakeup.close()
        self.engine.close()

    def _drain(self, sock: zmq.Socket, handle: Callable[[list[zmq.Frame]], None]) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            handle(frames)

    def _on_router_frames(self, frames: list[zmq.Frame]) -> None:
        try:
            msg = P.decode(frames[0].buffer, expect=P.ROUTER_TO_WORKER)
        except P.ProtocolError as e:
            log.warning("bad frame from router: %s", e)
            self.send(P.error_reply(e))
            return
        handler = self.handlers.get(type(msg))
        if handler is None:
            self.send(P.Error(request_id=getattr(msg, "request_id", ""), code=P.UNKNOWN_TYPE,
                              message=f"a {self.role} worker does not take {msg.TYPE}"))
        else:
            handler(msg)

    # ---- what a role adds ---------------------------------------------------------------------------
    def load(self) -> P.WorkerLoad:
        """What its heartbeats report: the engine's load (a KV worker adds its handoffs' totals)."""
        return self.engine.load()

    def hello(self) -> P.WorkerHello:
        cfg = self.engine.config
        return P.WorkerHello(
            worker_id=self.config.worker_id, role=self.role, model_fingerprint=model_fingerprint(cfg),
            num_blocks=self.engine.block_manager.num_blocks, layout=self.engine.runner.kv_pool.layout,
            max_model_len=cfg.max_model_len, vocab_size=cfg.model_config.vocab_size, node_id=self.config.node_id,
            device_index=self.config.device_index)

    def busy(self) -> bool:
        """Work on another thread that wakes the loop when it ends (a KV transfer in flight)."""
        return False

    def tick(self, now: float, expire: bool) -> None:
        """Work outside the engine, between steps and while one runs (`expire`: deadlines are due for a check)."""

    def on_step(self, updated: list[Sequence]) -> None:
        self.report(updated)
        if self.timeline.on:
            for seq in updated:
                if seq.is_finished:
                    self.timeline.mark(seq.request_id, "finished")
                    self.timeline.forget(seq.request_id)
        if self.faults.claim("crash_decode", (s.token_ids for s in updated), self.config.worker_id):
            crash()

    def abort(self, request_id: str) -> None:
        """The router gave the request up: it leaves the engine, and its blocks are freed."""
        self.engine.abort(request_id)
        self.timeline.forget(request_id)

    # ---- shared by the roles ------------------------------------------------------------------------
    def send(self, msg: P.Message) -> None:
        self.router.send(P.encode(msg), copy=False)

    def fail(self, request_id: str, code: str, message: str, retry_after: float | None = None) -> None:
        self.send(P.Error(request_id=request_id, code=code, message=message[:P.MAX_MESSAGE_LEN],
                          retry_after=retry_after))

    def add_request(self, request_id: str, token_ids: list[int], sampling: P.Sampling, **kw) -> bool:
        self.timeline.mark(request_id, "received", tokens=len(token_ids))
        try:
            self.engine.add_request(request_id, token_ids, sampling, **kw)
            return True
        except InvalidRequest as e:
            self.fail(request_id, P.BAD_REQUEST, str(e))
            return False

    def report(self, seqs: list[Sequence]) -> None:
        """decode batch -> tokens: one token_batch for the sequences that got a token this step."""
        updates = [P.TokenUpdate(request_id=s.request_id, token_ids=[s.last_token],
                                 finish_reason=s.finish_reason if s.is_finished else None,
                                 cached_tokens=s.num_cached_tokens) for s in seqs]
        if updates:
            self.send(P.TokenBatch(updates=updates))


class ColocatedWorker(Worker):
    """Prefill and decode in one engine: the baseline disaggregation is measured against."""

    role = "colocated"

    def __init__(self, config: WorkerConfig, engine_config: EngineConfig):
        super().__init__(config, engine_config)
        self.handlers[P.GenerateTask] = lambda msg: self.add_request(msg.request_id, msg.token_ids, msg.sampling)
