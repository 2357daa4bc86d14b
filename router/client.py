"""Python client for a pdcluster router: `Client` (blocking) and `AsyncClient` (asyncio).

Both clients speak the wire protocol of docs/protocol.md over one ZMQ DEALER socket and validate
every frame with `common.protocol`. docs/client.md is the user guide.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Union

import zmq
import zmq.asyncio

from common import auth
from common.protocol import (
    DEFAULT_ROUTER_ADDRESS,
    ROUTER_TO_CLIENT,
    Abort,
    Delta,
    Error,
    Message,
    Ping,
    Pong,
    ProtocolError,
    Result,
    ScaleReply,
    ScaleRequest,
    Stats,
    StatsRequest,
    Submit,
    Timings,
    Usage,
    checked,
    decode,
    encode,
)
from common.sampling_params import InvalidRequest, SamplingParams

log = logging.getLogger(__name__)

Prompt = Union[str, list[int]]
SAMPLING_FIELDS = SamplingParams.field_names()
SCALE_TIMEOUT_S = 900.0  # `pdcluster scale`: workers load their model, or drain their requests
READY_POLL_S = 0.2  # between stats polls in wait_ready
READY_STATS_TIMEOUT_S = 1.0  # one stats request in wait_ready; a later one is sent if it expires


# --- errors --------------------------------------------------------------------------------------


class ClientError(Exception):
    """Base of the client's errors: a server error, a broken frame from the server, a closed client."""


class ServerError(ClientError):
    """The router answered a request with an `error` record."""

    def __init__(self, code: str, message: str, retry_after: float | None = None, request_id: str = "") -> None:
        super().__init__(code, message, retry_after, request_id)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.request_id = request_id

    def __str__(self) -> str:
        retry = f" (retry after {self.retry_after:g} s)" if self.retry_after is not None else ""
        return f"{self.code}: {self.message}{retry}"

    @classmethod
    def from_error(cls, err: Error) -> ServerError:
        return cls(err.code, err.message, err.retry_after, err.request_id)


class ClientTimeout(ClientError, TimeoutError):
    """No answer in time. For a request, an `abort` has been sent for it."""


# --- results -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """A finished request. `finish_reason` is "stop", "length" or "abort" (see Client.abort)."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    timings: Timings

    @classmethod
    def from_result(cls, r: Result) -> Completion:
        return cls(r.request_id, r.text, r.token_ids, r.finish_reason, r.usage, r.timings)


def readiness_problem(stats: Stats) -> str | None:
    """Why the cluster in `stats` cannot serve a request yet, or None if it can."""
    alive = [w for w in stats.workers if w.alive]
    prefill = sum(w.role in ("prefill", "colocated") for w in alive)
    decode_ = sum(w.role in ("decode", "colocated") for w in alive)
    if prefill and decode_:
        return None
    missing = " and ".join(name for name, n in (("prefill", prefill), ("decode", decode_)) if not n)
    return f"no alive {missing} worker ({len(alive)} of {len(stats.workers)} known workers alive)"


# --- request building ----------------------------------------------------------------------------


def _sampling(sampling: dict[str, Any]) -> SamplingParams:
    unknown = sorted(set(sampling) - set(SAMPLING_FIELDS))
    if unknown:
        raise TypeError(f"unknown sampling argument {unknown[0]!r}; expected some of {', '.join(SAMPLING_FIELDS)}")
    return SamplingParams(**sampling)  # raises InvalidRequest naming the field


def build_submit(prompt: Prompt, *, chat: bool, stream: bool, request_id: str | None,
                 sampling: dict[str, Any]) -> Submit:
    """A validated Submit; a bad argument raises InvalidRequest (a ValueError) naming it."""
    params = _sampling(sampling)
    if isinstance(prompt, str):
        text, ids = prompt, None
    elif isinstance(prompt, (list, tuple)):
        text, ids = None, list(prompt)
    else:
        raise InvalidRequest("prompt", f"expected a string or a list of token ids, got {type(prompt).__name__}")
    try:
        return checked(Submit(request_id=request_id if request_id is not None else uuid.uuid4().hex, prompt=text,
                              token_ids=ids, chat=chat, sampling=params, stream=stream))
    except ProtocolError as exc:
        field, _, problem = exc.message.partition(": ")
        raise InvalidRequest(field, problem) from None


