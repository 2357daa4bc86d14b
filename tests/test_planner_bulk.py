"""Steps simulated in bulk give every request the times that stepping the engine's own scheduler one step at a time
gives, behind a router that places by what it sees of each engine: a decode worker in aggregate
(scripts/planner/decode_pool.py), and fast runs of identical steps (scripts/planner/engine.py) on colocated replicas
and on decode workers that may prefill (`auto`)."""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from common.engine.sequence import Sequence
from router.prefix_index import PrefixIndex, PromptKeys
from scripts.planner.config import PlanConfig
from scripts.planner.decode_pool import DecodePool
from scripts.planner.layout import Layout
from scripts.planner.plan import workloads
from scripts.planner.profile import load_profile
from scripts.planner.sequences import TOKEN, sampling
from scripts.planner.shards import router_share
from scripts.planner.sim import Simulation
from scripts.planner.unshared_prefixes import UnsharedKeys, UnsharedPrefixes
from scripts.planner.workload import Workload
from tests.test_planner import make_profile, workload

PROFILES = Path(__file__).resolve().parent.parent / "scripts/planner/profiles"


def mixed(n: int, rate: float, seed: int, shared: bool = False) -> Workload:
    """Prompts of 20-600 tokens and answers of 1-300, some sharing a prefix."""
    rng = random.Random(seed)
    base = workload(n, rate, 1, 1, seed)
    prefix = [rng.randrange(50_000) for _ in range(64)]
    prompts = [(prefix if shared and rng.random() < 0.5 else []) + [rng.randrange(50_000)
                                                                    for _ in range(rng.randint(20, 600))]
               for _ in range(n)]
    return Workload(base.arrivals, prompts, [rng.randint(1, 300) for _ in range(n)], shared_prefixes=shared)


def run(profile, layout: Layout, load: Workload, fast_forward: bool) -> Simulation:
    sim = Simulation(profile, layout, load, fast_forward=fast_forward)
    sim.run()
    return sim


def assert_same_times(a: Simulation, b: Simulation) -> None:
    for x, y in zip(a.requests, b.requests, strict=True):
        assert (x.rid, x.refused) == (y.rid, y.refused)
        if not x.refused:
            assert (x.first, x.done) == pytest.approx((y.first, y.done), rel=1e-9, abs=1e-12), x.rid


@pytest.mark.parametrize("layout", [Layout(prefill=1, decode=1), Layout(prefill=2, decode=2),
                                    Layout(prefill=1, decode=3), Layout(prefill=3, decode=1), Layout(colocated=2),
                                    Layout(prefill=1, decode=2, policy="never")])
@pytest.mark.parametrize("seed", [1, 2])
def test_pooled_decode_workers_give_the_times_of_stepping(layout, seed):
    profile = make_profile()
    load = mixed(300, 60.0, seed, shared=seed == 2)
    pooled, stepped = run(profile, layout, load, True), run(profile, layout, load, False)
    pools = [e for e in pooled.engines.values() if e.role != "prefill"]
    assert all(isinstance(e, DecodePool) for e in pools) and sum(e.clock for e in pools) > 0  # steps in the pool
    assert not any(isinstance(e, DecodePool) for e in stepped.engines.values())
    assert_same_times(pooled, stepped)


def test_a_pool_short_of_seats_gives_the_times_of_stepping():
    """Eight seats: landed sequences wait for one to be freed, and take it the step after."""
    profile = make_profile(max_num_seqs=8)
    load = mixed(200, 40.0, 3)
    assert_same_times(run(profile, Layout(prefill=2, decode=1), load, True),
                      run(profile, Layout(prefill=2, decode=1), load, False))


@pytest.mark.parametrize("layout", [Layout(prefill=1, decode=2), Layout(colocated=2)])
def test_a_pool_short_of_blocks_hands_its_batch_to_the_scheduler_and_gives_the_times_of_stepping(layout):
    """Too few blocks for the decodes' growth: the scheduler preempts, so the pool steps until it may take its batch
    back."""
    profile = make_profile(num_kv_blocks=160)
    load = mixed(150, 40.0, 4)
    pooled = run(profile, layout, load, True)
    assert sum(e.handovers for e in pooled.engines.values() if isinstance(e, DecodePool)) > 0
    assert sum(e.scheduler.num_preemptions for e in pooled.engines.values()) > 0
    assert_same_times(pooled, run(profile, layout, load, False))


def test_a_pools_check_of_its_blocks_is_its_count_of_crossings_against_the_free_blocks():
    """`_blocks_for` answers without counting where the most crossings the steps could hold fit: the same answer."""
    pool = DecodePool("d0", "decode", make_profile(num_kv_blocks=64))
    for i, computed in enumerate([3, 16, 17, 40, 40, 95]):
        seq = Sequence(str(i), [TOKEN] * computed, sampling(500))
        seq.num_computed_tokens = computed
        seq.token_ids.append(TOKEN)
        pool._join(seq)
    bm = pool.block_manager
    for used in range(65):
        bm.unused_from = used
        for start in range(20):
            for end in range(start + 1, start + 40):
                assert pool._blocks_for(start, end) == (pool._crossings(start, end) <= bm.num_free_blocks)


