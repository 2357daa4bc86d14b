"""Which requests the router takes: validation (the one prompt rule the engine applies too), and the bounded
queue of requests waiting for workers, with the overload answers that keep it bounded."""
from __future__ import annotations

from collections import deque

from common import protocol as P
from common.prompt import check_prompt, encode_prompt
from common.sampling_params import InvalidRequest
from router.config import RouterConfig
from router.placement import Placement
from router.registry import WorkerRegistry
from router.request import Request
from router.text import RouterText


class Refused(Exception):
    """A submit the router answers with an error at once; nothing of it is kept."""

    def __init__(self, code: str, message: str, retry_after: float | None = None):
        super().__init__(code, message, retry_after)
        self.code, self.message, self.retry_after = code, message, retry_after


class WaitQueue:
    """Requests waiting for a worker, oldest first, with their prompt tokens counted for admission control."""

    def __init__(self) -> None:
        self._items: deque[Request] = deque()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, req: Request) -> bool:
        return req in self._items

    def push(self, req: Request, front: bool = False) -> None:
        (self._items.appendleft if front else self._items.append)(req)
        self.tokens += len(req.attempt_ids)

    def peek(self) -> Request:
        return self._items[0]

    def pop(self) -> Request:
        req = self._items.popleft()
        self.tokens -= len(req.attempt_ids)
        return req

    def remove(self, req: Request) -> None:
        self._items.remove(req)
        self.tokens -= len(req.attempt_ids)


class Admission:
    def __init__(self, config: RouterConfig, registry: WorkerRegistry, placement: Placement, text: RouterText | None):
        # `text` tokenizes a prompt given as text (its tokenizer may still be loading while the workers start)
        self.config, self.registry, self.placement, self.text = config, registry, placement, text
        self.queue = WaitQueue()

    def admit(self, msg: P.Submit) -> list[int]:
        """request -> router: the prompt's token ids, if the router can take it now; else raises Refused:
        `unavailable` without workers to serve it, `overloaded` with a full queue, `bad_request` naming the field."""
        cfg = self.config
        limits = self.registry.limits()
        if limits is None or not self.registry.can_serve(cfg.mode):
            raise Refused(P.UNAVAILABLE, "no workers are ready", cfg.retry_after)
        if len(self.queue) >= cfg.max_queued_requests:
            raise Refused(P.OVERLOADED, f"{len(self.queue)} requests are queued", cfg.retry_after)
        try:
            ids = msg.token_ids
            if ids is None:
                ids = encode_prompt(self.text.tokenizer, msg.prompt, msg.chat)
            self.check(ids, *limits)
        except InvalidRequest as e:
            raise Refused(P.BAD_REQUEST, str(e)) from None
        if self.queue and self.queue.tokens + len(ids) > cfg.max_queued_tokens:
            raise Refused(P.OVERLOADED, f"{self.queue.tokens} prompt tokens are queued", cfg.retry_after)
        return ids

    def fits(self, ids: list[int]) -> bool:
        """Whether the workers that are left can take `ids` as a prompt (a migrating request's prompt and the tokens
        streamed so far: one no worker can hold would wait at the head of the queue forever)."""
        if not self.registry.can_serve(self.config.mode):
            return True  # no worker to judge by now: it waits in the queue for one to (re)join
        try:
            self.check(ids, *self.registry.limits())
        except InvalidRequest:
            return False
        return True

    def check(self, ids: list[int], max_model_len: int, vocab_size: int) -> None:
        """The engine's prompt rule, against the limits every worker supports, and room for its KV."""
        check_prompt(ids, max_model_len, vocab_size)
        if self.config.mode == "disagg":
            if self.placement.blocks_needed(ids) > self.registry.largest_blocks("decode"):
                raise InvalidRequest("prompt", "needs more KV cache than any decode worker has")