RETRYABLE = ("overloaded", "unavailable", "aborted")  # error codes a resubmit may cure
RETRY_BACKOFF_S = (0.1, 2.0)  # first wait and cap when the router gives no retry_after


def _retry_wait(exc: ServerError, attempt: int, retries: int, deadline: float | None) -> float | None:
    """Seconds to wait before resubmitting after `exc`, or None to give up."""
    if attempt >= retries or exc.code not in RETRYABLE:
        return None
    first, cap = RETRY_BACKOFF_S
    wait = exc.retry_after if exc.retry_after is not None else min(cap, first * 2**attempt)
    if deadline is not None and time.monotonic() + wait >= deadline:
        return None
    return wait


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


# --- demultiplexing (no I/O) ---------------------------------------------------------------------

Deliver = Callable[[Union[Message, ClientError]], None]


@dataclass
class _Waiter:
    kind: type[Message]  # Pong or Stats
    deliver: Deliver


class _Demux:
    """Routes decoded frames to the request or control call they answer.

    Requests are matched by request_id; replies for ids not registered (stale replies of aborted or
    timed-out requests) are dropped. Pongs are matched by nonce (= the waiter's token). Stats and
    errors without a request_id have no id: they go to the oldest waiting control call, as the
    router answers those in order.
    """

    def __init__(self) -> None:
        self.requests: dict[str, Deliver] = {}
        self.control: dict[int, _Waiter] = {}

    def dispatch(self, frame: bytes) -> None:
        try:
            msg = decode(frame, expect=ROUTER_TO_CLIENT)
        except ProtocolError as exc:
            self._undecodable(exc)
            return
        request_id = getattr(msg, "request_id", "")
        if request_id:
            deliver = self.requests.get(request_id)
            if deliver is None:
                log.debug("dropping %s for request %s, not in flight", msg.TYPE, request_id)
            else:
                deliver(msg)
        elif isinstance(msg, (Pong, ScaleReply)):
            waiter = self.control.get(msg.nonce) if msg.nonce is not None else None
            if waiter is not None and waiter.kind is type(msg):
                del self.control[msg.nonce]
                waiter.deliver(msg)
        elif isinstance(msg, (Stats, Error)):
            self._to_oldest_control(msg)
        # a Ping from the router: clients may ignore it

    def _to_oldest_control(self, msg: Message) -> None:
        for token, waiter in self.control.items():
            if isinstance(msg, Error) or waiter.kind is type(msg):
                del self.control[token]
                waiter.deliver(msg)
                return
        if isinstance(msg, Error):
            log.warning("router error about no request: %s: %s", msg.code, msg.message)

    def _undecodable(self, exc: ProtocolError) -> None:
        error = ClientError(f"undecodable frame from the router: {exc}")
        if exc.request_id in self.requests:
            self.requests[exc.request_id](error)
        elif exc.request_id:
            log.warning("dropping an undecodable frame for request %s, not in flight: %s", exc.request_id, exc)
        else:  # whoever it was for would wait forever: tell everyone
            self.fail_all(error)

    def fail_all(self, error: ClientError) -> None:
        for deliver in list(self.requests.values()):
            deliver(error)
        waiters = list(self.control.values())
        self.control.clear()
        for waiter in waiters:
            waiter.deliver(error)


def _as_reply(item: Message | ClientError) -> Message:
    """The message, or raise what it stands for."""
    if isinstance(item, ClientError):
        raise item
    if isinstance(item, Error):
        raise ServerError.from_error(item)
    return item


def _dealer(context: zmq.Context, address: str, auth_token: str | None) -> zmq.Socket:
    """A DEALER connected to `address`; with a token (given, or from the environment) over CURVE."""
    token = auth_token if auth_token is not None else auth.load_token()
    keys = auth.keys_from_token(token) if token else None  # a weak token raises AuthError (a ValueError)
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys:
        auth.secure_client(sock, keys)
    try:
        sock.connect(address)
    except zmq.ZMQError as exc:
        sock.close()
        raise ValueError(f"cannot connect to {address!r}: {exc}") from None
    return sock


