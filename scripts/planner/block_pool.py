"""Block managers kept between simulations (scripts/planner/engine.py takes them, sim.py gives them back)."""
from __future__ import annotations

from common.engine.block_manager import BlockManager


class BlockPool:
    """Block managers whose engines are done, every block free and the cache cleared, for the next simulation:
    making one of a GPU's size takes longer than simulating many requests. Block ids carry no meaning, so a
    cleared one serves as a new one."""

    def __init__(self) -> None:
        self.spare: dict[tuple[int, int, bool], list[BlockManager]] = {}

    def take(self, num_blocks: int, block_size: int, prefix_caching: bool) -> BlockManager:
        spare = self.spare.get((num_blocks, block_size, prefix_caching))
        return spare.pop() if spare else BlockManager(num_blocks, block_size, prefix_caching)

    def give(self, bm: BlockManager) -> None:
        if bm.num_free_blocks != bm.num_blocks:
            return  # something still holds blocks (an unfinished simulation): not reusable
        bm.clear_cache()
        self.spare.setdefault((bm.num_blocks, bm.block_size, bm.enable_prefix_caching), []).append(bm)
