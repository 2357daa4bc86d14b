"""Adding and removing workers while serving (`pdcluster scale`): start and wait until they join, or drain and
stop them. The launcher starts and stops the processes (`Scaler`); the router decides and drains."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from common import protocol as P
from router.config import RouterConfig
from router.registry import WorkerInfo, WorkerRegistry

log = logging.getLogger(__name__)


class Scaler(Protocol):
    """Starts and stops worker processes for the router (the launcher, which owns Ray)."""

    async def add(self, role: str, count: int) -> list[str]:
        """Starts `count` workers of `role`; returns their ids once they have loaded (they then say hello)."""

    async def remove(self, worker_id: str) -> None:
        """Stops a worker the router has drained."""


def pick_removal(registry: WorkerRegistry, role: str, count: int) -> list[WorkerInfo]:
    """The `count` accepting workers of `role` to remove: fewest requests first, newest on a tie. Raises
    ValueError when that would leave the role without an accepting worker."""
    live = registry.of_role(role)
    if count >= len(live):
        raise ValueError(f"cannot remove {count} of the {len(live)} accepting {role} workers: at least one must stay")
    order = sorted(enumerate(live), key=lambda iw: (len(iw[1].assigned), -iw[0]))
    return [w for _, w in order[:count]]


class Scaling:
    """One scale request at a time. `lose(worker, why)` is the router's handling of a worker that is gone, applied
    to a drained worker that still holds requests when its drain times out."""

    def __init__(self, config: RouterConfig, registry: WorkerRegistry,
                 lose: Callable[[WorkerInfo, str], Awaitable[None]]):
        self.config, self.registry, self.lose = config, registry, lose
        self.scaler: Scaler | None = None  # set by the launcher; without one, scale requests are refused
        self._one_at_a_time = asyncio.Lock()
        self.tasks: set[asyncio.Task] = set()  # scale requests being carried out

    def start(self, msg: P.ScaleRequest, answer: Callable[[P.ScaleReply], Awaitable[None]]) -> None:
        """Carry out a scale request in the background; `answer` gets the reply when it is done."""
        async def run() -> None:
            try:
                ok, message, ids = await self.scale(msg.role, msg.delta)
            except Exception as e:
                log.exception("scaling %s by %+d failed", msg.role, msg.delta)
                ok, message, ids = False, f"scaling failed: {e}", []
            await answer(P.ScaleReply(nonce=msg.nonce, ok=ok, message=message[:P.MAX_MESSAGE_LEN], workers=ids))
        task = asyncio.create_task(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def scale(self, role: str, delta: int) -> tuple[bool, str, list[str]]:
        """Adds or removes `delta` workers of `role`: (ok, what happened, the ids added or removed)."""
        mode = self.config.mode
        roles = ("colocated",) if mode == "colocated" else ("prefill", "decode")
        if role not in roles:
            return False, f"a {mode} cluster has no {role} workers (it has: {', '.join(roles)})", []
        if self.scaler is None:
            return False, "this router was not started by `pdcluster serve`: nothing can start workers", []
        async with self._one_at_a_time:
            return await (self._add(role, delta) if delta > 0 else self._remove(role, -delta))

    async def _add(self, role: str, count: int) -> tuple[bool, str, list[str]]:
        ids = await self.scaler.add(role, count)
        workers = self.registry.workers

        def joined() -> bool:
            return all(i in workers and workers[i].accepting for i in ids)
        if not await wait_until(joined, self.config.drain_timeout):
            return False, f"started {', '.join(ids)}, but not all joined within {self.config.drain_timeout:g} s", ids
        log.info("scaled %s up by %d: %s", role, count, ", ".join(ids))
        return True, f"added {role} workers {', '.join(ids)}", ids

    async def _remove(self, role: str, count: int) -> tuple[bool, str, list[str]]:
        """Drain, then stop: no new requests go to the workers, they get until they hold nothing (bounded by
        `drain_timeout`), then the launcher stops them and they are forgotten."""
        try:
            victims = pick_removal(self.registry, role, count)
        except ValueError as e:
            return False, str(e), []
        started = time.monotonic()
        for worker in victims:
            worker.draining = True
        log.info("draining %s", ", ".join(w.worker_id for w in victims))
        timeout = self.config.drain_timeout
        drained = await wait_until(lambda: all(w.idle_since(started) for w in victims), timeout)
        for worker in victims:
            if worker.assigned:  # past the timeout: as if it died (started over if unseen, else migrated)
                await self.lose(worker, f"was removed after the {timeout:g} s drain timeout")
            await self.scaler.remove(worker.worker_id)
            self.registry.forget(worker.worker_id)
        ids = [w.worker_id for w in victims]
        log.info("scaled %s down by %d: %s", role, count, ", ".join(ids))
        late = "" if drained else f" (the drain timed out after {timeout:g} s)"
        return True, f"removed {role} workers {', '.join(ids)}{late}", ids


async def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Polls `condition` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True