# --- blocking client -----------------------------------------------------------------------------


class Client:
    """A blocking client on one DEALER socket. Not thread-safe: use one per thread.

    `timeout` (seconds, None = wait forever) is the default for every call; each call may override it.
    `auth_token` is the cluster's shared secret, if it has one (default: $PDCLUSTER_AUTH_TOKEN_FILE or
    $PDCLUSTER_AUTH_TOKEN); without the right one the router never answers. `retries` is the default
    for `generate`.
    """

    def __init__(self, address: str = DEFAULT_ROUTER_ADDRESS, timeout: float | None = None,
                 auth_token: str | None = None, retries: int = 0) -> None:
        self.address = address
        self.timeout = timeout
        self.retries = retries
        self._sock = _dealer(zmq.Context.instance(), address, auth_token)
        self._demux = _Demux()
        self._tokens = itertools.count(random.getrandbits(31))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._sock.closed:
            self._demux.fail_all(ClientError("the client is closed"))
            self._sock.close()

    # requests

    def generate(self, prompt: Prompt, *, chat: bool = False, timeout: float | None = None,
                 request_id: str | None = None, retries: int | None = None, **sampling: Any) -> Completion:
        """Run one request to the end. Raises ServerError, ClientTimeout (after aborting it), ClientError.

        Refused with overloaded, unavailable or aborted, it is resubmitted (same request_id) up to `retries`
        times (default: the client's), after the router's retry_after, within `timeout`.
        """
        timeout = self.timeout if timeout is None else timeout
        deadline = _deadline(timeout)
        retries = self.retries if retries is None else retries
        for attempt in itertools.count():
            call = self._start(prompt, chat, False, request_id, timeout, sampling, deadline)
            request_id = call.request_id
            try:
                while True:
                    msg = call.next()
                    if isinstance(msg, Result):
                        return Completion.from_result(msg)
            except ServerError as exc:
                wait = _retry_wait(exc, attempt, retries, deadline)
                if wait is None:
                    raise
            finally:
                call.close()
            time.sleep(wait)
        raise AssertionError("unreachable")

    def stream(self, prompt: Prompt, *, chat: bool = False, timeout: float | None = None,
               request_id: str | None = None, **sampling: Any) -> Stream:
        """Submit a streaming request now; iterate the returned Stream for its deltas."""
        return Stream(self._start(prompt, chat, True, request_id, timeout, sampling))

    def abort(self, request_id: str) -> None:
        """Ask the router to stop a request; a running one then ends with finish_reason "abort"."""
        self._send(Abort(request_id=request_id))

    # control

    def ping(self, timeout: float | None = None) -> float:
        """Round-trip time to the router, in seconds."""
        start = time.perf_counter()
        self._control(Pong, timeout, lambda token: Ping(nonce=token))
        return time.perf_counter() - start

    def stats(self, timeout: float | None = None) -> Stats:
        stats = self._control(Stats, timeout, lambda token: StatsRequest())
        assert isinstance(stats, Stats)
        return stats

    def scale(self, role: str, delta: int, timeout: float | None = None) -> ScaleReply:
        """Adds (`delta` > 0) or drains and removes (< 0) workers of `role`; returns when done. Loading
        a model takes a while: give it a long `timeout`."""
        reply = self._control(ScaleReply, timeout, lambda token: ScaleRequest(role=role, delta=delta, nonce=token))
        assert isinstance(reply, ScaleReply)
        return reply

    def wait_ready(self, timeout: float) -> None:
        """Return once the router answers and has a live prefill and decode worker; else TimeoutError."""
        deadline = time.monotonic() + timeout
        problem = "the router did not answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientTimeout(_not_ready_text(self.address, timeout, problem))
            try:
                problem = readiness_problem(self.stats(timeout=min(left, READY_STATS_TIMEOUT_S))) or ""
                if not problem:
                    return
            except ClientTimeout:
                continue
            except ClientError as exc:
                problem = f"the router answered {exc}"
            time.sleep(min(READY_POLL_S, max(0.0, deadline - time.monotonic())))

    # internals

    def _send(self, msg: Message) -> None:
        if self._sock.closed:
            raise ClientError("the client is closed")
        self._sock.send(encode(msg))

    def _pump(self, deadline: float | None) -> bool:
        """Receive and route one frame; False if the deadline passed first."""
        left = _remaining(deadline)
        if not self._sock.poll(None if left is None else int(left * 1000) + 1):
            return False
        self._demux.dispatch(self._sock.recv())
        return True

    def _start(self, prompt: Prompt, chat: bool, stream: bool, request_id: str | None,
               timeout: float | None, sampling: dict[str, Any], deadline: float | None = None) -> _Call:
        submit = build_submit(prompt, chat=chat, stream=stream, request_id=request_id, sampling=sampling)
        if submit.request_id in self._demux.requests:
            raise InvalidRequest("request_id", f"{submit.request_id!r} is already in flight")
        timeout = self.timeout if timeout is None else timeout
        call = _Call(self, submit.request_id, timeout, deadline)
        try:
            self._send(submit)
        except BaseException:
            call._forget()
            raise
        return call

    def _control(self, kind: type[Message], timeout: float | None, make: Callable[[int], Message]) -> Message:
        timeout = self.timeout if timeout is None else timeout
        deadline = _deadline(timeout)
        token = next(self._tokens)
        box: list[Message | ClientError] = []
        self._demux.control[token] = _Waiter(kind, box.append)
        try:
            self._send(make(token))
            while not box:
                if not self._pump(deadline):
                    raise ClientTimeout(f"no {kind.TYPE} from {self.address} within {timeout:g} s")
        finally:
            self._demux.control.pop(token, None)
        return _as_reply(box[0])


