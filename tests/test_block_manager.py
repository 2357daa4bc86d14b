from __future__ import annotations

import random

import pytest

from common.engine import block_manager as bm_module
from common.engine.block_manager import BlockManager
from common.engine.sequence import Sequence
from common.sampling_params import SamplingParams


def seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, tokens, SamplingParams())


def computed(bm: BlockManager, s: Sequence) -> None:
    """Pretend the whole sequence was computed this step, as the scheduler's postprocess does."""
    old = s.num_computed_tokens
    s.num_computed_tokens = s.num_tokens
    bm.commit(s, old)


def test_allocate_and_free_return_every_block():
    bm = BlockManager(8, 4)
    a, b = seq(list(range(10)), "a"), seq(list(range(5)), "b")
    assert bm.allocate(a, a.num_tokens) and len(a.block_table) == 3
    assert bm.allocate(b, b.num_tokens) and len(b.block_table) == 2
    assert bm.num_free_blocks == 3
    bm.free_blocks(a)
    bm.free_blocks(b)
    assert bm.num_free_blocks == 8 and a.block_table == [] and sorted(bm.ref_counts) == [0] * 8


def test_allocation_is_all_or_nothing():
    bm = BlockManager(4, 4)
    big = seq(list(range(20)))
    assert not bm.allocate(big, big.num_tokens)
    assert big.block_table == [] and bm.num_free_blocks == 4


def test_appended_blocks_are_those_allocating_each_in_turn_gives_all_or_nothing():
    """A step's decodes that cross into a new block get theirs in one call: the same blocks, in the same order."""
    def decoding(bm: BlockManager) -> list[Sequence]:
        seqs = [seq(list(range(8 + i)), str(i)) for i in range(3)]
        for s in seqs:
            assert bm.allocate(s, s.num_tokens)
        bm.free_blocks(seqs[1])  # freed blocks come back after the never used ones, as they would for each
        for s in seqs[::2]:
            computed(bm, s)
        return seqs[::2]

    one, bulk = BlockManager(8, 4), BlockManager(8, 4)
    each, together = decoding(one), decoding(bulk)
    for s in each:
        assert one.allocate(s, len(s.block_table) * 4 + 1)
    assert bulk.append_blocks(together)
    assert [s.block_table for s in together] == [s.block_table for s in each]
    assert bulk.num_free_blocks == one.num_free_blocks
    tables = [list(s.block_table) for s in together]
    assert not bulk.append_blocks(together * 3)  # 6 blocks asked, fewer free: none taken
    assert [s.block_table for s in together] == tables and bulk.num_free_blocks == one.num_free_blocks


def test_shared_prefix_is_reused_with_reference_counts():
    bm = BlockManager(16, 4)
    prefix = list(range(100, 108))  # two full blocks
    a = seq(prefix + [1, 2, 3], "a")
    assert bm.allocate(a, a.num_tokens)
    computed(bm, a)
    b = seq(prefix + [7, 8], "b")
    assert bm.allocate(b, b.num_tokens)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.num_computed_tokens == b.num_cached_tokens == 8
    assert bm.ref_counts[a.block_table[0]] == 2
    assert bm.cache_hit_tokens == 8
    bm.free_blocks(a)
    assert bm.ref_counts[b.block_table[0]] == 1  # still held by b


def test_full_prefix_hit_keeps_last_token_for_recompute():
    bm = BlockManager(16, 4)
    tokens = list(range(8))  # exactly two blocks
    a = seq(tokens, "a")
    bm.allocate(a, a.num_tokens)
    computed(bm, a)
    b = seq(tokens, "b")
    bm.allocate(b, b.num_tokens)
    # only the first block may hit: a prefill needs at least one query token
    assert b.num_computed_tokens == 4 and b.num_tokens - b.num_computed_tokens >= 1
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_hash_collision_does_not_reuse_a_block(monkeypatch):
    monkeypatch.setattr(bm_module, "chain_hash_bytes", lambda prev, block: 42)
    bm = BlockManager(16, 4)
    a = seq([1, 2, 3, 4, 5], "a")
    bm.allocate(a, a.num_tokens)
    computed(bm, a)
    b = seq([9, 9, 9, 9, 5], "b")  # same (forced) hash, different tokens
    bm.allocate(b, b.num_tokens)
    assert b.num_computed_tokens == 0 and b.block_table[0] != a.block_table[0]


