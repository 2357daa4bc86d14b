from __future__ import annotations

from collections import OrderedDict, deque

from common.engine.sequence import Sequence
from common.prefix_hash import chain_hash_bytes, reusable_blocks, token_bytes


class BlockManager:
    """Owns which KV block holds what: allocation, reference counts and the prefix cache.

    A block with no references stays in the cache (its hash still maps to it) until it is reused; free
    blocks are reused least-recently-freed first, so recently used prefixes survive longest.

    A block freed while a launched step may still write it (a sequence finished or aborted with its next step on
    the GPU) is *fenced* until the engine has collected that step (`release`). The engine's own steps may take it
    (the GPU runs them after), but not a reservation: another process writes those blocks (a KV handoff), and no
    stream orders its copy after this engine's steps. Fenced blocks are the newest freed, so always the tail of the
    free list.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[bytes | None] = [None] * num_blocks  # as token_bytes: a hash match checks them
        self.hash_to_block: dict[int, int] = {}
        # The free blocks, least recently freed first: those never used yet (`unused_from` on), then `free`. A
        # prefix cache hit takes a block out of its middle (an ordered dict); without the cache, blocks leave only
        # from its front (a deque: cheaper to fill and to take from, a long prompt's hundreds at a time).
        self.unused_from = 0
        self.free: OrderedDict[int, None] | deque[int] = self._no_free()
        # Every block id, made once: a never used block is taken as a slice of it, not as a new int (ids past 256
        # are objects of their own, made and freed again with every table that held them)
        self.ids = list(range(num_blocks))
        self.epoch = 0  # the newest launched step (LLMEngine sets it): what a block freed now waits for ...
        self.collected = 0  # ... unless the engine has collected it already (`release`)
        self.fenced: dict[int, int] = {}  # free block -> the launch that may still write it, oldest first
        self.cache_query_tokens = 0
        self.cache_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.unused_from + len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, seq: Sequence, num_tokens: int, use_cache: bool = True, remote: bool = False) -> bool:
        """Make seq's block table cover `num_tokens` tokens; on its first allocation, reuse cached prefix blocks.
        `remote`: another process will write the blocks, so no fenced block is taken.

        All or nothing: returns False (and changes nothing) when too few blocks are free.
        """
        table = seq.block_table
        if table and num_tokens <= len(table) * self.block_size:
            return True  # covered already: most of a decode step's sequences
        hits = self._match_prefix(seq) if use_cache and not table else []
        fresh = self.blocks_needed(num_tokens) - len(table) - len(hits)
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)
        if max(fresh, 0) + revived > self.num_free_blocks - (len(self.fenced) if remote else 0):
            return False
        if use_cache and not table and self.enable_prefix_caching:
            self.cache_query_tokens += seq.num_tokens
            self.cache_hit_tokens += len(hits) * self.block_size
        for b in hits:
            if self.ref_counts[b] == 0:
                del self.free[b]
                self.fenced.pop(b, None)
            self.ref_counts[b] += 1
        table.extend(hits)
        if not seq.num_computed_tokens and hits:
            seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        if fresh > 0:
            table.extend(self._take_free_blocks(fresh))
        return True

    def append_blocks(self, seqs: list[Sequence]) -> bool:
        """One more block at the end of each sequence's table (decodes crossing into a new block), all or nothing:
        the blocks allocating one for each in turn would give."""
        if len(seqs) > self.num_free_blocks:
            return False
        for seq, b in zip(seqs, self._take_free_blocks(len(seqs))):
            seq.block_table.append(b)
        return True

    def free_blocks(self, seq: Sequence) -> None:
        # Tail blocks go back first, so they are evicted before the (more shareable) head of the prompt.
        ref_counts = self.ref_counts
        if self.enable_prefix_caching:
            released = []
            for b in reversed(seq.block_table):
                left = ref_counts[b] = ref_counts[b] - 1
                if not left:
                    released.append(b)
                elif left < 0:
                    raise AssertionError(f"block {b} freed twice")
            self.free.update(dict.fromkeys(released))
        else:  # nothing is shared: every block held has one reference
            released = seq.block_table[::-1]
            for b in released:
                if not ref_counts[b]:
                    raise AssertionError(f"block {b} freed twice")
                ref_counts[b] = 0
            self.free.extend(released)
        if self.epoch > self.collected:  # a launched step not yet collected may still write them
            self.fenced.update(dict.fromkeys(released, self.epoch))
        seq.block_table = []

    def release(self, launch: int) -> None:
        """The engine has collected launch `launch` (and every one before it): their blocks are no longer fenced."""
        self.collected = max(self.collected, launch)
        for b, epoch in list(self.fenced.items()):
            if epoch > launch:
                break
            del self.fenced[b]

    def commit(self, seq: Sequence, old_computed: int) -> None:
        """Register in the prefix cache the blocks that became full between old_computed and now."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        first, end = old_computed // bs, seq.num_computed_tokens // bs
        if first >= end:
            return
        data, width = token_bytes(seq.token_ids[first * bs:end * bs]), 8 * bs  # converted once, sliced a block
        for i in range(first, end):
            b = seq.block_table[i]
            if self.block_hash[b] is not None:
                continue
            prev = self.block_hash[seq.block_table[i - 1]] if i else -1
            block = data[(i - first) * width:(i - first + 1) * width]
            h = self._key(seq, i, prev, block)
            self.block_hash[b], self.block_tokens[b] = h, block
            self.hash_to_block.setdefault(h, b)

    def clear_cache(self) -> None:
        """Forget every cached prefix (and the hit counts); only while no block is in use. Unless one is fenced,
        every block is then as good as never used, and is taken as such (in one slice, not one by one). Without the
        prefix cache no block ever holds a hash: none to forget."""
        assert self.num_free_blocks == self.num_blocks, "clear_cache with blocks in use"
        if not self.fenced:
            self.unused_from, self.free = 0, self._no_free()
        if self.enable_prefix_caching:
            self.block_hash = [None] * self.num_blocks
            self.block_tokens = [None] * self.num_blocks
            self.hash_to_block.clear()
        self.cache_query_tokens = self.cache_hit_tokens = 0

    def _no_free(self) -> OrderedDict[int, None] | deque[int]:
        return OrderedDict() if self.enable_prefix_caching else deque()

    def _match_prefix(self, seq: Sequence) -> list[int]:
        if not self.enable_prefix_caching or seq.num_computed_tokens:
            return []
        bs = self.block_size
        num_full = reusable_blocks(seq.num_tokens, bs)  # the last prompt token is always recomputed
        data, width = b"", 8 * bs
        hits: list[int] = []
        prev = -1
        for i in range(num_full):
            if i == len(data) // width:  # the first block alone (most prompts miss there), then the others at once
                data = token_bytes(seq.token_ids[:(num_full if i else 1) * bs])
            block = data[i * width:(i + 1) * width]
            prev = self._key(seq, i, prev, block)
            b = self.hash_to_block.get(prev)
            if b is None or self.block_tokens[b] != block:
                break
            hits.append(b)
        return hits

    def _key(self, seq: Sequence, i: int, prev: int, block: bytes) -> int:
        """`chain_hash_bytes(prev, block)` of block i of `seq`, taken from (or added to) its `prompt_keys` where it
        continues their chain inside the prompt: a prompt's tokens never change, so neither do their keys."""
        keys = seq.prompt_keys
        n = len(keys)
        if i <= n and (keys[i - 1] if i else -1) == prev:
            if i < n:
                return keys[i]
            if (i + 1) * self.block_size <= seq.num_prompt_tokens:
                keys.append(h := chain_hash_bytes(prev, block))
                return h
        return chain_hash_bytes(prev, block)

    def _take_free_blocks(self, n: int) -> list[int]:
        """The n least recently freed blocks (never used ones first), each out of the prefix cache and with one
        reference."""
        first_use, start = min(n, self.num_blocks - self.unused_from), self.unused_from
        taken = self.ids[start:start + first_use]
        self.ref_counts[start:start + first_use] = [1] * first_use
        self.unused_from += first_use
        if first_use == n:
            return taken
        if not self.enable_prefix_caching:  # no block holds a hash
            popleft, ref_counts, fenced = self.free.popleft, self.ref_counts, self.fenced
            reused = [popleft() for _ in range(n - first_use)]
            for b in reused:
                ref_counts[b] = 1
            if fenced:
                for b in reused:
                    fenced.pop(b, None)
            return taken + reused
        for _ in range(n - first_use):
            b, _ = self.free.popitem(last=False)
            self.fenced.pop(b, None)
            h = self.block_hash[b]
            if h is not None:
                if self.hash_to_block.get(h) == b:
                    del self.hash_to_block[h]
                self.block_hash[b] = self.block_tokens[b] = None
            self.ref_counts[b] = 1
            taken.append(b)
        return taken
