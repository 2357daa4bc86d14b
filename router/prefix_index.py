"""Which prompt prefixes each worker's prefix cache holds, as the router reckons it.

The router computes the chain keys the engine's block manager gives full blocks (common/prefix_hash.py) and
remembers, per worker, the keys of the prompts it sent there: a least-recently-used set of at most the worker's
KV block count, the engine's own bound (its cache evicts least-recently-freed blocks first, much as this forgets
least-recently-sent keys). It is an estimate: a worker may have evicted a block sooner under pressure, and
nothing here is ever trusted for correctness (the engine checks every hit against its tokens); it only decides
where a prompt is cheapest to prefill.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from common.prefix_hash import block_keys


@dataclass
class PromptKeys:
    """A prompt's chain keys: the first `reusable` (what a prefill can take from a cache) of `keys` (every full
    block)."""

    keys: list[int]
    reusable: int
    block_size: int

    @classmethod
    def of(cls, token_ids: list[int], block_size: int) -> PromptKeys:
        keys = block_keys(token_ids, block_size, len(token_ids) // block_size)
        return cls(keys, max(len(token_ids) - 1, 0) // block_size, block_size)


@dataclass
class WorkerPrefixes:
    """One worker's keys, least recently sent first, at most `capacity`."""

    capacity: int
    keys: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def cached_blocks(self, prompt: PromptKeys) -> int:
        """Leading blocks of the prompt this worker should find in its cache."""
        n, keys = 0, prompt.keys
        while n < prompt.reusable and keys[n] in self.keys:
            n += 1
        return n

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, prompt: PromptKeys) -> None:
        """The prompt's keys become the most recently sent, in the prompt's order."""
        keys = self.keys
        for key in keys.keys() & prompt.keys:  # held already: taken out, to go last with the new ones
            del keys[key]
        keys.update(dict.fromkeys(prompt.keys))
        for _ in range(len(keys) - self.capacity):
            keys.popitem(last=False)


class PrefixIndex:
    """Per worker id, the prefixes it is reckoned to hold (in a `kind`: WorkerPrefixes, or one that answers as it
    would)."""

    def __init__(self, kind: type[WorkerPrefixes] = WorkerPrefixes) -> None:
        self.kind = kind
        self.workers: dict[str, WorkerPrefixes] = {}

    def cached_tokens(self, worker_id: str, prompt: PromptKeys) -> int:
        held = self.workers.get(worker_id)
        return 0 if held is None else held.cached_blocks(prompt) * prompt.block_size

    def held(self, worker_id: str) -> int:
        """Blocks the worker is reckoned to hold: ties go to the emptier cache, so new prefixes spread."""
        held = self.workers.get(worker_id)
        return 0 if held is None else len(held)

    def sent(self, worker_id: str, capacity: int, prompt: PromptKeys) -> None:
        """`prompt` was sent to the worker: its blocks will be in that worker's cache."""
        held = self.workers.get(worker_id)
        if held is None:
            held = self.workers[worker_id] = self.kind(capacity)
        held.capacity = capacity  # a worker back with another pool: its keys beyond it go with this add
        held.add(prompt)

    def forget(self, worker_id: str) -> None:
        """The worker lost its cache (it died or restarted)."""
        self.workers.pop(worker_id, None)