def test_unreferenced_cached_blocks_survive_until_evicted_lru():
    bm = BlockManager(4, 4)
    old = seq(list(range(100, 105)), "old")
    bm.allocate(old, old.num_tokens)
    computed(bm, old)
    bm.free_blocks(old)
    recent = seq(list(range(200, 205)), "recent")
    bm.allocate(recent, recent.num_tokens)
    computed(bm, recent)
    bm.free_blocks(recent)
    # both prefixes are still cached
    again = seq(list(range(200, 205)), "again")
    bm.allocate(again, again.num_tokens)
    assert again.num_cached_tokens == 4
    bm.free_blocks(again)
    # a sequence that needs three fresh blocks evicts the least recently freed ones first
    filler = seq(list(range(300, 312)), "filler")
    assert bm.allocate(filler, filler.num_tokens)
    bm.free_blocks(filler)
    probe_recent, probe_old = seq(list(range(200, 205)), "p1"), seq(list(range(100, 105)), "p2")
    bm.allocate(probe_recent, 5)
    bm.allocate(probe_old, 5)
    assert probe_recent.num_cached_tokens == 4
    assert probe_old.num_cached_tokens == 0


def test_prefix_caching_off():
    bm = BlockManager(16, 4, enable_prefix_caching=False)
    a = seq(list(range(9)), "a")
    bm.allocate(a, 9)
    computed(bm, a)
    b = seq(list(range(9)), "b")
    bm.allocate(b, 9)
    assert b.num_computed_tokens == 0 and not set(a.block_table) & set(b.block_table)


def test_without_the_cache_blocks_come_and_go_in_the_order_the_cache_would_give_prompts_that_share_nothing():
    """Without prefix caching the free list is a deque (blocks only leave from its front): through allocations,
    appends, frees under steps in flight and reservations, it hands out the blocks the cached manager does when no
    two prompts share a block."""
    rng = random.Random(7)
    managers = [BlockManager(64, 4, enable_prefix_caching=True), BlockManager(64, 4, enable_prefix_caching=False)]
    live: list[list[Sequence]] = [[], []]
    for step in range(400):
        op, n, remote, pick = rng.random(), rng.randrange(1, 30), rng.random() < 0.3, rng.random()
        tokens = [step * 100 + i for i in range(n)]  # no two prompts share a block
        for bm, seqs in zip(managers, live):
            bm.epoch = step // 3
            if op < 0.45:
                s = seq(tokens, str(step))
                if bm.allocate(s, n, use_cache=not remote, remote=remote):
                    computed(bm, s)
                    seqs.append(s)
            elif op < 0.6 and seqs:
                bm.append_blocks(seqs[:2])
            elif seqs:
                bm.free_blocks(seqs.pop(int(pick * len(seqs))))
            if op > 0.9:
                bm.release(step // 3 - 1)
        cached, plain = managers
        assert [s.block_table for s in live[0]] == [s.block_table for s in live[1]]
        assert cached.num_free_blocks == plain.num_free_blocks and list(cached.free) == list(plain.free)
        assert cached.fenced == plain.fenced


@pytest.mark.parametrize("caching", [True, False])
def test_double_free_is_caught(caching):
    bm = BlockManager(4, 4, enable_prefix_caching=caching)
    a = seq([1, 2], "a")
    bm.allocate(a, 2)
    table = list(a.block_table)
    bm.free_blocks(a)
    a.block_table = table
    with pytest.raises(AssertionError):
        bm.free_blocks(a)


def test_a_block_freed_under_a_step_in_flight_is_fenced_from_reservations_until_that_step_is_collected():
    """A sequence freed while its next step is on the GPU: that step may still write its last block. The engine's
    own steps may reuse it (the GPU runs them after), a reservation (a KV handoff another process writes) may not,
    until the engine has collected the step."""
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    old = Sequence("old", list(range(8)), SamplingParams())
    assert bm.allocate(old, 8)  # blocks 0 and 1
    bm.epoch = 7  # launch 7 is in flight and includes `old`
    bm.free_blocks(old)
    assert bm.num_free_blocks == 4 and sorted(bm.fenced) == [0, 1]
    wanted = Sequence("r", list(range(16)), SamplingParams())
    assert not bm.allocate(wanted, 16, use_cache=False, remote=True)  # needs all four, two are fenced
    assert wanted.block_table == []
    small = Sequence("s", list(range(8)), SamplingParams())
    assert bm.allocate(small, 8, use_cache=False, remote=True) and small.block_table == [2, 3]
    bm.free_blocks(small)  # also under launch 7
    bm.release(6)
    assert sorted(bm.fenced) == [0, 1, 2, 3]
    bm.release(7)
    assert bm.fenced == {} and bm.allocate(wanted, 16, use_cache=False, remote=True)


def test_a_block_freed_with_nothing_in_flight_is_not_fenced_and_own_steps_take_fenced_blocks():
    bm = BlockManager(num_blocks=2, block_size=4, enable_prefix_caching=False)
    a = Sequence("a", list(range(4)), SamplingParams())
    assert bm.allocate(a, 4)
    bm.epoch = 3
    bm.release(3)  # launch 3 collected: nothing in flight
    bm.free_blocks(a)
    assert bm.fenced == {}
    bm.epoch = 4
    assert bm.allocate(a := Sequence("a2", list(range(4)), SamplingParams()), 4)
    bm.free_blocks(a)
    assert bm.fenced
    b = Sequence("b", list(range(8)), SamplingParams())
    assert bm.allocate(b, 8)  # the engine's own step: fenced blocks too
    assert bm.fenced == {} and bm.num_free_blocks == 0



@pytest.mark.parametrize("caching", [True, False])
def test_clearing_the_cache_while_a_block_is_in_use_is_refused(caching):
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=caching)
    a, b = seq(list(range(12)), "a"), seq(list(range(4)), "b")
    assert bm.allocate(a, 12) and bm.allocate(b, 4)
    bm.free_blocks(a)
    with pytest.raises(AssertionError, match="in use"):
        bm.clear_cache()
    bm.free_blocks(b)
    bm.clear_cache()
    assert bm.num_free_blocks == 8 and not any(bm.ref_counts)
    assert bm.block_hash == bm.block_tokens == [None] * 8 and not bm.hash_to_block


