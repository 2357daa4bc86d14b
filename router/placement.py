"""Which workers get a request, and which KV transport connects a prefill worker to a decode worker."""
from __future__ import annotations

import logging
from collections.abc import Callable

from kvtransfer.choice import choose_transport
from router.prefix_index import PrefixIndex, PromptKeys
from router.registry import WorkerInfo, WorkerRegistry

log = logging.getLogger(__name__)

POLICIES = ("prefix", "load")


class Placement:
    """Places by cost. A prompt is prefilled (on a prefill worker, or a colocated replica) where it costs least:
    its tokens that worker's prefix cache does not hold (`prefix` policy; `load`: all of them) plus the prompt
    tokens already waiting there; a colocated tie goes to the replica running fewer requests, and then (as a
    prefill tie) to the one whose cache is reckoned to hold fewer blocks, so that new prefixes spread over the
    caches. Decode goes to the worker with the most free KV blocks among those with room for the request (where it
    may prefill the prompt itself, --disagg-policy never or auto: the least cost first)."""

    def __init__(self, registry: WorkerRegistry, kv_transport: str = "auto", policy: str = "prefix",
                 prefixes: PrefixIndex | None = None):
        if policy not in POLICIES:
            raise ValueError(f"placement: must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.registry = registry
        self.kv_transport = kv_transport
        self.policy = policy
        self.prefixes = prefixes or PrefixIndex()
        self._logged: set[tuple[str, str]] = set()  # pairs whose transport was logged

    def blocks_needed(self, prompt_ids: list[int]) -> int:
        """KV blocks a decode worker reserves for a prompt: its tokens and the first one sampled."""
        block_size = next(iter(self.registry.workers.values())).hello.layout.block_size
        return -(-(len(prompt_ids) + 1) // block_size)

    def keys(self, prompt_ids: list[int]) -> PromptKeys:
        block_size = next(iter(self.registry.workers.values())).hello.layout.block_size
        return PromptKeys.of(prompt_ids, block_size)

    def cached_tokens(self, worker: WorkerInfo, prompt: PromptKeys) -> int:
        """Prompt tokens the worker is reckoned to hold in its prefix cache (0 under the `load` policy)."""
        return self.prefixes.cached_tokens(worker.worker_id, prompt) if self.policy == "prefix" else 0

    def cost(self, worker: WorkerInfo, num_tokens: int, prompt: PromptKeys) -> int:
        """Tokens the worker would compute before this prompt is prefilled: what waits there, and the prompt's
        tokens its cache does not hold. What waits there is the larger of the router's count (the prompts it sent
        and has not seen a first token of, without what their caches were reckoned to hold) and the last
        heartbeat's: each mostly counts the same prompts, the router's sooner (not their sum, which would count
        them twice and push prompts away from the worker that holds their prefix)."""
        waiting = max(worker.load.queued_tokens, worker.prefill_tokens)
        return waiting + num_tokens - self.cached_tokens(worker, prompt)

    def prefill(self, num_tokens: int, prompt: PromptKeys) -> WorkerInfo | None:
        score = self._scorer(num_tokens, prompt)
        return min(self.registry.with_room("prefill"), key=score, default=None)

    def decode(self, blocks: int, num_tokens: int = 0, prompt: PromptKeys | None = None) -> WorkerInfo | None:
        """The decode worker with the most free blocks among those with room; given the prompt (the decode worker
        may prefill it itself), the one where it costs least, then (as for prefill) the emptier cache, then the most
        free blocks."""
        fits = [w for w in self.registry.with_room("decode") if w.free_blocks >= blocks]
        if prompt is None:
            return max(fits, key=lambda w: w.free_blocks, default=None)
        score = self._scorer(num_tokens, prompt)
        return min(fits, key=lambda w: (*score(w), -w.free_blocks), default=None)

    def colocated(self, num_tokens: int, prompt: PromptKeys) -> WorkerInfo | None:
        score = self._scorer(num_tokens, prompt)

        def key(w: WorkerInfo) -> tuple[int, int, int]:
            cost, held = score(w)
            return cost, w.load.running_requests, held
        return min(self.registry.with_room("colocated"), key=key, default=None)

    def _scorer(self, num_tokens: int, prompt: PromptKeys) -> Callable[[WorkerInfo], tuple[int, int]]:
        """Per worker, (`cost`, blocks its cache is reckoned to hold): `cost`, and the cache's size ties go by, in one
        call with one index lookup, as placement asks it of every worker that could take the prompt."""
        if self.policy != "prefix":
            return lambda w: (max(w.load.queued_tokens, w.prefill_tokens) + num_tokens, 0)
        caches, block_size = self.prefixes.workers, prompt.block_size

        def score(w: WorkerInfo) -> tuple[int, int]:
            waiting = max(w.load.queued_tokens, w.prefill_tokens)
            held = caches.get(w.hello.worker_id)
            if held is None:
                return waiting + num_tokens, 0
            return waiting + num_tokens - held.cached_blocks(prompt) * block_size, len(held)
        return score

    def placed(self, worker: WorkerInfo, prompt: PromptKeys) -> None:
        """The prompt goes to `worker` to be prefilled: its blocks will be in that worker's cache."""
        self.prefixes.sent(worker.worker_id, worker.hello.num_blocks, prompt)

    def forget_worker(self, worker_id: str) -> None:
        """The worker's cache is gone (it died or restarted)."""
        self.prefixes.forget(worker_id)

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
