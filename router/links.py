"""The KV links the router has asked prefill workers to open ahead of any handoff, until they answer.

A handoff over nccl goes over a link between its two workers, whose first operation sets an NCCL communicator up,
a cost the pair's first request would otherwise pay (docs/benchmarks.md, stop 30). So as a prefill and a decode
worker meet (either one says hello), the router has the prefill worker open the link (`open_link`), and the cluster
counts as ready once every link asked for has answered (`link_opened`, `Stats.kv_links_opening`). Every pair ahead
is prefill x decode links (250,000 behind a router of 1,000 workers, whose messages alone stalled it past the
workers' heartbeat timeout): beyond `limit` pairs, a pair's first handoff opens its link, as before any opened
ahead.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from common import protocol as P
from kvtransfer.errors import TransferError
from router.placement import Placement
from router.registry import WorkerInfo, WorkerRegistry

log = logging.getLogger(__name__)

Pair = tuple[str, str]  # (prefill worker id, decode worker id)


class KVLinks:
    """`send(worker, message)`: the router's send to a worker."""

    def __init__(self, registry: WorkerRegistry, placement: Placement,
                 send: Callable[[WorkerInfo, P.Message], Awaitable[None]], limit: int = 256):
        self.registry, self.placement, self.send, self.limit = registry, placement, send, limit
        self.opening: set[Pair] = set()
        self.opened_count = 0  # answered without an error
        self.beyond = False  # the live workers make more pairs than `limit` (said once as it happens)

    async def meet(self, worker: WorkerInfo) -> None:
        """A newly registered worker meets the live workers of the other side: each pair's prefill worker is asked
        to open its link, now counted as opening. A pair no transport connects has none (its handoffs fail there
        with the reason)."""
        others = [w for w in self.registry.workers.values() if w.alive and w is not worker]
        if worker.role == "prefill":
            pairs = [(worker, d) for d in others if d.role == "decode"]
        elif worker.role == "decode":
            pairs = [(p, worker) for p in others if p.role == "prefill"]
        else:
            return
        by_role = self.registry.roster().by_role
        prefills, decodes = len(by_role.get("prefill", ())), len(by_role.get("decode", ()))
        beyond = prefills * decodes > self.limit
        if beyond and not self.beyond:
            log.info("%d prefill x %d decode workers make more pairs than the %d whose KV links open ahead "
                     "(--eager-kv-links): a pair's first handoff opens its link", prefills, decodes, self.limit)
        self.beyond = beyond
        if beyond:
            return
        for prefill, decode in pairs:
            try:
                transport = self.placement.transport(prefill, decode)
            except TransferError:
                continue
            self.opening.add((prefill.worker_id, decode.worker_id))
            await self.send(prefill, P.OpenLink(decode_worker_id=decode.worker_id,
                                                decode_kv_address=decode.hello.kv_address, transport=transport,
                                                decode_kv=decode.hello.kv))

    def answered(self, prefill: WorkerInfo, msg: P.LinkOpened) -> None:
        """The prefill worker's link is open, or failed to open (its next handoff there opens another)."""
        if msg.error:
            log.warning("KV link %s -> %s did not open: %s", prefill.worker_id, msg.decode_worker_id, msg.error)
        pair = (prefill.worker_id, msg.decode_worker_id)
        if pair in self.opening:
            self.opening.discard(pair)
            self.opened_count += not msg.error

    def forget(self, worker_id: str) -> None:
        """A worker is gone: its links will not answer."""
        self.opening = {pair for pair in self.opening if worker_id not in pair}

    def still_opening(self) -> int:
        """Links not answered yet between workers still registered (a worker removed by scaling is forgotten)."""
        workers = self.registry.workers
        return sum(1 for prefill, decode in self.opening if prefill in workers and decode in workers)
