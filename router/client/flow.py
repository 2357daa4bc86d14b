"""What a client's flows wait for, and how a driver runs one (router/client/core.py's flows; the blocking and the
asyncio client each drive them with their own waits)."""
from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from common.protocol import Message
from router.client.results import ClientError

T = TypeVar("T")


class Box:
    """Where replies to one call land, in order; `notify` (set by a waiting driver) is called on each arrival."""

    def __init__(self) -> None:
        self.items: deque[Message | ClientError] = deque()
        self.notify: Callable[[], None] | None = None

    def put(self, item: Message | ClientError) -> None:
        self.items.append(item)
        if self.notify is not None:
            self.notify()


@dataclass(frozen=True)
class Wait:
    """Until `box` holds an item (the answer: the item, taken out) or `deadline` passes (the answer: None)."""

    box: Box
    deadline: float | None


@dataclass(frozen=True)
class Sleep:
    seconds: float


Flow = Generator[Union[Wait, Sleep], Any, T]


class Run:
    """Drives one flow for a client: `effect` is what it waits for now (None: done, its result in `value`); the
    client waits, then `answer`s. An exception while waiting (an interrupt, a cancellation) goes into the flow
    (`waiting`), so its cleanup runs (a request in flight is aborted) before it propagates."""

    def __init__(self, flow: Flow[T]) -> None:
        self.flow, self.value = flow, None
        self.effect: Wait | Sleep | None = None
        self.answer(None)

    def answer(self, reply: Any) -> None:
        try:
            self.effect = self.flow.send(reply)
        except StopIteration as done:
            self.effect, self.value = None, done.value

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            self.flow.throw(exc)
            raise


def deadline_after(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())