def _not_ready_text(address: str, timeout: float, problem: str) -> str:
    return f"cluster at {address} not ready after {timeout:g} s: {problem}"


class _Call:
    """One request of a blocking Client: its inbox, deadline, and abort-on-exit."""

    def __init__(self, client: Client, request_id: str, timeout: float | None,
                 deadline: float | None = None) -> None:
        self.client = client
        self.request_id = request_id
        self.timeout = timeout
        self.deadline = _deadline(timeout) if deadline is None else deadline  # a retry keeps the first deadline
        self.inbox: deque[Message | ClientError] = deque()
        self.done = False
        client._demux.requests[request_id] = self.inbox.append

    def next(self) -> Delta | Result:
        """The next Delta or the Result. Any exception ends the call (aborting it where needed)."""
        try:
            while not self.inbox:
                if not self.client._pump(self.deadline):
                    raise ClientTimeout(f"request {self.request_id} timed out after {self.timeout:g} s")
            item = self.inbox.popleft()
            if isinstance(item, (Result, Error)):
                self._forget()
            msg = _as_reply(item)
        except BaseException:
            self.close()
            raise
        assert isinstance(msg, (Delta, Result))
        return msg

    def close(self) -> None:
        """Abort the request if it has not finished; idempotent."""
        if self.done:
            return
        self._forget()
        if not self.client._sock.closed:
            self.client.abort(self.request_id)

    def _forget(self) -> None:
        self.done = True
        self.client._demux.requests.pop(self.request_id, None)


class Stream:
    """A streaming request of a blocking Client.

    Iterating yields the `Delta`s (text, token_ids, index) in order; afterwards `result` holds the
    Completion, whose text and token_ids equal the joined deltas. Leaving a `for` loop early, `close()`,
    or a timeout aborts the request (then `result` stays None).
    """

    def __init__(self, call: _Call) -> None:
        self._call = call
        self.result: Completion | None = None

    @property
    def request_id(self) -> str:
        return self._call.request_id

    def __iter__(self) -> Iterator[Delta]:
        try:
            while (chunk := self._next_chunk()) is not None:
                yield chunk
        finally:
            self.close()

    def __next__(self) -> Delta:
        chunk = self._next_chunk()
        if chunk is None:
            raise StopIteration
        return chunk

    def _next_chunk(self) -> Delta | None:
        if self._call.done:
            return None
        msg = self._call.next()
        if isinstance(msg, Result):
            self.result = Completion.from_result(msg)
            return None
        return msg

    def close(self) -> None:
        self._call.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- asyncio client ------------------------------------------------------------------------------


