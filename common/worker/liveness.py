"""A worker's liveness, apart from its step loop: a worker inside one long step (a long prompt on CPU, a huge one
on a big model) is busy, not dead, and must not be declared dead for it.

The loop sends its heartbeats (with its load) between steps, as before, and tells `Liveness` when it starts and
ends a step. While a step runs past the heartbeat interval, the liveness thread sends `alive` records on a
connection of its own (ZMQ sockets belong to one thread), so the router keeps hearing from a process that lives.
A process that dies, or hangs outside a step, goes quiet on both connections.
"""
from __future__ import annotations

import threading
import time

import zmq

from common import auth
from common import protocol as P


class Liveness:
    def __init__(self, ctx: zmq.Context, worker_id: str, router_address: str, interval: float,
                 keys: auth.CurveKeys | None = None):
        self.worker_id, self.interval = worker_id, interval
        self._ctx, self._address, self._keys = ctx, router_address, keys
        self._step_started: float | None = None  # set and cleared by the loop's thread; read by this one
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{worker_id}-liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def step_started(self) -> None:
        self._step_started = time.monotonic()

    def step_ended(self) -> None:
        self._step_started = None

    def _run(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, P.liveness_identity(self.worker_id))
        sock.setsockopt(zmq.LINGER, 0)
        if self._keys:
            auth.secure_client(sock, self._keys)
        sock.connect(self._address)
        try:
            while not self._stopped.wait(self.interval):
                started = self._step_started
                busy = time.monotonic() - started if started is not None else 0.0
                if busy >= self.interval:  # between steps the loop's own heartbeats say it all
                    sock.send(P.encode(P.Alive(worker_id=self.worker_id, busy_seconds=busy)))
                while sock.poll(0):  # the router may answer (e.g. before our hello): nothing to act on
                    sock.recv(zmq.NOBLOCK)
        finally:
            sock.close()
