"""The router's reckoning of one worker's prefix cache, for a workload whose prompts share no block.

Placement reads two things of it (router/placement.py): the blocks of a prompt the worker should hold (none, here:
no prompt's keys were ever sent before) and how many keys it holds, which breaks ties (as many as were sent, up to
its capacity: every key is new, and the oldest go first). `UnsharedPrefixes` counts them instead of keeping each
long prompt's hundreds of keys in order, so the simulated router places every prompt where the router's own
`WorkerPrefixes` would (tests/test_planner_bulk.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from router.prefix_index import PrefixIndex, PromptKeys, WorkerPrefixes
from scripts.planner.workload import Workload


@dataclass
class UnsharedPrefixes(WorkerPrefixes):
    held: int = 0  # keys the worker is reckoned to hold

    def __len__(self) -> int:
        return self.held

    def cached_blocks(self, prompt: PromptKeys) -> int:
        return 0

    def add(self, prompt: PromptKeys) -> None:
        self.held = min(self.capacity, self.held + len(prompt.keys))


def prefix_index(workload: Workload) -> PrefixIndex | None:
    """The simulated router's prefix index: the router's own (None: Placement's default) where prompts share
    prefixes, else one of `UnsharedPrefixes`."""
    return None if workload.shared_prefixes else PrefixIndex(UnsharedPrefixes)