def test_a_cleared_cache_hands_out_blocks_as_never_used_unless_one_is_fenced():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(list(range(12)), "a")
    assert bm.allocate(a, 12)
    computed(bm, a)
    bm.free_blocks(a)
    bm.clear_cache()
    b = seq(list(range(12)), "b")
    assert bm.allocate(b, 12) and b.block_table == [0, 1, 2] and b.num_computed_tokens == 0  # no hit, in id order
    assert bm.num_free_blocks == 5 and bm.free == {}
    bm.epoch = 2  # freed under a launch not yet collected: fenced, and the free order stays
    bm.free_blocks(b)
    bm.clear_cache()
    assert sorted(bm.fenced) == [0, 1, 2] and bm.num_free_blocks == 8
    c = seq(list(range(8)), "c")
    assert bm.allocate(c, 8, use_cache=False, remote=True) and set(c.block_table).isdisjoint(bm.fenced)

def test_a_blocks_tokens_are_hashed_as_eight_byte_signed_integers():
    """The bytes the keys hash: each token a signed 64-bit integer in the machine's order, as numpy lays out int64."""
    import numpy as np

    from common.prefix_hash import token_bytes
    for tokens in ([], [0], [1, 2, 3], [151_935, 7, -1, (1 << 63) - 1, -(1 << 63)], list(range(300, 316))):
        assert token_bytes(tokens) == np.asarray(tokens, dtype=np.int64).tobytes()
    assert token_bytes(np.arange(5, dtype=np.int64)) == np.arange(5, dtype=np.int64).tobytes()


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_the_routers_prefix_keys_are_the_keys_the_engine_caches_blocks_under(block_size):
    """The router places a prompt where its blocks' keys are cached (router/prefix_index.py, `block_keys`); an engine
    caches each full block under the chain hash the block manager commits. They must be the same keys, or prefix-aware
    placement looks for prompts where no engine will find them."""
    import random

    from common.prefix_hash import block_keys
    rng = random.Random(block_size)
    for length in (0, block_size - 1, block_size, 5 * block_size + 1, 37):
        tokens = [rng.randrange(1 << 31) for _ in range(length)]
        bm, s = BlockManager(64, block_size), seq(tokens)
        assert bm.allocate(s, s.num_tokens)
        computed(bm, s)
        full = len(tokens) // block_size
        committed = [bm.block_hash[b] for b in s.block_table[:full]]
        assert block_keys(tokens, block_size, full) == committed, length
        assert block_keys(tokens, block_size) == committed[:max(0, (len(tokens) - 1) // block_size)], length


def test_a_prompts_blocks_are_hashed_once_and_given_keys_not_at_all(monkeypatch):
    """A prompt is matched against the cache, then committed: its keys (`prompt_keys`) are hashed once for both,
    and a caller that gives them (the simulator, from the router's) has none hashed; the keys stay those hashing
    gives, and a block past the prompt (decoded tokens) is hashed as before."""
    from common.prefix_hash import block_keys, chain_hash_bytes
    calls = []
    monkeypatch.setattr(bm_module, "chain_hash_bytes",
                        lambda prev, block: calls.append(1) or chain_hash_bytes(prev, block))
    tokens = list(range(100, 118))  # 4 full blocks of 4 and 2 tokens
    bm, a = BlockManager(16, 4), seq(tokens, "a")
    assert bm.allocate(a, a.num_tokens)
    computed(bm, a)
    assert len(calls) == 4 and a.prompt_keys == block_keys(tokens, 4, 4)
    a.token_ids += [7, 7]  # decoded: a fifth block fills
    computed(bm, a)
    assert len(calls) == 5 and len(a.prompt_keys) == 4 and bm.block_hash[a.block_table[4]] is not None
    calls.clear()
    bm2, b = BlockManager(16, 4), seq(tokens, "b")
    b.prompt_keys = block_keys(tokens, 4, 4)
    assert bm2.allocate(b, b.num_tokens)
    computed(bm2, b)
    assert not calls and [bm2.block_hash[x] for x in b.block_table[:4]] == [bm.block_hash[x] for x in a.block_table[:4]]
