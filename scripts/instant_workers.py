"""Workers without an engine, for the router's benchmarks: each speaks the worker protocol on a DEALER socket of its
own (its own ZMQ identity), says hello, heartbeats at the real interval and answers every request at once. Many
of them live in one process (`run_fleet`), so a thousand registered workers take a few processes.

- colocated: a `generate_task` is answered with one `token_batch` of all its tokens, finished by `length` (streamed:
  one update a token in that batch, as a real worker's steps would report them, so the router streams each);
- decode: a `reserve` is answered with `reserved` (block ids for the prompt); when the prefill worker's `kv_handoff`
  reaches the fleet's data inbox (the decode workers' `kv_address`), the request's tokens go out as above; a
  `generate_task` (a prompt it prefills itself) as a colocated worker would;
- prefill: a `prefill_task` is answered by sending its `kv_handoff`, with no KV, to the decode worker's inbox.
"""
from __future__ import annotations

import os
import random
import time
from collections import deque
from dataclasses import dataclass, field

import zmq

from common import protocol as P
from common.worker.config import WorkerConfig
from scripts.router_process import other_cores

LAYOUT = P.KVLayout(block_size=16, num_layers=1, num_kv_heads=1, head_dim=8, dtype="float32")
NUM_BLOCKS = 1 << 20
HEARTBEAT_S = WorkerConfig.heartbeat_interval  # what real workers send at
BEAT_BATCH_S = 0.02  # heartbeats fall due at most this long before they are sent, with the others then due
LOAD = P.WorkerLoad(queued_requests=0, queued_tokens=0, running_requests=0, kv_blocks_total=NUM_BLOCKS,
                    kv_blocks_free=NUM_BLOCKS)


@dataclass
class InstantWorker:
    worker_id: str
    role: str
    sock: zmq.Socket
    max_tokens: dict[str, int] = field(default_factory=dict)  # decode: reserved requests -> tokens to answer

    def send(self, msg: P.Message) -> None:
        self.sock.send(P.encode(msg), copy=False)


