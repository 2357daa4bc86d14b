"""Per-request disaggregation (router/disagg_policy.py): what `auto` learns from heartbeats and first tokens and
what it then chooses; through the router with fake workers, and on a CPU cluster whose decode worker prefills
prompts itself."""
from __future__ import annotations

import asyncio

import pytest

from common import protocol as P
from common.engine.llm import LLM
from common.sampling_params import SamplingParams
from router.disagg_policy import BURST_S, TPOT_CEILING, TPOT_GUARD, DisaggPolicy, Estimate, LocalWork
from tests.cluster_harness import RunningCluster
from tests.test_router import FakeWorker, Sim, make_router  # noqa: F401 (a fixture)


def load(steps: int, seconds: float, prefill: int = 0, decode: int = 0, prompt_steps: int = 0,
         prompt_seconds: float = 0.0, prompt_batches: int = 0) -> P.WorkerLoad:
    return P.WorkerLoad(queued_requests=0, queued_tokens=0, running_requests=0, kv_blocks_total=64,
                        kv_blocks_free=64, busy_steps=steps, busy_seconds=seconds, prefill_tokens_run=prefill,
                        decode_tokens_run=decode, prompt_steps=prompt_steps, prompt_seconds=prompt_seconds,
                        prompt_batches=prompt_batches)


def with_chunks(p: DisaggPolicy, decode_step: float, chunk_cost: float, chunks: int = 10, steps: int = 200,
                steps_per_chunk: int = 1) -> DisaggPolicy:
    """A decode worker's heartbeat: `steps` steps of `decode_step` seconds, `chunks` of them also running a prompt
    chunk that costs `chunk_cost` more (with overlap a chunk's cost spreads over the two steps that launch and
    collect it: `steps_per_chunk` 2)."""
    prompt_steps = chunks * steps_per_chunk
    prompt_seconds = prompt_steps * decode_step + chunks * chunk_cost
    seconds = (steps - prompt_steps) * decode_step + prompt_seconds
    p.observe_load("decode", load(0, 0.0), load(steps, seconds, prompt_steps=prompt_steps,
                                                 prompt_seconds=prompt_seconds, prompt_batches=chunks))
    return p


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def measured(policy: str = "auto", clock: Clock | None = None) -> DisaggPolicy:
    """Prefill at 10,000 tokens/s, decode steps of 20 ms, handoffs 100 ms past the prefill; chunks not yet run."""
    p = DisaggPolicy(policy, local_prefill_chunk=256, clock=clock or Clock())
    p.observe_load("prefill", load(0, 0.0), load(10, 1.0, prefill=10_000))
    p.observe_load("decode", load(0, 0.0), load(50, 1.0, decode=400))
    p.observe_first_token(Estimate(False, 1000, None, None), 0.2)
    return p


def here(tokens: int, decodes: int = 0, own: int | None = None, worker: str = "d0") -> LocalWork:
    """The decode worker's side: `tokens` before this prompt's first token, `own` of them this prompt's."""
    return LocalWork(worker, tokens, tokens if own is None else own, decodes)


def test_auto_learns_rates_from_heartbeats_and_handoffs_from_first_tokens():
    p = DisaggPolicy("auto", 256)
    assert not p.measured and p.choose(100, here(10)).local is False  # nothing measured: the usual path
    p = measured()
    assert p.prefill_rate == pytest.approx(10_000) and p.decode_step == pytest.approx(0.02)
    assert p.handoff == pytest.approx(0.1)
    p.observe_load("prefill", load(10, 1.0, prefill=10_000), load(10, 1.0, prefill=10_000))  # idle: nothing learnt
    assert p.prefill_rate == pytest.approx(10_000)
    p.observe_first_token(Estimate(True, 1000, None, None), 9.0)  # a local prefill says nothing of handoffs
    assert p.handoff == pytest.approx(0.1)


def test_auto_prefills_short_or_cached_prompts_locally_and_long_ones_remotely():
    p = measured()
    short = p.choose(remote_tokens=100, local=here(100))  # 1 chunk (a step and its cost) vs 10 ms + the handoff
    assert short.local and short.local_seconds < short.remote_seconds == pytest.approx(0.11)
    long = p.choose(remote_tokens=4000, local=here(4000))  # 16 chunks: slower than a handoff
    assert not long.local and long.prefill_tokens == 4000 and long.local_seconds > long.remote_seconds
    assert p.choose(remote_tokens=4000, local=here(64)).local  # the decode worker holds the prefix
    assert p.choose(remote_tokens=20_000, local=here(1500)).local  # a long prefill queue
    assert (p.local_choices, p.remote_choices) == (3, 1)


