"""The asyncio client: the core's flows, run with awaits; one reader task routes every reply."""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

import zmq.asyncio

from common.protocol import DEFAULT_ROUTER_ADDRESS, Abort, Delta, ScaleReply, Stats
from router.client.core import CONNECT_TIMEOUT_S, ClientCore, Prompt, StreamBase, StreamState
from router.client.flow import Flow, Run, T, Wait, remaining
from router.client.results import ClientError, Completion
from router.client.socket import dealer

log = logging.getLogger(__name__)

READ_BATCH = 64  # frames the reader routes before the event loop's next turn


class AsyncClient:
    """An asyncio client: any number of concurrent requests on one DEALER socket.

    One reader task (started on first use) routes replies by request_id. Use it from one event loop.
    `timeout`, `auth_token` and `retries` as for `Client`.
    """

    def __init__(self, address: str = DEFAULT_ROUTER_ADDRESS, timeout: float | None = None,
                 auth_token: str | None = None, retries: int = 0,
                 connect_timeout: float | None = CONNECT_TIMEOUT_S) -> None:
        self.address = address
        self._sock = dealer(zmq.asyncio.Context.instance(), address, auth_token)
        # The same socket without futures, for frames already queued: a future per read (and one holding zmq.Again
        # in a reference cycle per batch) cost more than the read.
        self._queued = zmq.Socket.shadow(self._sock.underlying)
        self._core = ClientCore(address, self._send, timeout, retries, connect_timeout)
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._sock.closed:
            return
        self._core.close_with(ClientError("the client is closed"))
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._sock.close()

    async def generate(self, prompt: Prompt, *, chat: bool = False, timeout: float | None = None,
                       request_id: str | None = None, retries: int | None = None, **sampling: Any) -> Completion:
        """As `Client.generate`."""
        return await self._run(self._core.generate(prompt, chat, timeout, request_id, retries, sampling))

    def stream(self, prompt: Prompt, *, chat: bool = False, timeout: float | None = None,
               request_id: str | None = None, **sampling: Any) -> AsyncStream:
        """Submit a streaming request now (call it inside the event loop); `async for` over the result."""
        return AsyncStream(self, StreamState(self._core.submit(prompt, chat, True, request_id, timeout, sampling)))

    async def abort(self, request_id: str) -> None:
        self._core.send(Abort(request_id=request_id))

    async def ping(self, timeout: float | None = None) -> float:
        return await self._run(self._core.ping(timeout))

    async def stats(self, timeout: float | None = None) -> Stats:
        return await self._run(self._core.stats(timeout))

    async def scale(self, role: str, delta: int, timeout: float | None = None) -> ScaleReply:
        return await self._run(self._core.scale(role, delta, timeout))

    async def wait_ready(self, timeout: float) -> None:
        await self._run(self._core.wait_ready(timeout))

    # ---- the driver ---------------------------------------------------------------------------------
    async def _run(self, flow: Flow[T]) -> T:
        run = Run(flow)
        while run.effect is not None:
            with run.waiting():
                run.answer(await (self._wait(run.effect) if isinstance(run.effect, Wait)
                                  else asyncio.sleep(run.effect.seconds)))
        return run.value

    async def _wait(self, effect: Wait):
        """The box's next reply, once the reader has routed one; None when the deadline passes first. One future, woken
        by the reply or the deadline's timer: an Event under `wait_for` cost more, on every streamed token."""
        box = effect.box
        if not box.items:
            loop = asyncio.get_running_loop()
            woken = loop.create_future()
            box.notify = functools.partial(_wake, woken)
            timer = None if effect.deadline is None else loop.call_later(remaining(effect.deadline), _wake, woken)
            try:
                await woken
            finally:
                box.notify = None
                if timer is not None:
                    timer.cancel()
            if not box.items:
                return None
        return box.items.popleft()

    def _send(self, frame: bytes) -> None:
        """Send without waiting: the frame goes out now, or is queued on the socket in order."""
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read())
        self._sock.send(frame).add_done_callback(_report_send_failure)

    async def _read(self) -> None:
        try:
            while True:
                self._core.receive(await self._sock.recv())
                # The frames queued behind it are routed in one go (a non-blocking read each), then the callers take
                # theirs: a turn of the event loop per frame cost more than routing it.
                for _ in range(READ_BATCH - 1):
                    try:
                        frame = self._queued.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break  # nothing more queued now
                    self._core.receive(frame)
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._core.close_with(ClientError(f"reading from {self.address} failed: {exc!r}"))


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _report_send_failure(sent: asyncio.Future[Any]) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.error("sending to the router failed: %r", sent.exception())


class AsyncStream(StreamBase):
    """A streaming request of an AsyncClient; the async twin of `Stream`."""

    async def _deltas(self) -> AsyncIterator[Delta]:
        try:
            while (delta := await self._next()) is not None:
                yield delta
        finally:
            self.close()

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._deltas()

    async def __anext__(self) -> Delta:
        delta = await self._next()
        if delta is None:
            raise StopAsyncIteration
        return delta

    async def _next(self) -> Delta | None:
        core = self._client._core
        return core.queued_delta(self._state) or await self._client._run(core.next_delta(self._state))

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
