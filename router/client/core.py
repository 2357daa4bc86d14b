"""The client without I/O: everything `Client` and `AsyncClient` share.

It builds and checks requests, routes each frame from the router to the call it answers, keeps every call's state,
and runs each operation (generate with retries, the next delta of a stream, ping, stats, scale, wait until ready)
as a *flow*: a generator that yields what it needs to wait for (`Wait` for a reply, `Sleep`) and gets the answer
back. The blocking client runs flows with blocking waits, the asyncio client with awaits; neither holds any other
logic. Frames go out through the `send` callable each wrapper gives the core (both sends return at once).
"""
from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.protocol import (
    ROUTER_TO_CLIENT, Abort, Delta, Error, Message, Ping, Pong, ProtocolError, Result, ScaleReply, ScaleRequest,
    Stats, StatsRequest, decode, encode,
)
from common.sampling_params import InvalidRequest
from router.client.flow import Box, Flow, Sleep, Wait, deadline_after
from router.client.results import ClientError, ClientTimeout, Completion, ServerError, readiness_problem
from router.client.submit import Prompt, build_submit

log = logging.getLogger(__name__)

RETRYABLE = ("overloaded", "unavailable", "aborted")  # error codes a resubmit may cure
RETRY_BACKOFF_S = (0.1, 2.0)  # first wait and cap when the router gives no retry_after
READY_POLL_S = 0.2  # between stats polls in wait_ready
READY_STATS_TIMEOUT_S = 1.0  # one stats request in wait_ready; a later one is sent if it expires
CONNECT_TIMEOUT_S = 10.0  # how long a client waits for the first word from a router before saying none is there


# ---- requests ---------------------------------------------------------------------------------------------

def retry_wait(exc: ServerError, attempt: int, retries: int, deadline: float | None) -> float | None:
    """Seconds to wait before resubmitting after `exc`, or None to give up."""
    if attempt >= retries or exc.code not in RETRYABLE:
        return None
    first, cap = RETRY_BACKOFF_S
    wait = exc.retry_after if exc.retry_after is not None else min(cap, first * 2**attempt)
    if deadline is not None and time.monotonic() + wait >= deadline:
        return None
    return wait


def as_reply(item: Message | ClientError) -> Message:
    """The message, or raise what it stands for."""
    if isinstance(item, ClientError):
        raise item
    if isinstance(item, Error):
        raise ServerError.from_error(item)
    return item


@dataclass(eq=False)
class Call:
    """One request in flight: its replies, its deadline (a retry keeps the first one), and abort-on-exit."""

    core: ClientCore
    request_id: str
    timeout: float | None
    deadline: float | None
    box: Box = field(default_factory=Box)
    done: bool = False

    def forget(self) -> None:
        self.done = True
        self.core.calls.pop(self.request_id, None)

    def close(self) -> None:
        """Abort the request if it has not finished; idempotent."""
        if self.done:
            return
        self.forget()
        if self.core.broken is None:
            self.core.send(Abort(request_id=self.request_id))


@dataclass(eq=False)
class StreamState:
    """A streaming request: its call, and its Completion once the result came."""

    call: Call
    result: Completion | None = None


class StreamBase:
    """What both clients' streams are: a streaming request's state, its id, its result once it came, and abort
    on close. Their iteration (blocking or async) is the only difference."""

    def __init__(self, client: Any, state: StreamState) -> None:
        self._client, self._state = client, state

    @property
    def request_id(self) -> str:
        return self._state.call.request_id

    @property
    def result(self) -> Completion | None:
        return self._state.result

    def close(self) -> None:
        self._state.call.close()


# ---- the core -------------------------------------------------------------------------------------------