@pytest.mark.parametrize("steps_per_chunk", [1, 2], ids=["no-overlap", "overlap"])
def test_auto_measures_what_a_chunk_adds_to_the_decode_workers_steps(steps_per_chunk):
    """The decode-only step and a chunk's cost come from the decode worker's own prompt steps, whether a chunk's
    cost falls in one step or spreads over two; not from the prefill workers' rate."""
    p = with_chunks(measured(), decode_step=0.004, chunk_cost=0.03, steps_per_chunk=steps_per_chunk)
    assert p.chunk_cost == pytest.approx(0.03)
    assert p.decode_step < 0.02 and p.recent_step > p.decode_step  # the mix moves towards the new figures


def test_a_chunk_measured_dear_sends_even_an_idle_decode_workers_prompts_remote():
    cheap = with_chunks(measured(), decode_step=0.02, chunk_cost=0.01, steps=2000)
    dear = with_chunks(measured(), decode_step=0.02, chunk_cost=0.2, steps=2000)  # e.g. a whole batch run eagerly
    assert cheap.choose(remote_tokens=100, local=here(100)).local
    assert not dear.choose(remote_tokens=100, local=here(100)).local


def test_local_chunks_beside_running_decodes_spend_the_decode_workers_budget():
    clock = Clock()
    p = with_chunks(measured(clock=clock), decode_step=0.02, chunk_cost=0.01, steps=2000)
    burst = [p.choose(remote_tokens=100, local=here(100, decodes=4)).local for _ in range(10)]
    n = burst.index(False)  # BURST_S of the guard's share of time, 10 ms a chunk
    assert n == pytest.approx((1 - 1 / TPOT_GUARD) * BURST_S / 0.01, abs=1) and not any(burst[n:])
    assert p.choose(remote_tokens=100, local=here(100, decodes=0)).local  # no decode to slow: free
    assert p.choose(remote_tokens=100, local=here(100, decodes=4, worker="d1")).local  # its own budget
    clock.now += 1.05 * 0.01 / (1 - 1 / TPOT_GUARD)  # time for one more chunk (less than one was left)
    assert p.choose(remote_tokens=100, local=here(100, decodes=4)).local
    assert not p.choose(remote_tokens=100, local=here(100, decodes=4)).local
    clock.now += 60  # saved up, to a bound
    assert sum(p.choose(remote_tokens=100, local=here(100, decodes=4)).local for _ in range(10)) == n


def test_a_prompt_whose_chunks_exceed_the_budget_goes_remote_where_decodes_run():
    p = with_chunks(measured(), decode_step=0.02, chunk_cost=0.02, steps=2000)
    work = here(1000, own=1000)  # 4 chunks of 20 ms each delay every decode there
    assert not p.choose(remote_tokens=20_000, local=LocalWork("d0", 1000, 1000, decodes=3)).local
    assert p.choose(remote_tokens=20_000, local=work).local  # an idle decode worker: the queue decides


def test_auto_stops_adding_chunks_once_the_decode_workers_steps_exceed_the_tpot_guard():
    p = with_chunks(measured(), decode_step=0.02, chunk_cost=0.01, steps=2000)
    assert p.choose(remote_tokens=100, local=here(100, decodes=2)).local
    for _ in range(20):  # then chunks in most steps: the decodes' steps grow well past the decode-only step
        with_chunks(p, decode_step=0.02, chunk_cost=0.01, steps=100, chunks=90)
    assert p.recent_step > TPOT_GUARD * p.decode_step and p.chunk_cost == pytest.approx(0.01)
    assert not p.choose(remote_tokens=100, local=here(100, decodes=2)).local
    assert p.choose(remote_tokens=100, local=here(100)).local  # no decode to slow


def test_under_a_load_that_already_slows_decoding_past_the_ceiling_auto_is_always():
    p = measured()
    for _ in range(20):  # a light load: steps of 10 ms
        with_chunks(p, decode_step=0.01, chunk_cost=0.002, steps=2000)
    assert p.unloaded_step == pytest.approx(0.01)
    assert p.choose(remote_tokens=100, local=here(100, decodes=2)).local
    for _ in range(20):  # more decodes, bigger batches: steps of 15 ms, no chunk among them
        p.observe_load("decode", load(0, 0.0), load(100, 1.5))
    assert p.recent_step > TPOT_CEILING * p.unloaded_step and p.recent_step < TPOT_GUARD * p.decode_step
    assert not p.choose(remote_tokens=100, local=here(100, decodes=30)).local
    assert p.choose(remote_tokens=100, local=here(100)).local  # where no decode runs, still


