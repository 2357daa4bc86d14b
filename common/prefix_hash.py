"""The prefix cache's block keys, tensor-free: the engine's block manager keys its cached blocks with them and the
router computes the same keys to know which prefixes a worker holds (router/prefix_index.py)."""
from __future__ import annotations

from array import array
from collections.abc import Sequence

import xxhash


def chain_hash(prev: int, tokens: Sequence[int]) -> int:
    """Hash of a full block given the hash of the block before it (-1 for the first)."""
    return chain_hash_bytes(prev, token_bytes(tokens))


def token_bytes(tokens: Sequence[int]) -> bytes:
    """The tokens as the hash reads them, 8 bytes each (signed, in the machine's order, as numpy's int64)."""
    return array("q", tokens).tobytes()


def chain_hash_bytes(prev: int, block: bytes) -> int:
    """`chain_hash` of a block given as `token_bytes`: a run of blocks converted once, then sliced."""
    data = prev.to_bytes(8, "little", signed=True) + block
    return xxhash.xxh3_64_intdigest(data) & 0x7FFF_FFFF_FFFF_FFFF


def reusable_blocks(num_tokens: int, block_size: int) -> int:
    """Full blocks of a prompt a prefill may take from the cache: the last prompt token is always recomputed (a
    prefill needs at least one query token), so a prompt of exactly k blocks reuses k - 1."""
    return max(num_tokens - 1, 0) // block_size


def block_keys(token_ids: Sequence[int], block_size: int, num_blocks: int | None = None) -> list[int]:
    """The chain keys of a prompt's first `num_blocks` full blocks (default: the reusable ones)."""
    n = reusable_blocks(len(token_ids), block_size) if num_blocks is None else num_blocks
    data = token_bytes(token_ids[:n * block_size])  # converted once, for all the blocks
    width = 8 * block_size
    keys, prev = [], -1
    for i in range(n):
        prev = chain_hash_bytes(prev, data[i * width:(i + 1) * width])
        keys.append(prev)
    return keys
