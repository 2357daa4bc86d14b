"""The KV links the router has asked prefill workers to open ahead of any handoff, until they answer.

A handoff over nccl goes over a link between its two workers, whose first operation sets an NCCL communicator up,
a cost the pair's first request would otherwise pay (docs/benchmarks.md, stop 30). So as a prefill and a decode
worker meet (either one says hello), the router has the prefill worker open the link (`open_link`), and the cluster
counts as ready once every link asked for has answered (`link_opened`, `Stats.kv_links_opening`).
"""
from __future__ import annotations

from kvtransfer.errors import TransferError
from router.placement import Placement
from router.registry import WorkerInfo, WorkerRegistry

Pair = tuple[str, str]  # (prefill worker id, decode worker id)


class KVLinks:
    def __init__(self, registry: WorkerRegistry, placement: Placement):
        self.registry, self.placement = registry, placement
        self.opening: set[Pair] = set()
        self.opened_count = 0  # answered without an error

    def meet(self, worker: WorkerInfo) -> list[tuple[WorkerInfo, WorkerInfo, str]]:
        """The links a newly registered worker makes with the live workers of the other side: (prefill, decode,
        transport) for each, now counted as opening. A pair no transport connects has none (its handoffs fail
        there with the reason)."""
        others = [w for w in self.registry.workers.values() if w.alive and w is not worker]
        if worker.role == "prefill":
            pairs = [(worker, d) for d in others if d.role == "decode"]
        elif worker.role == "decode":
            pairs = [(p, worker) for p in others if p.role == "prefill"]
        else:
            return []
        links = []
        for prefill, decode in pairs:
            try:
                links.append((prefill, decode, self.placement.transport(prefill, decode)))
            except TransferError:
                continue
            self.opening.add((prefill.worker_id, decode.worker_id))
        return links

    def answered(self, prefill_id: str, decode_id: str, ok: bool) -> None:
        if (prefill_id, decode_id) in self.opening:
            self.opening.discard((prefill_id, decode_id))
            self.opened_count += ok

    def forget(self, worker_id: str) -> None:
        """A worker is gone: its links will not answer."""
        self.opening = {pair for pair in self.opening if worker_id not in pair}

    def still_opening(self) -> int:
        """Links not answered yet between workers still registered (a worker removed by scaling is forgotten)."""
        workers = self.registry.workers
        return sum(1 for prefill, decode in self.opening if prefill in workers and decode in workers)
