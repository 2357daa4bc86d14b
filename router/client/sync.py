"""The blocking client: the core's flows, run with blocking waits on one DEALER socket."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import zmq

from common.protocol import DEFAULT_ROUTER_ADDRESS, Abort, Delta, ScaleReply, Stats
from router.client.core import CONNECT_TIMEOUT_S, ClientCore, Prompt, StreamBase, StreamState
from router.client.flow import Flow, Run, T, Wait, remaining
from router.client.results import ClientError, Completion
from router.client.socket import dealer


class Client:
    """A blocking client on one DEALER socket. Not thread-safe: use one per thread.

    `timeout` (seconds, None = wait forever) is the default for every call; each call may override it.
    `auth_token` is the cluster's shared secret, if it has one (default: $PDCLUSTER_AUTH_TOKEN_FILE or
    $PDCLUSTER_AUTH_TOKEN); without the right one the router never answers. `retries` is the default for
    `generate`. Until a router first answers, no call waits longer than `connect_timeout` seconds (None: no limit):
    a wrong address fails with ClientTimeout saying no router answered there (`wait_ready` waits its own timeout).
    """

    def __init__(self, address: str = DEFAULT_ROUTER_ADDRESS, timeout: float | None = None,
                 auth_token: str | None = None, retries: int = 0,
                 connect_timeout: float | None = CONNECT_TIMEOUT_S) -> None:
        self.address = address
        self._sock = dealer(zmq.Context.instance(), address, auth_token)
        self._core = ClientCore(address, self._sock.send, timeout, retries, connect_timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._sock.closed:
            self._core.close_with(ClientError("the client is closed"))
            self._sock.close()

    def generate(self, prompt: Prompt, *, chat: bool = False, timeout: float | None = None,
                 request_id: str | None = None, retries: int | None = None, **sampling: Any) -> Completion:
        """Run one request to the end. Raises ServerError, ClientTimeout (after aborting it), ClientError.

        Refused with overloaded, unavailable or aborted, it is resubmitted (same request_id) up to `retries`
        times (default: the client's), after the router's retry_after, within `timeout`.
        """
        return self._run(self._core.generate(prompt, chat, timeout, request_id, retries, sampling))

    def stream(self, prompt: Prompt, *, chat: bool = False, timeout: float | None = None,
               request_id: str | None = None, **sampling: Any) -> Stream:
        """Submit a streaming request now; iterate the returned Stream for its deltas."""
        return Stream(self, StreamState(self._core.submit(prompt, chat, True, request_id, timeout, sampling)))

    def abort(self, request_id: str) -> None:
        """Ask the router to stop a request; a running one then ends with finish_reason "abort"."""
        self._core.send(Abort(request_id=request_id))

    def ping(self, timeout: float | None = None) -> float:
        """Round-trip time to the router, in seconds."""
        return self._run(self._core.ping(timeout))

    def stats(self, timeout: float | None = None) -> Stats:
        return self._run(self._core.stats(timeout))

    def scale(self, role: str, delta: int, timeout: float | None = None) -> ScaleReply:
        """Adds (`delta` > 0) or drains and removes (< 0) workers of `role`; returns when done. Loading a model
        takes a while: give it a long `timeout`."""
        return self._run(self._core.scale(role, delta, timeout))

    def wait_ready(self, timeout: float) -> None:
        """Return once the router answers and has a live prefill and decode worker; else TimeoutError."""
        self._run(self._core.wait_ready(timeout))

    # ---- the driver ---------------------------------------------------------------------------------
    def _run(self, flow: Flow[T]) -> T:
        run = Run(flow)
        while run.effect is not None:
            with run.waiting():
                run.answer(self._wait(run.effect) if isinstance(run.effect, Wait) else time.sleep(run.effect.seconds))
        return run.value

    def _wait(self, effect: Wait):
        """Read frames (each routed by the core) until the box has a reply; None when the deadline passes first."""
        while not effect.box.items:
            left = remaining(effect.deadline)
            if not self._sock.poll(None if left is None else int(left * 1000) + 1):
                return None
            self._core.receive(self._sock.recv())
        return effect.box.items.popleft()


class Stream(StreamBase):
    """A streaming request of a blocking Client.

    Iterating yields the `Delta`s (text, token_ids, index) in order; afterwards `result` holds the Completion,
    whose text and token_ids equal the joined deltas. Leaving a `for` loop early, `close()`, or a timeout aborts
    the request (then `result` stays None).
    """

    def __iter__(self) -> Iterator[Delta]:
        try:
            while (delta := self._client._run(self._client._core.next_delta(self._state))) is not None:
                yield delta
        finally:
            self.close()

    def __next__(self) -> Delta:
        delta = self._client._run(self._client._core.next_delta(self._state))
        if delta is None:
            raise StopIteration
        return delta

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