def test_always_and_never_do_not_ask_the_measurements():
    assert not DisaggPolicy("always").choose(10, here(10)).local
    assert measured("never").choose(10**6, here(10**6, decodes=50)).local
    assert DisaggPolicy("auto").choose(-1, here(10)).local  # no prefill worker to take it
    with pytest.raises(ValueError, match="disagg_policy"):
        DisaggPolicy("sometimes")


def test_never_prefills_on_the_decode_workers_and_loses_nothing(make_router):  # noqa: F811
    async def main():
        workers = [FakeWorker("p0", "prefill"), FakeWorker("d0", "decode"), FakeWorker("d1", "decode")]
        sim = await Sim(make_router(disagg_policy="never"), *workers).start()
        for i in range(6):
            await sim.submit(f"r{i}", max_tokens=3, stream=i % 2 == 0)
        await sim.drain()
        sim.check_clean()
        sent = [(w, type(m)) for w, m in sim.sent]
        assert not [w for w, kind in sent if kind in (P.Reserve, P.PrefillTask)]
        assert {w for w, kind in sent if kind is P.GenerateTask} == {"d0", "d1"}
        totals = sim.router.stats().totals
        assert (totals.local_prefills, totals.remote_prefills) == (6, 0)

    asyncio.run(main())


def test_decode_workers_that_prefill_get_the_prompts_whose_prefix_they_hold(make_router):  # noqa: F811
    async def main():
        workers = [FakeWorker("p0", "prefill"), FakeWorker("d0", "decode"), FakeWorker("d1", "decode")]
        sim = await Sim(make_router(disagg_policy="never"), *workers).start()
        systems = [[11] * 48, [22] * 48]
        for i in range(6):
            await sim.submit(f"r{i}", token_ids=systems[i % 2] + [100 + i, 101 + i], max_tokens=2)
            await sim.drain()
        sim.check_clean()
        by_worker: dict[str, set] = {}
        for w, m in sim.sent:
            if isinstance(m, P.GenerateTask):
                by_worker.setdefault(w, set()).add(tuple(m.token_ids[:48]))
        assert sorted(map(len, by_worker.values())) == [1, 1], by_worker  # each decode worker one system prompt

    asyncio.run(main())


PROMPTS = [[5 + (i * 7 + j) % 250 for j in range(20 + 37 * i)] for i in range(4)]  # up to 131 tokens


@pytest.mark.parametrize("policy", ["never", "auto"])
def test_a_decode_worker_prefilling_in_small_chunks_answers_as_the_offline_engine(tiny_qwen3_dir, tmp_path, policy):
    """--disagg-policy never with --local-prefill-chunk 16: every prompt prefilled by the decode worker, in chunks
    between its decode steps, greedy output equal to offline generation. auto: whatever it picks per request (two
    rounds: the second after it has measured), the same output."""
    greedy = dict(max_tokens=8, temperature=0.0, ignore_eos=True)
    llm = LLM(str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20)
    try:
        expected = [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(**greedy), use_tqdm=False)]
    finally:
        llm.close()
    cluster = RunningCluster(tiny_qwen3_dir, "disagg", tmp_path / "serve.log", "--disagg-policy", policy,
                             "--local-prefill-chunk", "16")
    try:
        async def go():
            from router.client import AsyncClient
            async with AsyncClient(cluster.address, timeout=120) as c:
                return await asyncio.gather(*(c.generate(p, **greedy) for p in PROMPTS))

        rounds = 2 if policy == "auto" else 1
        for _ in range(rounds):
            results = asyncio.run(go())
            assert [r.token_ids for r in results] == expected
        with cluster.client() as c:
            totals = c.stats(timeout=10).totals
        assert totals.local_prefills + totals.remote_prefills == rounds * len(PROMPTS)
        if policy == "never":
            assert totals.remote_prefills == 0
        assert all(w.kv_blocks_free == w.kv_blocks_total for w in cluster.wait_all_blocks_free())
    finally:
        cluster.stop_cleanly()
