"""Which workers get a request, and which KV transport connects a prefill worker to a decode worker."""
from __future__ import annotations

import logging

from kvtransfer.choice import choose_transport
from router.registry import WorkerInfo, WorkerRegistry

log = logging.getLogger(__name__)


class Placement:
    """Places by load: prefill on the worker with the fewest prompt tokens waiting, decode on the one with the
    most free KV blocks among those with room for the request, colocated on the least loaded replica."""

    def __init__(self, registry: WorkerRegistry, kv_transport: str = "auto"):
        self.registry = registry
        self.kv_transport = kv_transport
        self._logged: set[tuple[str, str]] = set()  # pairs whose transport was logged

    def blocks_needed(self, prompt_ids: list[int]) -> int:
        """KV blocks a decode worker reserves for a prompt: its tokens and the first one sampled."""
        block_size = next(iter(self.registry.workers.values())).hello.layout.block_size
        return -(-(len(prompt_ids) + 1) // block_size)

    def prefill(self) -> WorkerInfo | None:
        return min(self.registry.with_room("prefill"), key=lambda w: w.load.queued_tokens + w.prefill_tokens,
                   default=None)

    def decode(self, blocks: int) -> WorkerInfo | None:
        fits = [w for w in self.registry.with_room("decode") if w.free_blocks >= blocks]
        return max(fits, key=lambda w: w.free_blocks, default=None)

    def colocated(self) -> WorkerInfo | None:
        return min(self.registry.with_room("colocated"),
                   key=lambda w: (w.load.queued_tokens + w.prefill_tokens, w.load.running_requests), default=None)

    def transport(self, prefill: WorkerInfo, decode: WorkerInfo) -> str:
        """The pair's KV transport (raises TransferError when the one asked for cannot connect them); the first
        use of a pair is logged, so a slow fallback shows."""
        name = choose_transport(prefill.hello, decode.hello, self.kv_transport)
        pair = (prefill.worker_id, decode.worker_id)
        if pair not in self._logged:
            self._logged.add(pair)
            log.info("KV transport %s -> %s: %s (nodes %s -> %s)", *pair, name, prefill.hello.node_id[:12] or "?",
                     decode.hello.node_id[:12] or "?")
        return name
