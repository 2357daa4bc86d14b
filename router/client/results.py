"""What a client call returns or raises: the finished request, the errors, and whether a cluster can serve."""
from __future__ import annotations

from dataclasses import dataclass

from common.protocol import Error, Result, Stats, Timings, Usage


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
        if stats.kv_links_opening:
            return f"{stats.kv_links_opening} KV links between prefill and decode workers still opening"
        return None
    missing = " and ".join(name for name, n in (("prefill", prefill), ("decode", decode_)) if not n)
    return f"no alive {missing} worker ({len(alive)} of {len(stats.workers)} known workers alive)"