class ClientCore:
    """Calls in flight and the routing of replies to them. Requests are matched by request_id (replies for ids not
    in flight, stale ones of aborted or timed-out requests, are dropped); pongs and scale replies by nonce; stats
    and errors without a request_id go to the oldest control call, as the router answers those in order."""

    def __init__(self, address: str, send: Callable[[bytes], None], timeout: float | None, retries: int,
                 connect_timeout: float | None = CONNECT_TIMEOUT_S) -> None:
        self.address, self.timeout, self.retries, self.connect_timeout = address, timeout, retries, connect_timeout
        self._send = send
        # ZMQ connects without a word from the other side: until the router first answers, every wait also ends at
        # `_connect_deadline`, so a wrong address (or a missing secret) fails in seconds, not never.
        self.heard = False
        self._connect_deadline: float | None = None
        self.calls: dict[str, Call] = {}
        self.waiters: dict[int, tuple[type[Message], Box]] = {}  # control calls: token (a nonce) -> (kind, box)
        self.tokens = itertools.count(random.getrandbits(31))
        self.broken: ClientError | None = None  # set once the client is closed or its socket failed

    def send(self, msg: Message) -> None:
        if self.broken is not None:
            raise self.broken
        if not self.heard and self._connect_deadline is None and self.connect_timeout is not None:
            self._connect_deadline = deadline_after(self.connect_timeout)
            self._send(encode(Ping(nonce=next(self.tokens))))  # a router answers at once, whatever comes next
        self._send(encode(msg))

    def wait(self, box: Box, deadline: float | None, reach: bool = True) -> Wait:
        """Wait for `box` until `deadline`; with `reach`, also no longer than the connect deadline while no router
        has answered yet (then `unreachable` says so)."""
        if reach and not self.heard and self._connect_deadline is not None:
            deadline = self._connect_deadline if deadline is None else min(deadline, self._connect_deadline)
        return Wait(box, deadline)

    def next_item(self, box: Box, deadline: float | None, reach: bool = True) -> Flow[Any]:
        """The next item in `box`, or None once `deadline` passes. With `reach`, raises ClientTimeout when no router
        has answered within the connect timeout; one that answered meanwhile leaves the call its own deadline."""
        while True:
            item = yield self.wait(box, deadline, reach)
            if item is not None:
                return item
            if reach and (error := self.unreachable()) is not None:
                raise error
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def unreachable(self) -> ClientTimeout | None:
        """The error for a wait that ended because no router has answered within the connect timeout."""
        if self.heard or self._connect_deadline is None or time.monotonic() < self._connect_deadline:
            return None
        return ClientTimeout(f"no router answered at {self.address} within {self.connect_timeout:g} s: is "
                             "`pdcluster serve` running there (and, if the cluster has a secret, do you hold it)?")

    def close_with(self, error: ClientError) -> None:
        """Nothing more can be sent or received: every call in flight ends with `error`."""
        self.broken = error
        self.fail_all(error)

    def fail_all(self, error: ClientError) -> None:
        for call in list(self.calls.values()):
            call.box.put(error)
        boxes = [box for _, box in self.waiters.values()]
        self.waiters.clear()
        for box in boxes:
            box.put(error)

    # ---- frames in --------------------------------------------------------------------------------------
    def receive(self, frame: bytes) -> None:
        self.heard = True
        try:
            msg = decode(frame, expect=ROUTER_TO_CLIENT)
        except ProtocolError as exc:
            self._undecodable(exc)
            return
        request_id = getattr(msg, "request_id", "")
        if request_id:
            call = self.calls.get(request_id)
            if call is None:
                log.debug("dropping %s for request %s, not in flight", msg.TYPE, request_id)
            else:
                call.box.put(msg)
        elif isinstance(msg, (Pong, ScaleReply)):
            kind, box = self.waiters.get(msg.nonce, (None, None)) if msg.nonce is not None else (None, None)
            if kind is type(msg):
                del self.waiters[msg.nonce]
                box.put(msg)
        elif isinstance(msg, (Stats, Error)):
            self._to_oldest_control(msg)
        # a Ping from the router: clients may ignore it

    def _to_oldest_control(self, msg: Message) -> None:
        for token, (kind, box) in self.waiters.items():
            if isinstance(msg, Error) or kind is type(msg):
                del self.waiters[token]
                box.put(msg)
                return
        if isinstance(msg, Error):
            log.warning("router error about no request: %s: %s", msg.code, msg.message)

    def _undecodable(self, exc: ProtocolError) -> None:
        error = ClientError(f"undecodable frame from the router: {exc}")
        if exc.request_id in self.calls:
            self.calls[exc.request_id].box.put(error)
        elif exc.request_id:
            log.warning("dropping an undecodable frame for request %s, not in flight: %s", exc.request_id, exc)
        else:  # whoever it was for would wait forever: tell everyone
            self.fail_all(error)

    # ---- requests ---------------------------------------------------------------------------------------
    def submit(self, prompt: Prompt, chat: bool, stream: bool, request_id: str | None, timeout: float | None,
               sampling: dict[str, Any], deadline: float | None = None) -> Call:
        """Validate, register and send a request; its replies then gather in the call's box."""
        submit = build_submit(prompt, chat=chat, stream=stream, request_id=request_id, sampling=sampling)
        if submit.request_id in self.calls:
            raise InvalidRequest("request_id", f"{submit.request_id!r} is already in flight")
        timeout = self.timeout if timeout is None else timeout
        call = Call(self, submit.request_id, timeout, deadline_after(timeout) if deadline is None else deadline)
        self.calls[call.request_id] = call
        try:
            self.send(submit)
        except BaseException:
            call.forget()
            raise
        return call

    def next_message(self, call: Call) -> Flow[Delta | Result]:
        """The next Delta or the Result. Any exception (a timeout, an interrupt) ends the call."""
        try:
            item = yield from self.next_item(call.box, call.deadline)
            if item is None:
                raise ClientTimeout(f"request {call.request_id} timed out after {call.timeout:g} s")
            if isinstance(item, (Result, Error)):
                call.forget()
            msg = as_reply(item)
        except BaseException:
            call.close()
            raise
        return msg

    def generate(self, prompt: Prompt, chat: bool, timeout: float | None, request_id: str | None,
                 retries: int | None, sampling: dict[str, Any]) -> Flow[Completion]:
        """Run one request to the end; refused with overloaded, unavailable or aborted, it is resubmitted (same
        request_id) up to `retries` times, after the router's retry_after, within `timeout`."""
        timeout = self.timeout if timeout is None else timeout
        deadline = deadline_after(timeout)
        retries = self.retries if retries is None else retries
        for attempt in itertools.count():
            call = self.submit(prompt, chat, False, request_id, timeout, sampling, deadline)
            request_id = call.request_id
            try:
                while True:
                    msg = yield from self.next_message(call)
                    if isinstance(msg, Result):
                        return Completion.from_result(msg)
            except ServerError as exc:
                wait = retry_wait(exc, attempt, retries, deadline)
                if wait is None:
                    raise
            finally:
                call.close()
            yield Sleep(wait)
        raise AssertionError("unreachable")

    def queued_delta(self, stream: StreamState) -> Delta | None:
        """The stream's next Delta if the reader has routed it already, without a flow: what `next_delta` would return
        at once. A busy stream's deltas mostly come this way; anything else (none yet, the Result, an error) is the
        flow's."""
        items = stream.call.box.items
        return items.popleft() if items and type(items[0]) is Delta else None

    def next_delta(self, stream: StreamState) -> Flow[Delta | None]:
        """A stream's next Delta, or None once its result came (then in `stream.result`)."""
        if stream.call.done:
            return None
        msg = yield from self.next_message(stream.call)
        if isinstance(msg, Result):
            stream.result = Completion.from_result(msg)
            return None
        return msg

    # ---- control ----------------------------------------------------------------------------------------
    def control(self, kind: type[Message], timeout: float | None, make: Callable[[int], Message],
                reach: bool = True) -> Flow[Message]:
        timeout = self.timeout if timeout is None else timeout
        token = next(self.tokens)
        box = Box()
        self.waiters[token] = (kind, box)
        try:
            self.send(make(token))
            item = yield from self.next_item(box, deadline_after(timeout), reach)
            if item is None:
                raise ClientTimeout(f"no {kind.TYPE} from {self.address} within {timeout:g} s")
        finally:
            self.waiters.pop(token, None)
        return as_reply(item)

    def ping(self, timeout: float | None) -> Flow[float]:
        start = time.perf_counter()
        yield from self.control(Pong, timeout, lambda token: Ping(nonce=token))
        return time.perf_counter() - start

    def stats(self, timeout: float | None) -> Flow[Stats]:
        return (yield from self.control(Stats, timeout, lambda token: StatsRequest()))

    def scale(self, role: str, delta: int, timeout: float | None) -> Flow[ScaleReply]:
        return (yield from self.control(ScaleReply, timeout,
                                        lambda token: ScaleRequest(role=role, delta=delta, nonce=token)))

    def wait_ready(self, timeout: float) -> Flow[None]:
        """Return once the router answers and has a live prefill and decode worker; else ClientTimeout."""
        deadline = time.monotonic() + timeout
        problem = "the router did not answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientTimeout(f"cluster at {self.address} not ready after {timeout:g} s: {problem}")
            try:
                stats = yield from self.control(Stats, min(left, READY_STATS_TIMEOUT_S), lambda token: StatsRequest(),
                                                reach=False)  # a router that is still starting may come
                problem = readiness_problem(stats) or ""
                if not problem:
                    return
            except ClientTimeout:
                continue
            except ClientError as exc:
                if exc is self.broken:
                    raise
                problem = f"the router answered {exc}"
            yield Sleep(min(READY_POLL_S, max(0.0, deadline - time.monotonic())))