def test_a_pool_that_prefills_a_prompt_itself_steps_its_chunks_beside_its_members():
    """`auto` sends some prompts to the decode worker to prefill itself: the scheduler steps their chunks (the lane)
    beside the members' decodes, which it does not walk, and the pool keeps its batch (Qwen3-8B's profile, whose
    prompts `auto` sends there)."""
    profile = load_profile(PROFILES / "h200-qwen3-8b.json")
    load = mixed(300, 30.0, 7)
    pooled = run(profile, Layout(prefill=1, decode=2, policy="auto"), load, True)
    pools = [e for e in pooled.engines.values() if isinstance(e, DecodePool)]
    assert sum(e.handovers for e in pools) == 0 and sum(e.clock for e in pools) > 0
    assert sum(e.prefill_tokens_run for e in pools) > 0 and sum(e.prompt_steps for e in pools) > 0
    assert_same_times(pooled, run(profile, Layout(prefill=1, decode=2, policy="auto"), load, False))


@pytest.mark.parametrize("layout", [Layout(colocated=2), Layout(prefill=1, decode=2, policy="never")], ids=str)
def test_prompt_chunks_beside_the_members_take_what_their_decodes_leave_of_the_token_budget(layout):
    """A token budget of 96 a step: each prompt chunk stepped in the lane gets what the members' decodes, which the
    scheduler does not walk, leave of it, as stepping gives it (chunks shrink as the batch grows)."""
    profile = make_profile(max_num_batched_tokens=96)
    load = mixed(200, 50.0, 9)
    pooled, stepped = run(profile, layout, load, True), run(profile, layout, load, False)
    pools = [e for e in pooled.engines.values() if isinstance(e, DecodePool)]
    assert sum(e.prompt_steps for e in pools) > 0 and sum(e.clock for e in pools) > 0
    assert max(len(e.scheduler.running) for e in stepped.engines.values()) <= 64
    assert_same_times(pooled, stepped)


@pytest.mark.parametrize("layout", [Layout(colocated=3), Layout(prefill=2, decode=2, policy="auto"),
                                    Layout(prefill=1, decode=2, policy="never")])
def test_fast_runs_on_several_engines_give_the_times_of_stepping(layout):
    """Each engine in a fast run is shown to the router as of its step in flight, as a stepped one is (Qwen3-8B's
    profile: its decode steps run in bulk between arrivals)."""
    profile = load_profile(PROFILES / "h200-qwen3-8b.json")
    load = mixed(300, 30.0, 6, shared=True)
    bulk, stepped = run(profile, layout, load, True), run(profile, layout, load, False)
    assert sum(e.steps for e in bulk.engines.values()) == sum(e.steps for e in stepped.engines.values())
    assert_same_times(bulk, stepped)


def test_decode_workers_and_colocated_replicas_are_pooled_and_prefill_workers_are_not():
    """Every engine that decodes is pooled between the prompts it prefills itself (`auto`, `never`, colocated), on a
    GPU of its own or one it shares; prefill workers never decode."""
    profile, load = make_profile(), mixed(20, 20.0, 5)
    for layout in (Layout(prefill=1, decode=1), Layout(prefill=1, decode=1, policy="auto"),
                   Layout(prefill=1, decode=1, policy="never"), Layout(prefill=1, decode=1, gpus_per_engine=0.5)):
        engines = run(profile, layout, load, True).engines
        assert isinstance(engines["d1"], DecodePool) and not isinstance(engines["p0"], DecodePool)
    for layout in (Layout(colocated=2), Layout(colocated=2, gpus_per_engine=0.5)):
        assert all(isinstance(e, DecodePool) for e in run(profile, layout, load, True).engines.values())


@pytest.mark.parametrize("layout", [Layout(prefill=1, decode=1, gpus_per_engine=0.5),
                                    Layout(prefill=1, decode=1, policy="auto", gpus_per_engine=0.5, mps=True),
                                    Layout(prefill=1, decode=1, policy="never", gpus_per_engine=0.5),
                                    Layout(colocated=2, gpus_per_engine=0.5, mps=True)], ids=str)
def test_pools_on_a_shared_gpu_give_the_times_of_stepping(layout):
    """On a GPU two engines share, a pool runs one step at a time (each re-timed as the other engine's steps start
    and end: scripts/planner/gpu.py), with no walk of its batch: the times of stepping the scheduler. Under MPS with
    contention by the longest prompt of a pair (the shipped H200 profile's decode)."""
    profile = load_profile(PROFILES / "h200-qwen3-0.6b.json")
    assert profile.mps["decode"].beside_by_prompt
    load = mixed(300, 60.0, 2, shared=True)
    pooled, stepped = run(profile, layout, load, True), run(profile, layout, load, False)
    assert sum(e.clock for e in pooled.engines.values() if isinstance(e, DecodePool)) > 1000
    assert_same_times(pooled, stepped)