class AsyncClient:
    """An asyncio client: any number of concurrent requests on one DEALER socket.

    One reader task (started on first use) routes replies by request_id. Use it from one event loop.
    `auth_token` and `retries` as for `Client`.
    """

    def __init__(self, address: str = DEFAULT_ROUTER_ADDRESS, timeout: float | None = None,
                 auth_token: str | None = None, retries: int = 0) -> None:
        self.address = address
        self.timeout = timeout
        self.retries = retries
        self._sock = _dealer(zmq.asyncio.Context.instance(), address, auth_token)
        self._demux = _Demux()
        self._tokens = itertools.count(random.getrandbits(31))
        self._reader: asyncio.Task[None] | None = None
        self._broken: ClientError | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._sock.closed:
            return
        self._broken = ClientError("the client is closed")
        self._demux.fail_all(self._broken)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._sock.close()

    # requests

    async def generate(self, prompt: Prompt, *, chat: bool = False, timeout: float | None = None,
                       request_id: str | None = None, retries: int | None = None, **sampling: Any) -> Completion:
        timeout = self.timeout if timeout is None else timeout
        deadline = _deadline(timeout)
        retries = self.retries if retries is None else retries
        for attempt in itertools.count():
            call = self._start(prompt, chat, False, request_id, timeout, sampling, deadline)
            request_id = call.request_id
            try:
                while True:
                    msg = await call.next()
                    if isinstance(msg, Result):
                        return Completion.from_result(msg)
            except ServerError as exc:
                wait = _retry_wait(exc, attempt, retries, deadline)
                if wait is None:
                    raise
            finally:
                call.close()
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    def stream(self, prompt: Prompt, *, chat: bool = False, timeout: float | None = None,
               request_id: str | None = None, **sampling: Any) -> AsyncStream:
        """Submit a streaming request now (call it inside the event loop); `async for` over the result."""
        return AsyncStream(self._start(prompt, chat, True, request_id, timeout, sampling))

    async def abort(self, request_id: str) -> None:
        self._send(Abort(request_id=request_id))

    # control

    async def ping(self, timeout: float | None = None) -> float:
        start = time.perf_counter()
        await self._control(Pong, timeout, lambda token: Ping(nonce=token))
        return time.perf_counter() - start

    async def stats(self, timeout: float | None = None) -> Stats:
        stats = await self._control(Stats, timeout, lambda token: StatsRequest())
        assert isinstance(stats, Stats)
        return stats

    async def scale(self, role: str, delta: int, timeout: float | None = None) -> ScaleReply:
        reply = await self._control(ScaleReply, timeout,
                                    lambda token: ScaleRequest(role=role, delta=delta, nonce=token))
        assert isinstance(reply, ScaleReply)
        return reply

    async def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        problem = "the router did not answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientTimeout(_not_ready_text(self.address, timeout, problem))
            try:
                problem = readiness_problem(await self.stats(timeout=min(left, READY_STATS_TIMEOUT_S))) or ""
                if not problem:
                    return
            except ClientTimeout:
                continue
            except ClientError as exc:
                if exc is self._broken:
                    raise
                problem = f"the router answered {exc}"
            await asyncio.sleep(min(READY_POLL_S, max(0.0, deadline - time.monotonic())))

    # internals

    def _send(self, msg: Message) -> None:
        """Send without waiting: the frame goes out now, or is queued on the socket in order."""
        if self._broken is not None:
            raise self._broken
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read())
        sent = self._sock.send(encode(msg))
        sent.add_done_callback(_report_send_failure)

    async def _read(self) -> None:
        try:
            while True:
                self._demux.dispatch(await self._sock.recv())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._broken = ClientError(f"reading from {self.address} failed: {exc!r}")
            self._demux.fail_all(self._broken)

    def _start(self, prompt: Prompt, chat: bool, stream: bool, request_id: str | None,
               timeout: float | None, sampling: dict[str, Any], deadline: float | None = None) -> _AsyncCall:
        submit = build_submit(prompt, chat=chat, stream=stream, request_id=request_id, sampling=sampling)
        if submit.request_id in self._demux.requests:
            raise InvalidRequest("request_id", f"{submit.request_id!r} is already in flight")
        timeout = self.timeout if timeout is None else timeout
        call = _AsyncCall(self, submit.request_id, timeout, deadline)
        try:
            self._send(submit)
        except BaseException:
            call._forget()
            raise
        return call

    async def _control(self, kind: type[Message], timeout: float | None, make: Callable[[int], Message]) -> Message:
        timeout = self.timeout if timeout is None else timeout
        token = next(self._tokens)
        reply: asyncio.Future[Message | ClientError] = asyncio.get_running_loop().create_future()
        self._demux.control[token] = _Waiter(kind, lambda item: reply.done() or reply.set_result(item))
        try:
            self._send(make(token))
            item = await asyncio.wait_for(reply, timeout)
        except asyncio.TimeoutError:
            raise ClientTimeout(f"no {kind.TYPE} from {self.address} within {timeout:g} s") from None
        finally:
            self._demux.control.pop(token, None)
        return _as_reply(item)


