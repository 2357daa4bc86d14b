"""The router's reckoning of one worker's prefix cache, for a workload whose prompts share no block.

Placement reads two things of it (router/placement.py): the blocks of a prompt the worker should hold (none, here:
no prompt's keys were ever sent before) and how many keys it holds, which breaks ties (as many as were sent, up to
its capacity: every key is new, and the oldest go first). `UnsharedPrefixes` counts them instead of keeping each
long prompt's hundreds of keys in order, so the simulated router places every prompt where the router's own
`WorkerPrefixes` would (tests/test_planner_bulk.py). Nor are such prompts' keys hashed: `UnsharedKeys` counts them.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.prefix_hash import reusable_blocks
from router.prefix_index import PrefixIndex, PromptKeys, WorkerPrefixes
from scripts.planner.workload import Workload


@dataclass
class UnsharedPrefixes(WorkerPrefixes):
    held: int = 0  # keys the worker is reckoned to hold

    def __len__(self) -> int:
        return self.held

    def cached_blocks(self, prompt: PromptKeys) -> int:
        return 0

    def add(self, prompt: UnsharedKeys) -> None:
        self.held = min(self.capacity, self.held + prompt.count)


@dataclass
class UnsharedKeys(PromptKeys):
    """A prompt's keys as `UnsharedPrefixes` reads them: how many (its full blocks, `count`), not which, so none is
    hashed (`keys` is empty: the router's own index cannot read them)."""

    count: int = 0

    @classmethod
    def of(cls, token_ids: list[int], block_size: int) -> UnsharedKeys:
        return cls([], reusable_blocks(len(token_ids), block_size), block_size, len(token_ids) // block_size)


def prompt_keys(workload: Workload, block_size: int) -> list[PromptKeys]:
    """Each prompt's keys, as the simulated router's index (`prefix_index`) reads them."""
    kind = PromptKeys if workload.shared_prefixes else UnsharedKeys
    return [kind.of(p, block_size) for p in workload.prompts]


def prefix_index(workload: Workload) -> PrefixIndex | None:
    """The simulated router's prefix index: the router's own (None: Placement's default) where prompts share
    prefixes, else one of `UnsharedPrefixes`."""
    return None if workload.shared_prefixes else PrefixIndex(UnsharedPrefixes)