def fleet_roles(mode: str, n: int) -> list[str]:
    """The roles of `n` workers: all colocated, or half prefill and half decode (one more decode when odd)."""
    if mode == "colocated":
        return ["colocated"] * n
    return ["prefill"] * (n // 2) + ["decode"] * (n - n // 2)


class Fleet:
    def __init__(self, router_address: str, workers: list[tuple[str, str]], tokens: int, host: str = "127.0.0.1",
                 stream: bool = False):
        self.ctx = zmq.Context()
        self.stream = stream
        self.answer = list(range(100, 100 + tokens))
        self.inbox = self.ctx.socket(zmq.PULL)  # the decode workers' data channel
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.kv_address = f"tcp://{host}:{self.inbox.bind_to_random_port(f'tcp://{host}')}"
        self.outboxes: dict[str, zmq.Socket] = {}  # prefill: a PUSH socket per decode inbox
        self.reserved: dict[str, InstantWorker] = {}  # request id -> the decode worker that reserved it
        self.workers: list[InstantWorker] = []
        for worker_id, role in workers:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, worker_id.encode())
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(router_address)
            self.workers.append(InstantWorker(worker_id, role, sock))
        self.by_socket = {w.sock: w for w in self.workers}

    def hello(self, worker: InstantWorker) -> P.WorkerHello:
        kv = {} if worker.role == "colocated" else {"transports": ["host"], "kv_address": self.kv_address}
        return P.WorkerHello(worker_id=worker.worker_id, role=worker.role, model_fingerprint="instant",
                             num_blocks=NUM_BLOCKS, layout=LAYOUT, max_model_len=4096, vocab_size=1 << 17, **kv)

    def run(self, stop) -> None:
        """Until `stop` (an Event) is set: hellos, then messages answered and heartbeats at the real interval, each
        worker's at its own phase (as independently started workers would be)."""
        for w in self.workers:
            w.send(self.hello(w))
        now = time.monotonic()
        beats = deque(sorted((now + random.uniform(0, HEARTBEAT_S), i) for i in range(len(self.workers))))
        poller = zmq.Poller()
        for sock in [self.inbox, *self.by_socket]:
            poller.register(sock, zmq.POLLIN)
        try:
            while not stop.is_set():
                # A poll over every socket costs: the heartbeats due are sent together, each up to BEAT_BATCH_S late
                send_at = beats[0][0] + BEAT_BATCH_S
                for sock, _ in poller.poll(max(0, min(100, int((send_at - time.monotonic()) * 1e3)) + 1)):
                    self._drain(sock)
                now = time.monotonic()
                if now < send_at:
                    continue
                while beats[0][0] <= now:
                    due, i = beats.popleft()
                    self.workers[i].send(P.Heartbeat(worker_id=self.workers[i].worker_id, load=LOAD))
                    beats.append((max(due + HEARTBEAT_S, now), i))
        finally:
            self.ctx.destroy(linger=0)

    def _drain(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if sock is self.inbox:
                self._landed(P.decode(frame, expect=P.DATA_PLANE))
            else:
                self._handle(self.by_socket[sock], P.decode(frame, expect=P.ROUTER_TO_WORKER))

    def _handle(self, w: InstantWorker, msg: P.Message) -> None:
        if isinstance(msg, P.GenerateTask):
            self._answer(w, msg.request_id, msg.sampling.max_tokens)
        elif isinstance(msg, P.Reserve):
            w.max_tokens[msg.request_id] = msg.sampling.max_tokens
            self.reserved[msg.request_id] = w
            blocks = -(-(len(msg.token_ids) + 1) // LAYOUT.block_size)
            w.send(P.Reserved(request_id=msg.request_id, block_ids=list(range(blocks))))
        elif isinstance(msg, P.PrefillTask):
            out = self.outboxes.get(msg.decode_kv_address)
            if out is None:
                out = self.outboxes[msg.decode_kv_address] = self.ctx.socket(zmq.PUSH)
                out.setsockopt(zmq.LINGER, 0)
                out.connect(msg.decode_kv_address)
            out.send(P.encode(P.KVHandoff(request_id=msg.request_id, src_worker_id=w.worker_id, first_token=100,
                                          num_tokens=len(msg.token_ids), transport=msg.transport,
                                          dst_block_ids=msg.dst_block_ids, reply_to=self.kv_address)))
        elif isinstance(msg, P.OpenLink):  # nothing to set up, as over a transport without links
            w.send(P.LinkOpened(decode_worker_id=msg.decode_worker_id))
        elif isinstance(msg, P.AbortRequest):
            owner = self.reserved.pop(msg.request_id, None)
            if owner is not None:
                owner.max_tokens.pop(msg.request_id, None)
        elif isinstance(msg, P.Ping):
            w.send(P.Pong(nonce=msg.nonce))

    def _landed(self, msg: P.Message) -> None:
        if not isinstance(msg, P.KVHandoff):
            return
        w = self.reserved.pop(msg.request_id, None)
        if w is not None:
            self._answer(w, msg.request_id, w.max_tokens.pop(msg.request_id))

    def _answer(self, w: InstantWorker, request_id: str, max_tokens: int) -> None:
        tokens = self.answer[:max_tokens]
        pieces = [[t] for t in tokens] if self.stream else [tokens]
        w.send(P.TokenBatch(updates=[P.TokenUpdate(request_id=request_id, token_ids=ids,
                                                   finish_reason="length" if i == len(pieces) - 1 else None)
                                     for i, ids in enumerate(pieces)]))


def run_fleet(router_address: str, workers: list[tuple[str, str]], tokens: int, stop,
              router_core: int | None = None, stream: bool = False) -> None:
    """A process's entry point: `workers` ((worker id, role) each) until `stop` is set, off the router's core."""
    cores = other_cores(router_core)
    if cores:
        os.sched_setaffinity(0, cores)
    Fleet(router_address, workers, tokens, stream=stream).run(stop)