def _report_send_failure(sent: asyncio.Future[Any]) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.error("sending to the router failed: %r", sent.exception())


class _AsyncCall:
    """One request of an AsyncClient: its queue, deadline, and abort-on-exit."""

    def __init__(self, client: AsyncClient, request_id: str, timeout: float | None,
                 deadline: float | None = None) -> None:
        self.client = client
        self.request_id = request_id
        self.timeout = timeout
        self.deadline = _deadline(timeout) if deadline is None else deadline  # a retry keeps the first deadline
        self.inbox: asyncio.Queue[Message | ClientError] = asyncio.Queue()
        self.done = False
        client._demux.requests[request_id] = self.inbox.put_nowait

    async def next(self) -> Delta | Result:
        """The next Delta or the Result. Any exception (cancellation too) ends the call."""
        try:
            try:
                item = await asyncio.wait_for(self.inbox.get(), _remaining(self.deadline))
            except asyncio.TimeoutError:
                raise ClientTimeout(f"request {self.request_id} timed out after {self.timeout:g} s") from None
            if isinstance(item, (Result, Error)):
                self._forget()
            msg = _as_reply(item)
        except BaseException:
            self.close()
            raise
        assert isinstance(msg, (Delta, Result))
        return msg

    def close(self) -> None:
        if self.done:
            return
        self._forget()
        if self.client._broken is None:
            self.client._send(Abort(request_id=self.request_id))

    def _forget(self) -> None:
        self.done = True
        self.client._demux.requests.pop(self.request_id, None)


class AsyncStream:
    """A streaming request of an AsyncClient; the async twin of `Stream`."""

    def __init__(self, call: _AsyncCall) -> None:
        self._call = call
        self.result: Completion | None = None

    @property
    def request_id(self) -> str:
        return self._call.request_id

    async def _iterate(self) -> AsyncIterator[Delta]:
        try:
            while (chunk := await self._next_chunk()) is not None:
                yield chunk
        finally:
            self.close()

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._iterate()

    async def __anext__(self) -> Delta:
        chunk = await self._next_chunk()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def _next_chunk(self) -> Delta | None:
        if self._call.done:
            return None
        msg = await self._call.next()
        if isinstance(msg, Result):
            self.result = Completion.from_result(msg)
            return None
        return msg

    def close(self) -> None:
        self._call.close()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "Client", "AsyncClient", "Stream", "AsyncStream", "Completion", "ClientError", "ServerError",
    "ClientTimeout", "readiness_problem", "build_submit",
    "SAMPLING_FIELDS", "RETRYABLE", "Usage", "Timings", "Delta", "Stats",
]
