"""The HTTP front end as one of the router's clients, in its process: it hands the router the same typed records a
ZMQ client sends (`submit`, `abort`) and gets the same replies (`delta`, `result`, `error`), through a queue per
request instead of a socket. Admission, placement, detokenization and stop strings are therefore the router's own
code, whatever the client speaks.
"""
from __future__ import annotations

import asyncio
import itertools
import os
from collections import deque
from typing import Protocol

from common import protocol as P

IDENTITY = b"\xffhttp"  # router.router.LOCAL_PREFIX + a name
TERMINAL = (P.Result, P.Error)


class RouterPort(Protocol):
    """What the front end needs of the router (router.router.Router)."""

    def attach_local(self, identity: bytes, sink) -> None: ...

    async def on_client(self, identity: bytes, msg: P.Message) -> None: ...


class Call:
    """One request in flight: its replies in order, until the terminal one."""

    def __init__(self, bridge: Bridge, request_id: str):
        self.bridge, self.request_id = bridge, request_id
        self._replies: deque[P.Message] = deque()
        self._arrived = asyncio.Event()
        self.done = False  # its result or error came
        self.closed = False

    def refused(self) -> P.Error | None:
        """The router's answer if it refused the submit outright (admission answers before `start` returns)."""
        first = self._replies[0] if self._replies else None
        return first if isinstance(first, P.Error) else None

    def put(self, msg: P.Message) -> None:
        self._replies.append(msg)
        self._arrived.set()

    async def next(self) -> P.Message:
        while not self._replies:
            self._arrived.clear()
            await self._arrived.wait()
        msg = self._replies.popleft()
        if isinstance(msg, TERMINAL):
            self.done = True
        return msg

    async def close(self) -> None:
        """The HTTP side is done with it (answered, or its client went away): a request still running is aborted, so
        every worker frees what it holds for it."""
        if self.closed:
            return
        self.closed = True
        if not self.done:
            await self.bridge.tell(P.Abort(request_id=self.request_id))
        self.bridge.calls.pop(self.request_id, None)


class Bridge:
    def __init__(self, router: RouterPort):
        self.router = router
        self.calls: dict[str, Call] = {}
        self._ids = itertools.count()
        self._prefix = os.urandom(6).hex()
        router.attach_local(IDENTITY, self._deliver)

    def new_id(self) -> str:
        return f"{self._prefix}{next(self._ids):x}"

    def _deliver(self, msg: P.Message) -> None:
        call = self.calls.get(getattr(msg, "request_id", ""))
        if call is not None:
            call.put(msg)

    async def tell(self, msg: P.Message) -> None:
        """The router handles `msg` to the end even if the HTTP request's task is cancelled meanwhile (its bookkeeping
        must never stop half way)."""
        await asyncio.shield(self.router.on_client(IDENTITY, msg))

    async def start(self, submit: P.Submit) -> Call:
        call = Call(self, submit.request_id)
        self.calls[submit.request_id] = call
        try:
            await self.tell(submit)
        except BaseException:
            self.calls.pop(submit.request_id, None)
            raise
        return call