def test_a_prompt_whose_last_chunk_is_one_token_gets_its_first_token_as_stepping_gives_it():
    """Chunked at 64, a prompt of 65 tokens computes its last one alone, in the step that gives its first token: the
    pool takes it back only after that step (it once took it as decoding, and its first token came when the pool next
    handed over)."""
    profile = make_profile()
    layout = Layout(prefill=1, decode=1, policy="never", local_prefill_chunk=64)
    base = mixed(120, 30.0, 8)
    load = dataclasses.replace(base, prompts=[p[:1] * (64 * (1 + i % 3) + 1) for i, p in enumerate(base.prompts)])
    pooled, stepped = run(profile, layout, load, True), run(profile, layout, load, False)
    assert pooled.engines["d1"].clock > 0
    assert_same_times(pooled, stepped)


def test_a_pooled_batch_steps_as_its_contexts_grow():
    """Four sequences landed together decode as one batch: each step costs the profile's decode step of the batch at
    its total context, and each finishes at the end of the step that computes its last token."""
    profile = make_profile()
    outputs = {"0": 3, "1": 5, "2": 5, "3": 9}
    pool = DecodePool("d0", "decode", profile)
    seqs = {rid: pool.reserve(rid, list(range(100 + int(rid))), out) for rid, out in outputs.items()}
    for seq in seqs.values():
        pool.land(seq, 0.0)
    computed = {rid: 100 + int(rid) for rid in outputs}
    left = {rid: out - 1 for rid, out in outputs.items()}  # steps after the first token (the prefill worker's)
    t, expected = 0.0, {}
    while left:
        t += profile.host_launch_s + profile.decode_cost(len(left)).seconds(len(left), sum(computed[r] for r in left))
        for rid in list(left):
            computed[rid] += 1
            left[rid] -= 1
            if not left[rid]:
                expected[rid] = t
                del left[rid]
    now, finished = 0.0, {}
    while (end := pool.start(now)) is not None:
        now = end
        finished.update((seq.request_id, now) for seq in pool.collect(pool.finish())[0])
    assert finished == pytest.approx(expected, rel=1e-12)
    assert {rid: seq.num_completion_tokens for rid, seq in seqs.items()} == outputs
    assert pool.free_blocks == pool.block_manager.num_blocks


@pytest.mark.parametrize("layout", [Layout(prefill=2, decode=2), Layout(prefill=2, decode=2, policy="auto"),
                                    Layout(colocated=3)])
def test_the_router_counting_keys_of_prompts_that_share_none_places_them_as_its_own_index_does(layout):
    """Prompts sharing no block: the simulated router counts each worker's keys (UnsharedPrefixes, of UnsharedKeys:
    none hashed) where its own prefix index keeps them (of the prompts' keys). Its caches fill past their capacity
    here, so ties break on full and filling ones."""
    profile = make_profile(num_kv_blocks=300)
    load = mixed(300, 80.0, 3)
    counted = Simulation(profile, layout, load)
    bs = profile.block_size
    hashed = dataclasses.replace(load, keys={bs: [PromptKeys.of(p, bs) for p in load.prompts]})
    kept = Simulation(profile, layout, hashed)
    kept.placement.prefixes = PrefixIndex()
    assert isinstance(next(iter(run_sim(counted).placement.prefixes.workers.values())), UnsharedPrefixes)
    assert all(type(k) is UnsharedKeys and not k.keys for k in load.keys[bs])  # none hashed: only counted
    assert [(k.count, k.reusable) for k in load.keys[bs]] == [(len(k.keys), k.reusable) for k in hashed.keys[bs]]
    run_sim(kept)
    held = {w: len(p) for w, p in kept.placement.prefixes.workers.items()}
    assert held == {w: len(p) for w, p in counted.placement.prefixes.workers.items()}
    assert 300 in held.values()  # a cache at its capacity
    assert_same_times(counted, kept)


def run_sim(sim: Simulation) -> Simulation:
    sim.run()
    return sim


def test_a_decode_worker_takes_back_sequences_recomputed_after_a_preemption_with_the_blocks_they_hold():
    """7P:1D's shard of a 128-GPU long-short plan at 3,700 req/s: its one decode worker preempts, recomputes, and
    takes its batch back with sequences whose tables already hold the block of their next token. The pool counted
    a block for each of those by the step modulo the block size, and ran out of blocks (found at stop 40)."""
    cfg = PlanConfig(profile="p.json", gpus=128, rates="1500,2200,3000,3700", workload="long-short",
                     num_requests=4000)
    rate, load = workloads(cfg)[3]
    shard = router_share(load, rate, 0.0625)
    profile, layout = load_profile(PROFILES / "h200-qwen3-8b.json"), Layout(prefill=7, decode=1, transport="nccl")
    pooled = run(profile, layout, shard, True)
    pools = [e for e in pooled.engines.values() if isinstance(e, DecodePool)]
    assert sum(e.handovers for e in pools) > 0 and sum(e.scheduler.num_preemptions for e in pools) > 0
    assert_same_times(pooled, run(profile, layout, shard, False))
