"""The requests in flight at the router, by both of their keys: the router's id of the current attempt (what
workers' messages carry) and the client's (identity, request id) (what aborts and duplicates are checked by).
The one place either key is set, so the two cannot disagree."""
from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

from router.request import Request


class RequestTable:
    def __init__(self) -> None:
        self._by_rid: dict[str, Request] = {}
        self._by_client: dict[tuple[bytes, str], Request] = {}
        self._ids = itertools.count()
        self._prefix = os.urandom(3).hex()  # ids of a restarted router's attempts differ from its last life's

    def new_rid(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def add(self, req: Request) -> None:
        key = (req.client, req.client_rid)
        assert req.rid not in self._by_rid and key not in self._by_client, (req.rid, key)
        self._by_rid[req.rid] = req
        self._by_client[key] = req

    def get(self, rid: str) -> Request | None:
        return self._by_rid.get(rid)

    def of_client(self, client: bytes, client_rid: str) -> Request | None:
        return self._by_client.get((client, client_rid))

    def next_attempt(self, req: Request, start: Callable[[str], None]) -> None:
        """Re-key `req` under a new attempt id, which `start` (a Request transition) gives it."""
        self._by_rid.pop(req.rid, None)
        start(self.new_rid())
        self._by_rid[req.rid] = req

    def remove(self, req: Request) -> None:
        self._by_rid.pop(req.rid, None)
        self._by_client.pop((req.client, req.client_rid), None)

    def clear(self) -> None:
        self._by_rid.clear()
        self._by_client.clear()

    def __len__(self) -> int:
        return len(self._by_rid)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._by_rid.values()))  # a copy: callers end requests as they go
