"""Prefix-aware placement (router/placement.py, router/prefix_index.py): the router's block keys are the engine's,
the cost is uncached prompt tokens plus the work waiting, the index stays within its bound, and through the
router with fake workers requests sharing a prefix go where it is cached."""
from __future__ import annotations

import asyncio
import random

import pytest

from common import protocol as P
from common.engine.block_manager import BlockManager
from common.engine.sequence import Sequence
from common.sampling_params import SamplingParams
from router.placement import Placement
from router.prefix_index import PrefixIndex, PromptKeys
from router.registry import WorkerRegistry
from tests.test_router import BLOCK, FakeWorker, Sim, hello, make_router  # noqa: F401 (a fixture)


def registry(*workers: tuple[str, str], num_blocks: int = 64) -> WorkerRegistry:
    reg = WorkerRegistry()
    for worker_id, role in workers:
        reg.register(hello(FakeWorker(worker_id, role, num_blocks)), worker_id.encode())
    return reg


def test_the_routers_keys_are_the_engines():
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(1, 15))  # 3 full blocks and 2 tokens
    seq = Sequence("a", prompt, SamplingParams())
    assert bm.allocate(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit(seq, 0)
    keys = PromptKeys.of(prompt, 4)
    assert set(keys.keys) == set(bm.hash_to_block) and len(keys.keys) == 3
    assert keys.reusable == 3
    assert PromptKeys.of(prompt[:12], 4).reusable == 2  # the last token is recomputed: a full hit keeps one back
    other = Sequence("b", prompt[:13] + [99], SamplingParams())
    assert bm.allocate(other, other.num_tokens) and other.num_cached_tokens == 12
    index = PrefixIndex()
    index.sent("w", 16, keys)
    assert index.cached_tokens("w", PromptKeys.of(prompt[:13] + [99], 4)) == 12
    assert index.cached_tokens("w", PromptKeys.of([0] + prompt[1:], 4)) == 0  # a chain: the first block differs
    assert index.cached_tokens("other", keys) == 0


def test_the_index_forgets_least_recently_sent_first_within_the_workers_block_count():
    index = PrefixIndex()
    a, b = PromptKeys.of(list(range(33)), 4), PromptKeys.of(list(range(100, 133)), 4)  # 8 blocks each
    index.sent("w", 12, a)
    index.sent("w", 12, b)
    assert len(index.workers["w"].keys) == 12
    assert index.cached_tokens("w", b) == 32 and index.cached_tokens("w", a) == 0  # a's head went first
    index.sent("w", 12, a)
    assert index.cached_tokens("w", a) == 32
    index.sent("w", 4, b)  # the worker is back with a smaller pool: the least recently sent go
    assert index.held("w") == len(index.workers["w"]) == 4 and list(index.workers["w"].keys) == b.keys[4:]
    index.forget("w")
    assert index.cached_tokens("w", a) == 0


def test_a_sent_prompts_keys_become_the_most_recent_in_its_order():
    """Keys held already move last with the prompt's new ones, in the prompt's order: the least recently sent go
    first."""
    index = PrefixIndex()
    a, b = PromptKeys.of(list(range(33)), 4), PromptKeys.of(list(range(100, 133)), 4)
    c = PromptKeys.of(list(range(16)) + list(range(200, 217)), 4)  # a's first four blocks, then its own
    for prompt in (a, b, c):
        index.sent("w", 100, prompt)
    assert c.keys[:4] == a.keys[:4]
    assert list(index.workers["w"].keys) == a.keys[4:] + b.keys + c.keys


def test_the_cost_is_uncached_tokens_plus_the_work_waiting():
    reg = registry(("p0", "prefill"), ("p1", "prefill"))
    p0, p1 = reg.workers["p0"], reg.workers["p1"]
    placement = Placement(reg)
    shared = [7] * 64
    prompt = placement.keys(shared + [1, 2, 3])
    placement.placed(p1, placement.keys(shared + [4, 5]))
    assert placement.cached_tokens(p1, prompt) == 64 and placement.cached_tokens(p0, prompt) == 0
    assert placement.cost(p0, 67, prompt) == 67 and placement.cost(p1, 67, prompt) == 3
    assert placement.prefill(67, prompt) is p1
    p1.prefill_tokens = 60  # work waiting there: still cheaper than prefilling all of it
    assert placement.prefill(67, prompt) is p1
    p1.load = P.WorkerLoad(queued_requests=1, queued_tokens=40, running_requests=0, kv_blocks_total=64,
                           kv_blocks_free=64)
    assert placement.cost(p1, 67, prompt) == 63  # the heartbeat's queue and the router's count overlap: the larger
    p1.load = P.WorkerLoad(queued_requests=2, queued_tokens=70, running_requests=0, kv_blocks_total=64,
                           kv_blocks_free=64)
    assert placement.cost(p1, 67, prompt) == 73 and placement.prefill(67, prompt) is p0  # now it is not
    by_load = Placement(reg, policy="load")
    by_load.placed(p1, prompt)
    p1.prefill_tokens, p1.load = 1, p0.load
    assert by_load.cached_tokens(p1, prompt) == 0 and by_load.prefill(67, prompt) is p0  # the cache is ignored


def test_new_prefixes_spread_over_the_caches():
    """Idle workers, prefixes none holds: each goes to the emptier cache, so together they hold them all."""
    reg = registry(("p0", "prefill"), ("p1", "prefill"), ("p2", "prefill"))
    placement = Placement(reg)
    chosen = []
    for i in range(6):
        prompt = placement.keys([i + 1] * 64)
        worker = placement.prefill(64, prompt)
        placement.placed(worker, prompt)
        chosen.append(worker.worker_id)
    assert sorted(chosen) == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert placement.prefill(64, placement.keys([1] * 64)).worker_id == chosen[0]  # and each stays put


def test_colocated_ties_go_to_the_replica_running_fewer():
    reg = registry(("c0", "colocated"), ("c1", "colocated"))
    c0, c1 = reg.workers["c0"], reg.workers["c1"]
    placement = Placement(reg)
    prompt = placement.keys([3] * 40)
    c0.load = P.WorkerLoad(queued_requests=0, queued_tokens=0, running_requests=5, kv_blocks_total=64,
                           kv_blocks_free=64)
    assert placement.colocated(40, prompt) is c1
    placement.placed(c0, prompt)
    assert placement.colocated(40, prompt) is c0  # 32 cached tokens outweigh the running requests


@pytest.mark.parametrize("policy", ["prefix", "load"])
def test_each_choice_is_the_least_by_its_definition_over_many_random_states(policy):
    """prefill, decode and colocated pick the first worker (in registry order) least by the keys their docstrings
    give, over `cost` and the blocks each cache is reckoned to hold; states drawn at random, ties plentiful."""
    rng = random.Random(7)
    reg = registry(*[(f"p{i}", "prefill") for i in range(6)], *[(f"d{i}", "decode") for i in range(6)],
                   *[(f"c{i}", "colocated") for i in range(6)], num_blocks=256)
    placement = Placement(reg, policy=policy)
    prompts = [[rng.randrange(3)] * 32 + [rng.randrange(50) for _ in range(rng.choice([0, 20, 40]))]
               for _ in range(12)]
    held = (lambda w: len(placement.prefixes.workers[w.worker_id].keys)
            if w.worker_id in placement.prefixes.workers and policy == "prefix" else 0)
    for _ in range(200):
        w = rng.choice(list(reg.workers.values()))
        placement.placed(w, placement.keys(rng.choice(prompts)))
        w.prefill_tokens = rng.choice([0, 0, 16, 40])
        w.assigned = {str(i) for i in range(rng.choice([0, 0, 1, reg.max_requests]))}
        w.load = P.WorkerLoad(queued_requests=0, queued_tokens=rng.choice([0, 0, 32]),
                              running_requests=rng.choice([0, 1]), kv_blocks_total=256,
                              kv_blocks_free=rng.choice([8, 200, 256]))
        ids = rng.choice(prompts)
        keys, n = placement.keys(ids), len(ids)
        cost = lambda w: placement.cost(w, n, keys)  # noqa: E731
        room = {role: reg.with_room(role) for role in ("prefill", "decode", "colocated")}
        fits = [w for w in room["decode"] if w.free_blocks >= 3]
        assert placement.prefill(n, keys) is min(room["prefill"], key=lambda w: (cost(w), held(w)), default=None)
        assert placement.decode(3, n, keys) is min(fits, key=lambda w: (cost(w), held(w), -w.free_blocks),
                                                   default=None)
        assert placement.colocated(n, keys) is min(room["colocated"], default=None,
                                                   key=lambda w: (cost(w), w.load.running_requests, held(w)))


def shared_prefix_prompts(n: int, prefix: list[int]) -> list[list[int]]:
    return [prefix + [200 + i, 201 + i, 202 + i] for i in range(n)]


async def place_all(sim: Sim, prompts: list[list[int]], concurrent: bool) -> None:
    """Submits the prompts (one at a time, or all at once) and drains."""
    for ids in prompts:
        await sim.submit(f"r{len(sim.submitted)}", token_ids=ids, max_tokens=2)
        if not concurrent:
            await sim.drain()
    await sim.drain()
    sim.check_clean()


def prefilled_on(sim: Sim) -> dict[str, list[int]]:
    """Per worker, the prompts it was sent to prefill (a PrefillTask, or a GenerateTask when colocated)."""
    out: dict[str, list] = {}
    for worker_id, msg in sim.sent:
        if isinstance(msg, (P.PrefillTask, P.GenerateTask)):
            out.setdefault(worker_id, []).append(msg.token_ids)
    return out


def test_requests_sharing_a_prefix_go_where_it_is_cached(make_router):  # noqa: F811
    async def main(mode: str):
        if mode == "colocated":
            workers = [FakeWorker("c0", "colocated"), FakeWorker("c1", "colocated")]
        else:
            workers = [FakeWorker("p0", "prefill"), FakeWorker("p1", "prefill"), FakeWorker("d0", "decode")]
        sim = await Sim(make_router(mode=mode), *workers).start()
        a, b = [11] * (3 * BLOCK), [22] * (3 * BLOCK)
        prompts = [p for pair in zip(shared_prefix_prompts(4, a), shared_prefix_prompts(4, b)) for p in pair]
        await place_all(sim, prompts[:2], concurrent=True)  # one of each prefix, at once: one each
        await place_all(sim, prompts[2:], concurrent=False)  # the rest follow their prefix
        placed = prefilled_on(sim)
        assert len(placed) == 2
        for ids in placed.values():
            assert len({tuple(p[:3 * BLOCK]) for p in ids}) == 1, "each worker prefilled one prefix only"
        totals = sim.router.stats().totals
        assert totals.prompt_tokens == sum(map(len, prompts))

    asyncio.run(main("disagg"))
    asyncio.run(main("colocated"))


def test_each_pairs_kv_transport_is_logged_on_its_first_use(caplog: pytest.LogCaptureFixture) -> None:
    """The fast path silently not taken: a pair that falls back to the host transport still works, so the pick is
    logged, once a pair, where an operator sees it."""
    reg = registry(("p0", "prefill"), ("d0", "decode"), ("d1", "decode"))
    placement = Placement(reg)
    p0, d0, d1 = (reg.workers[w] for w in ("p0", "d0", "d1"))
    with caplog.at_level("INFO", logger="router.placement"):
        assert placement.transport(p0, d0) == "host" and placement.transport(p0, d0) == "host"
        assert placement.transport(p0, d1) == "host"
    picks = [r.getMessage() for r in caplog.records if r.getMessage().startswith("KV transport")]
    assert [m.split(" (")[0] for m in picks] == ["KV transport p0 -> d0: host", "KV transport p0 -> d1: host"]
