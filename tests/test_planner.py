"""The planner on the CPU: cost profiles, the simulator on cases whose answers are known (a single queue against
queueing theory, a fixed batch's step times, an unloaded request), the recommendation where the answer is obvious,
and `pdcluster plan` end to end."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from common.engine.scheduler import ScheduledBatch
from common.engine.sequence import Sequence
from common.sampling_params import SamplingParams
from common.engine.launch_clock import LEAD_PREP_FACTOR, LEAD_STEP_SHARE
from scripts.bench_workloads import LengthRange, poisson_arrivals, shared_prefix_mix
from scripts.planner.block_pool import BlockPool
from scripts.planner.decode_pool import DecodePool
from scripts.planner.engine import SimEngine
from scripts.planner.config import SLO, PlanConfig
from scripts.planner.plan import run_plan
from scripts.planner.profile import (DecodeCost, HandoffCost, PrefillCost, Profile, ProfileError, load_profile,
                                     save_profile)
from scripts.planner.report import recommend, score, summarize
from scripts.planner.layout import Layout
from scripts.planner.sequences import TOKEN, sampling, sequence
from scripts.planner.sim import Simulation, simulate
from scripts.planner.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "scripts" / "planner" / "profiles" / "example-h200-qwen3-8b.json"


def make_profile(**overrides) -> Profile:
    fields = dict(machine="test", model="test", block_size=16, num_kv_blocks=4096, kv_bytes_per_token=1000,
                  max_num_batched_tokens=4096, max_num_seqs=64, host_launch_s=0.001,
                  prefill=PrefillCost(base_s=0.01, per_token_s=1e-4, per_token_context_s=1e-8),
                  decode=DecodeCost(base_s=0.005, per_seq_s=1e-4, per_seq_context_s=1e-7),
                  handoff={"host": HandoffCost(base_s=0.002, bytes_per_s=1e8)})
    fields.update(overrides)
    profile = Profile(**fields)
    profile.check()
    return profile


def workload(n: int, rate: float, input_len: int, output_len: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(50_000) for _ in range(input_len)] for _ in range(n)]
    return Workload(poisson_arrivals(rng, n, rate), prompts, [output_len] * n, shared_prefixes=False)


# ---- profiles -----------------------------------------------------------------------------------
def test_the_example_profile_loads_and_says_it_is_an_example(tmp_path):
    profile = load_profile(EXAMPLE)
    assert "EXAMPLE" in profile.machine and "not a measurement" in profile.note
    save_profile(profile, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == profile


@pytest.mark.parametrize("change, message", [
    (lambda d: d["decode"].update(base_s=-1), "decode.base_s"),
    (lambda d: d.update(handoff={}), "handoff"),
    (lambda d: d.update(num_kv_blocks=0), "num_kv_blocks"),
    (lambda d: d.update(mixed_step_s=-0.01), "mixed_step_s"),
    (lambda d: d.update(surprise=1), "surprise"),
    (lambda d: d.pop("prefill"), "prefill"),
    (lambda d: d.update(prefill_graph_max_tokens=-1), "prefill_graph_max_tokens"),
    (lambda d: d.update(prefill_eager={"base_s": -1.0, "per_token_s": 0.0}), "prefill_eager.base_s"),
    (lambda d: d.update(decode_skinny_max_batch=-1), "decode_skinny_max_batch"),
    (lambda d: d.update(decode_skinny={"base_s": 0.0, "per_seq_s": -1.0}), "decode_skinny.per_seq_s"),
    (lambda d: d.update(sustained_prefill_factor=0.9), "sustained_prefill_factor"),
    (lambda d: d["prefill"].update(min_tokens=-1), "prefill.min_tokens"),
])
def test_a_bad_profile_is_refused_naming_the_field(tmp_path, change, message):
    data = json.loads(EXAMPLE.read_text())
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=message):
        load_profile(path)


def test_a_profile_costs_as_its_formulas_say():
    p = make_profile()
    assert p.prefill.seconds(100, 50) == pytest.approx(0.01 + 100e-4 + 100 * 50 * 1e-8)
    assert p.decode.seconds(4, 4 * 200) == pytest.approx(0.005 + 4e-4 + 800e-7)
    assert p.handoff_seconds(100) == pytest.approx(0.002 + 100 * 1000 / 1e8)
    assert p.prefill.seconds(0) == p.decode.seconds(0, 0) == 0.0


def test_a_profile_on_slower_gpus_slows_every_gpu_step_and_nothing_else():
    """`Profile.slower`: prompt, decode and mixed steps take `share` more; the host's part of a step (its launch,
    the eager prompt line's launch floor) and the KV handoffs do not."""
    p = make_profile(prefill_graph_max_tokens=1024, mixed_step_s=0.002,
                     prefill_eager=PrefillCost(base_s=0.02, per_token_s=2e-4, per_token_context_s=1e-8),
                     decode_skinny_max_batch=2, decode_skinny=DecodeCost(base_s=0.003, per_seq_s=1e-3))
    slow, host = p.slower(0.1), p.host_launch_s
    for tokens in (100, 2048):  # a graphed prompt step, an eager one
        (seconds, floor), (slow_seconds, slow_floor) = p.prompt_step(tokens), slow.prompt_step(tokens)
        assert slow_seconds - slow_floor == pytest.approx(1.1 * (seconds - floor)) and slow_floor == floor
    assert p.prompt_step(100)[1] == host and p.prompt_step(2048)[1] == host + 0.02
    for batch in (1, 8):  # the skinny line, the other
        assert slow.decode_cost(batch).seconds(batch, 500 * batch) == pytest.approx(
            1.1 * p.decode_cost(batch).seconds(batch, 500 * batch))
    assert slow.mixed_step_s == pytest.approx(0.0022)
    assert (slow.host_launch_s, slow.launch_prep_s, slow.handoff) == (p.host_launch_s, p.launch_prep_s, p.handoff)
    assert p.slower(0.0) == p and p.prompt_step(100) == make_profile(
        prefill_graph_max_tokens=1024).prompt_step(100)  # the profile itself unchanged


def test_a_prompt_steps_attention_grows_with_each_chunks_own_square():
    """A chunk's attention over its own tokens grows as their square: four prompts of 1,024 tokens in one step cost
    less than one prompt of 4,096, by the pairs they do not have; a chunk after 1,000 computed tokens also pays
    for those. A profile fitted before the term (0) costs both alike."""
    pairs = PrefillCost(base_s=0.01, per_token_s=1e-5, per_token_context_s=2e-10, per_chunk_pair_s=4e-10)
    engine = SimEngine("p0", "prefill", make_profile(prefill=pairs))

    def step(*chunks: tuple[int, int]) -> ScheduledBatch:
        seqs = []
        for i, (n, computed) in enumerate(chunks):
            seqs.append(Sequence(f"r{i}", [2] * (computed + n), SamplingParams()))
            seqs[-1].num_computed_tokens = computed
        return ScheduledBatch(seqs, [n for n, _ in chunks])
    one, four = step((4096, 0)), step(*[(1024, 0)] * 4)
    assert engine.step_seconds(one) - engine.step_seconds(four) == pytest.approx(4e-10 * (4096**2 - 4 * 1024**2) / 2)
    assert engine.step_seconds(step((1024, 1000))) - engine.step_seconds(step((1024, 0))) == pytest.approx(
        2e-10 * 1024 * 1000)
    assert pairs.seconds(4096) == pytest.approx(0.01 + 4096e-5 + 4e-10 * 4096**2 / 2)
    before = SimEngine("p0", "prefill", make_profile(prefill=PrefillCost(base_s=0.01, per_token_s=1e-5)))
    assert before.step_seconds(one) == pytest.approx(before.step_seconds(four))


# ---- the simulator against known answers --------------------------------------------------------
def test_a_single_queue_waits_as_pollaczek_khinchine_says():
    """One replica serving one request at a time, each a single prefill step of a fixed length (M/D/1): the
    mean wait is rho * S / (2 (1 - rho))."""
    profile = make_profile(max_num_seqs=1)
    input_len, rho, n = 256, 0.7, 20_000
    service = profile.host_launch_s + profile.prefill.seconds(input_len, 0)
    load = workload(n, rho / service, input_len, output_len=1, seed=1)
    requests = simulate(profile, Layout(colocated=1), load)
    waits = [r.ttft - service for r in requests]
    assert min(waits) == pytest.approx(0.0, abs=1e-9)
    expected = rho * service / (2 * (1 - rho))
    assert sum(waits) / n == pytest.approx(expected, rel=0.1)


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_fixed_batch_finishes_when_its_decode_steps_add_up(fast_forward):
    """B handed-off requests decode together to the end: their last token comes after the sum of the profile's
    step times, contexts growing one token a step (stepping one by one and in bulk agree)."""
    profile = make_profile()
    batch, prompt, output = 8, 100, 50
    engine = (DecodePool if fast_forward else SimEngine)("d0", "decode", profile)
    for i in range(batch):
        seq = engine.reserve(str(i), list(range(i * 1000, i * 1000 + prompt)), output)
        engine.land(seq)
    now, steps = 0.0, 0
    while (end := engine.start(now)) is not None:
        now = end
        seqs, _ = engine.collect(engine.finish())
    steps = output - 1  # the first token came with the handoff
    expected = sum(profile.host_launch_s + profile.decode.seconds(batch, batch * (prompt + i)) for i in range(steps))
    assert now == pytest.approx(expected, rel=1e-12)
    assert engine.steps == steps and not engine.scheduler.has_unfinished()
    assert engine.free_blocks == profile.num_kv_blocks


def test_a_prompt_whose_last_chunk_is_one_token_is_handed_off_once():
    """A prefill worker's step of one-token chunks looks decode-only; it is the prompts' last step, not the first
    of a run of decodes (a 32-GPU plan handed such a prompt off once a step, and the decode worker took it thrice)."""
    budget = 256
    profile = make_profile(max_num_batched_tokens=budget)
    engine = SimEngine("p0", "prefill", profile)
    engine.scheduler.add(Sequence("0", list(range(budget + 1)), SamplingParams(max_tokens=50), prefill_only=True))
    handed_off, now, batches = [], 0.0, []
    while (end := engine.start(now)) is not None:
        batches.append(list(engine.batch.num_new_tokens))
        now = end
        seqs, _ = engine.collect(engine.finish())
        handed_off += [s.request_id for s in seqs if s.prefill_only]
    assert batches == [[budget], [1]]  # the second step looks decode-only
    assert handed_off == ["0"] and engine.steps == 2


def test_an_unloaded_request_takes_prefill_and_handoff_to_its_first_token():
    """The first token is the prefill worker's: the decode worker reports it as it admits the request, once the KV
    has landed (decode_worker/worker.py `settle`). Then one decode step a token; with overlapped scheduling a step's
    token comes back once the next step is launched (a graph replay: the host's launch work), the last one's at its
    end."""
    profile = make_profile()
    input_len, output = 700, 20
    requests = simulate(profile, Layout(prefill=1, decode=1), workload(1, 1.0, input_len, output))
    launch = profile.host_launch_s
    expected = launch + profile.prefill.seconds(input_len, 0) + profile.handoff_seconds(input_len)
    assert requests[0].ttft == pytest.approx(expected, rel=1e-12)
    steps = [launch + profile.decode.seconds(1, input_len + i) for i in range(output - 1)]
    assert requests[0].tpot == pytest.approx(sum(steps) / (output - 1), rel=1e-12)


def test_a_steps_tokens_come_back_once_the_next_step_is_launched():
    """Two prompts that fit one prefill step each, sent together to a prefill worker: the first one's KV leaves
    when the second one's step has been launched, an eager step whose launch is the prefill floor
    (LLMEngine.step: launch the next step, then collect this one)."""
    input_len = 500
    profile = make_profile(max_num_batched_tokens=input_len)
    load = workload(2, 1.0, input_len, 2)
    load.arrivals = [0.0, 0.0]
    first, second = simulate(profile, Layout(prefill=1, decode=1), load)
    launch = profile.host_launch_s
    step = launch + profile.prefill.seconds(input_len, 0)
    assert first.first == pytest.approx(step + launch + profile.prefill.base_s + profile.handoff_seconds(input_len),
                                        rel=1e-12)
    assert second.first == pytest.approx(2 * step + profile.handoff_seconds(input_len), rel=1e-12)


def test_a_prompt_steps_successor_is_scheduled_as_it_starts():
    """Overlapped scheduling (LLMEngine.step): while a prompt step runs, the worker has already scheduled and
    launched the next one (late launch waits only behind decode steps), so a prompt that arrives during it is in
    the step after that."""
    engine = SimEngine("c0", "colocated", make_profile())
    engine.add_prompt("a", list(range(1000)), 3, prefill_only=False, now=0.0)
    end = engine.start(0.0)
    late = engine.add_prompt("b", list(range(5000, 5100)), 3, prefill_only=False, now=end / 2)
    engine.collect(engine.finish())
    second = engine.start(end)
    assert [s.request_id for s in engine.batch.seqs] == ["a"]  # a's decode alone
    engine.collect(engine.finish())
    engine.start(second)
    assert late in engine.batch.seqs


def test_a_decode_steps_successor_is_scheduled_a_lead_before_it_ends():
    """Late launch (common/engine/launch_clock.py): behind a decode step the worker takes messages until a lead
    before the step ends (the host's launch work and a tenth of the step), then schedules and launches the next,
    taking no message for the host's launch work, and takes them again while it waits for the step's tokens."""
    profile = make_profile()
    engine = SimEngine("c0", "colocated", profile)
    engine.add_prompt("a", list(range(100)), 50, prefill_only=False, now=0.0)
    start = engine.start(0.0)  # a's prompt
    engine.collect(engine.finish())
    end = engine.start(start)
    assert engine.batch.decode_only
    lead = LEAD_PREP_FACTOR * profile.host_launch_s + LEAD_STEP_SHARE * (end - start)
    cutoff, launched = end - lead, end - lead + profile.host_launch_s  # the profile has no launch_prep_s
    assert engine.polls_at(end - 1.1 * lead) == end - 1.1 * lead  # still taking messages
    assert engine.polls_at(cutoff + 0.5 * profile.host_launch_s) == pytest.approx(launched)  # launching the next
    assert engine.polls_at(launched + 1e-6) == launched + 1e-6  # waiting for the step's tokens, taking messages
    engine.add_prompt("early", list(range(7000, 7100)), 3, prefill_only=False, now=end - 1.1 * lead)
    engine.add_prompt("late", list(range(8000, 8100)), 3, prefill_only=False, now=end - 0.9 * lead)
    engine.collect(engine.finish())
    engine.start(end)
    assert [s.request_id for s in engine.batch.seqs] == ["a", "early"]


def test_a_decode_steps_successor_is_scheduled_only_once_the_host_has_launched_the_step():
    """Where the host's launch work nears a decode step (a small model), late launch never waits, but the loop
    schedules the next step only after it has launched this one (LLMEngine.step launches, then collects): a prompt
    that arrives while the step runs rides the next launch (docs/gpu_runs/stop28_arrival_probe.py: all 40 arrivals
    at each of 1-64 decodes did), not the one after it."""
    profile = make_profile(launch_prep_s=0.005)  # the decode step below is ~6 ms: the lead (~7 ms) covers it
    engine = SimEngine("c0", "colocated", profile)
    engine.add_prompt("a", list(range(100)), 50, prefill_only=False, now=0.0)
    start = engine.start(0.0)  # a's prompt
    engine.collect(engine.finish())
    end = engine.start(start)
    assert engine.batch.decode_only and LEAD_PREP_FACTOR * 0.005 > end - start > 0.0055
    assert engine.cutoff == pytest.approx(start + 0.005)
    # and from the step's start the loop launches the next one, deaf for the host's launch work (stop 29)
    assert engine.polls_at(start + 0.001) == pytest.approx(start + 0.005)
    assert engine.polls_at(start + 0.0051) == start + 0.0051
    engine.add_prompt("early", list(range(7000, 7100)), 3, prefill_only=False, now=start + 0.004)
    engine.add_prompt("late", list(range(8000, 8100)), 3, prefill_only=False, now=start + 0.0055)
    engine.collect(engine.finish())
    engine.start(end)
    assert [s.request_id for s in engine.batch.seqs] == ["a", "early"]


def test_where_the_lead_covers_a_decode_step_the_loop_is_deaf_from_its_start_past_its_end():
    """Where late launch's lead covers the whole decode step, the loop launches the next step from this one's start,
    taking no message for the host's launch work (a KV handoff landing as a decode step starts waits for most of a
    launch, as the served timelines show, stop 29). Here that work is longer than the step: a message that comes
    once the next step has started still waits for it, and then for that step's own launch."""
    prep = 0.008
    engine = SimEngine("c0", "colocated", make_profile(launch_prep_s=prep))
    engine.add_prompt("a", list(range(100)), 50, prefill_only=False, now=0.0)
    start = engine.start(0.0)  # a's prompt
    engine.collect(engine.finish())
    end = engine.start(start)
    assert engine.batch.decode_only and start + prep > end
    assert engine.polls_at(start + 0.001) == pytest.approx(start + prep)
    engine.collect(engine.finish())
    engine.start(end)
    # the launch that began in the step before ends at start + prep, and this step's own follows at once
    assert engine.polls_at(end + 0.0005) == pytest.approx(end + prep)


def test_on_a_cpu_the_next_step_takes_what_came_while_this_one_ran():
    """On a CPU the engine's launch computes the step: the worker's loop reads no message until it ends, then
    schedules the next step with everything that came meanwhile."""
    engine = SimEngine("c0", "colocated", make_profile(device="cpu"))
    engine.add_prompt("a", list(range(1000)), 3, prefill_only=False, now=0.0)
    end = engine.start(0.0)
    assert engine.polls_at(end / 2) == end
    late = engine.add_prompt("b", list(range(5000, 5100)), 3, prefill_only=False, now=end / 2)
    engine.collect(engine.finish())
    engine.start(end)
    assert late in engine.batch.seqs


def test_fast_forward_changes_no_prediction():
    """Decode steps run in bulk, cut short when a request lands, give every request the times stepping gives."""
    profile = make_profile()
    load = workload(300, 40.0, 300, 60, seed=2)
    bulk = simulate(profile, Layout(prefill=1, decode=1), load)
    stepped = simulate(profile, Layout(prefill=1, decode=1), load)
    for a, b in zip(bulk, stepped):
        assert (a.first, a.done) == pytest.approx((b.first, b.done), rel=1e-9)


def test_without_a_prefix_cache_an_engine_holds_a_prompt_as_as_many_stand_ins():
    """The sequence Sequence makes of the prompt, but for which ids (the prompt itself untouched); with the cache,
    the prompt's own."""
    prompt = list(range(100, 140))
    real = Sequence("r", prompt, sampling(7), prefill_only=True)
    stand_in = sequence("r", prompt, 7, prefill_only=True, prefix_caching=False)
    assert stand_in.token_ids == [TOKEN] * 40 and prompt == list(range(100, 140))
    assert stand_in.num_tokens == stand_in.num_prompt_tokens == 40 and stand_in.token_ids is not prompt
    same = {"token_ids", "arrival_time"}
    assert ({k: v for k, v in vars(stand_in).items() if k not in same}
            == {k: v for k, v in vars(real).items() if k not in same})
    assert sequence("r", prompt, 7, prefill_only=False, prefix_caching=True).token_ids == prompt


@pytest.mark.parametrize("layout", [Layout(prefill=1, decode=2), Layout(colocated=2)])
def test_stand_in_prompts_change_no_prediction(layout, monkeypatch):
    """Without a prefix cache, engines holding each prompt's own ids give every request the same times."""
    profile = make_profile()
    load = workload(200, 40.0, 300, 40, seed=3)
    stand_ins = simulate(profile, layout, load)
    monkeypatch.setattr("scripts.planner.engine.sequence",
                        lambda rid, prompt, n, prefill_only, _: sequence(rid, prompt, n, prefill_only, True))
    own = simulate(profile, layout, load)
    assert [(r.first, r.done) for r in stand_ins] == [(r.first, r.done) for r in own]


@pytest.mark.parametrize("shared", [False, True])
def test_reused_block_managers_change_no_prediction(shared):
    profile = make_profile()
    base = workload(100, 30.0, 300, 40, seed=4)
    load = Workload(base.arrivals, [[7] * 64 + p for p in base.prompts], base.output_lens, shared_prefixes=shared)
    spares = BlockPool()
    runs = [simulate(profile, Layout(prefill=2, decode=2), load, spares=spares) for _ in range(3)]
    assert sum(map(len, spares.spare.values())) == 4
    for a, b in zip(runs[0], runs[2]):
        assert (a.first, a.done) == (b.first, b.done)


def test_prefix_aware_placement_finds_the_cached_prefixes_placement_by_load_misses():
    """The router's own placement, on system prompts that fit in the replicas' caches together but not in one:
    the engines' block managers find more of each prompt cached, and prompts wait less."""
    profile = make_profile(num_kv_blocks=1024)  # 16k tokens a replica: 4 of the 12 prefixes
    rng = random.Random(5)
    requests = shared_prefix_mix(rng, 400, 50_000, 4000, 12, LengthRange(64, 64), LengthRange(8, 8))
    load = Workload(poisson_arrivals(rng, 400, 8.0), [r.prompt_ids for r in requests], [8] * 400)
    seen = {}
    for placement in ("prefix", "load"):
        sim = Simulation(profile, Layout(colocated=4, placement=placement), load)
        done = sim.run()
        hits = sum(e.block_manager.cache_hit_tokens for e in sim.engines.values())
        seen[placement] = (sum(r.ttft for r in done) / len(done), hits)
    assert seen["prefix"][1] > 2 * seen["load"][1]
    assert seen["prefix"][0] < seen["load"][0] / 2


def test_a_burst_beyond_the_per_worker_cap_waits_at_the_router_and_the_counts_return_to_zero():
    """The router's Request transitions count what each worker holds; WorkerRegistry.with_room caps it."""
    profile = make_profile(num_kv_blocks=100_000)
    load = workload(1500, float("inf"), 50, 20)  # all at once, more than a worker's 1024
    sim = Simulation(profile, Layout(prefill=1, decode=1), load)
    most = 0
    dispatch = sim._dispatch

    def watched() -> None:
        nonlocal most
        dispatch()
        most = max(most, *(len(w.assigned) for w in sim.infos.values()))

    sim._dispatch = watched
    requests = sim.run()
    assert most == 1024 and all(r.done is not None for r in requests)
    assert all(not w.assigned and w.prefill_tokens == 0 for w in sim.infos.values())


def test_a_burst_beyond_the_routers_queue_is_refused_as_the_router_refuses_it():
    """Admission's bounds: a worker holds 1024 requests, the queue 4096 more; the rest are `overloaded`, and count
    as missing the SLO."""
    profile = make_profile(num_kv_blocks=100_000, max_num_seqs=256)
    requests = simulate(profile, Layout(colocated=1), workload(6000, float("inf"), 16, 2))
    refused = [r for r in requests if r.refused]
    assert len(refused) == 6000 - 1024 - 4096 and {r.refused for r in refused} == {"overloaded"}
    point = summarize("colocated x1", 1.0, requests, SLO(1e9, 1e9))
    assert point.refused == len(refused) and point.attainment == pytest.approx(1 - len(refused) / 6000)


def test_every_request_finishes_in_every_mode_and_policy():
    profile = make_profile(num_kv_blocks=512)  # tight: admission waits for blocks, decodes may preempt
    load = workload(200, 50.0, 400, 80, seed=3)
    for layout in (Layout(prefill=1, decode=2), Layout(prefill=2, decode=1, policy="auto"),
                   Layout(prefill=1, decode=2, policy="never"), Layout(colocated=3)):
        requests = simulate(profile, layout, load)
        assert all(r.done is not None and r.done >= r.first >= r.arrival for r in requests), layout


def test_a_step_mixing_prompt_tokens_with_decodes_costs_its_eager_decodes_more():
    plain, eager = make_profile(), make_profile(mixed_step_s=0.02)
    decode, prompt = Sequence("d", [1] * 100, SamplingParams()), Sequence("p", [2] * 300, SamplingParams())
    decode.num_computed_tokens = 100
    mixed, alone = ScheduledBatch([decode, prompt], [1, 300]), ScheduledBatch([prompt], [300])
    step = {name: SimEngine("d0", "decode", p).step_seconds for name, p in (("plain", plain), ("eager", eager))}
    assert step["eager"](mixed) == pytest.approx(step["plain"](mixed) + 0.02)
    assert step["eager"](alone) == step["plain"](alone)  # nothing to replay in a graph anyway
    assert step["eager"](ScheduledBatch([decode], [1])) == step["plain"](ScheduledBatch([decode], [1]))


def test_prompt_steps_are_costed_padded_graphed_up_to_the_graphs_and_eager_past_them():
    """A profile of an engine with prompt graphs: a step's prompt tokens are costed at the count the engine pads
    them to, on `prefill`'s line with only a graph's launch on the host up to `prefill_graph_max_tokens`, on
    `prefill_eager`'s with its launch-bound floor on the host past it."""
    eager_cost = PrefillCost(base_s=0.02, per_token_s=2e-4)
    graphs = make_profile(prefill_graph_max_tokens=2048, prefill_eager=eager_cost)
    engine, launch = SimEngine("p0", "prefill", graphs), graphs.host_launch_s

    def prompt(n: int) -> ScheduledBatch:
        return ScheduledBatch([Sequence("p", [2] * n, SamplingParams())], [n])
    assert engine.step_seconds(prompt(600)) == pytest.approx(launch + graphs.prefill.seconds(768))  # padded to 768
    assert engine.host_seconds(prompt(600)) == launch
    assert engine.step_seconds(prompt(2048)) == pytest.approx(launch + graphs.prefill.seconds(2048))
    assert engine.step_seconds(prompt(3000)) == pytest.approx(launch + eager_cost.seconds(3072))
    assert engine.host_seconds(prompt(3000)) == pytest.approx(launch + eager_cost.base_s)
    assert graphs.prompt_step(600) == pytest.approx((launch + graphs.prefill.seconds(768), launch))
    assert graphs.prompt_step(3000) == pytest.approx((launch + eager_cost.seconds(3072), launch + eager_cost.base_s))
    old = SimEngine("p0", "prefill", make_profile())  # measured before prompt graphs: unpadded, every step eager
    assert old.step_seconds(prompt(600)) == pytest.approx(launch + old.profile.prefill.seconds(600))
    assert old.host_seconds(prompt(600)) == pytest.approx(launch + old.profile.prefill.base_s)


def test_prefill_points_are_fitted_as_two_lines_at_the_graphs_limit():
    from scripts.planner.fit import fit_prefill_costs
    from scripts.planner.points import PrefillPoint

    graphed, eager = PrefillCost(base_s=0.002, per_token_s=3e-6), PrefillCost(base_s=0.012, per_token_s=4e-6)
    points = [PrefillPoint(n, 0, 0.0001 + (graphed if n <= 2048 else eager).seconds(n))
              for n in (64, 256, 1024, 2048, 4096, 8192)]
    prefill, prefill_eager, fits = fit_prefill_costs(points, 0.0001, 2048)
    assert prefill.base_s == pytest.approx(0.002) and prefill.per_token_s == pytest.approx(3e-6)
    assert prefill_eager.base_s == pytest.approx(0.012) and prefill_eager.per_token_s == pytest.approx(4e-6)
    assert set(fits) == {"prefill", "prefill_eager"} and fits["prefill"].worst_error < 1e-9
    one, none, fits = fit_prefill_costs(points, 0.0001, 0)  # no prompt graphs: one line through every point
    assert none is None and set(fits) == {"prefill"} and fits["prefill"].worst_error > 0.05


def test_each_prompt_line_has_its_own_cost_a_pair_where_the_eager_side_tells_its_square():
    """Past the graphs' limit the full grid measures two prompt sizes after three prefixes: enough to tell the eager
    side's cost a pair attended from its line. Each side keeps its own (with the context, or among a chunk's own
    tokens: one cost); the two floors are fitted over every point."""
    from scripts.planner.fit import fit_prefill_costs
    from scripts.planner.points import PrefillPoint

    floors = dict(min_tokens=128, context_min_tokens=512)
    graphed = PrefillCost(base_s=0.002, per_token_s=3e-6, per_token_context_s=1e-9, per_chunk_pair_s=1e-9, **floors)
    eager = PrefillCost(base_s=0.012, per_token_s=4e-6, per_token_context_s=6e-10, per_chunk_pair_s=6e-10, **floors)
    points = [PrefillPoint(n, c, 0.0001 + (graphed if n <= 2048 else eager).seconds(n, c))
              for c in (0, 1024, 4096) for n in (64, 256, 1024, 2048, 4096, 8192)]
    prefill, prefill_eager, fits = fit_prefill_costs(points, 0.0001, 2048)
    for fitted, truth in ((prefill, graphed), (prefill_eager, eager)):
        assert [getattr(fitted, f) for f in truth.__struct_fields__] == pytest.approx(
            [getattr(truth, f) for f in truth.__struct_fields__])
    assert max(f.worst_error for f in fits.values()) < 1e-9


def test_too_few_eager_points_share_the_graphed_sides_cost_a_pair():
    """Two eager prompt sizes and no prefix cannot tell a square from a line: the eager side then takes the cost a
    pair the graphed side's points tell."""
    from scripts.planner.fit import fit_prefill_costs, tells_its_square
    from scripts.planner.points import PrefillPoint

    shared = dict(per_token_context_s=1e-9, per_chunk_pair_s=1e-9)
    graphed = PrefillCost(base_s=0.002, per_token_s=3e-6, **shared)
    eager = PrefillCost(base_s=0.012, per_token_s=4e-6, **shared)
    points = [PrefillPoint(n, c, 0.0001 + graphed.seconds(n, c)) for c in (0, 1024, 4096) for n in (64, 256, 1024)]
    points += [PrefillPoint(n, 0, 0.0001 + eager.seconds(n)) for n in (4096, 8192)]
    assert not tells_its_square(points[-2:]) and tells_its_square(points[:-2])
    prefill, prefill_eager, _ = fit_prefill_costs(points, 0.0001, 2048)
    assert prefill_eager.per_token_context_s == prefill.per_token_context_s == pytest.approx(1e-9)
    assert prefill_eager.base_s == pytest.approx(0.012) and prefill_eager.per_token_s == pytest.approx(4e-6)


# Qwen3-0.6B's prompt steps on an H200 (stop 27's profile, ms): tokens, cached prefix, measured.
H200_06B_PROMPTS = [(64, 0, 1.977), (256, 0, 2.846), (1024, 0, 5.002), (2048, 0, 8.329), (4096, 0, 17.783),
                    (8192, 0, 42.689), (64, 1024, 2.827), (256, 1024, 3.211), (1024, 1024, 5.209),
                    (2048, 1024, 10.218), (4096, 1024, 19.764), (8192, 1024, 46.072), (64, 4096, 6.324),
                    (256, 4096, 6.667), (1024, 4096, 8.234), (2048, 4096, 15.619), (4096, 4096, 29.073),
                    (8192, 4096, 60.379)]


def test_a_small_models_eager_prompts_fit_within_five_percent_with_their_own_cost_a_pair():
    """Qwen3-0.6B on an H200: with the graphed side's cost a pair, the eager line priced an 8,192-token prompt 8% low
    and one after a 4,096-token prefix 11% high, and served 5-7k-token prompts ran about a fifth longer than the
    simulator said (docs/benchmarks.md, "Stop 28"). With a cost of their own every eager point is within 5%."""
    from scripts.planner.fit import fit_prefill_costs
    from scripts.planner.points import PrefillPoint

    points = [PrefillPoint(n, c, ms / 1e3) for n, c, ms in H200_06B_PROMPTS]
    prefill, eager, fits = fit_prefill_costs(points, 1.428e-4, 2048)
    assert fits["prefill_eager"].worst_error < 0.05
    assert eager.per_token_context_s != prefill.per_token_context_s
    assert 1.428e-4 + eager.seconds(8192) == pytest.approx(0.042689, rel=0.05)


# Qwen3-8B's prompt steps on an H200 (stop 26's profile, ms): tokens, cached prefix, measured.
H200_8B_PROMPTS = [(64, 0, 6.012), (256, 0, 8.435), (1024, 0, 24.928), (2048, 0, 51.954), (4096, 0, 104.534),
                   (8192, 0, 240.162), (64, 1024, 6.821), (256, 1024, 8.822), (1024, 1024, 25.888),
                   (2048, 1024, 54.142), (4096, 1024, 110.318), (8192, 1024, 242.113), (64, 4096, 10.770),
                   (256, 4096, 12.281), (1024, 4096, 32.783), (2048, 4096, 65.269), (4096, 4096, 129.991),
                   (8192, 4096, 281.403)]


def test_a_real_gpus_prompt_steps_fit_within_a_tenth_with_an_eager_line_that_costs_per_token():
    """On the H200's points, a separate cost for a chunk's own pairs took up the bend of the graphed side's GEMMs
    (weights-bound below a tile) and left the eager line nothing a token: a step of six 1,333-token prompts then
    cost 47% of its time. With one cost a pair for context and chunk pairs (since stop 28 each line its own) and the
    two floors, every point is within 10%, and so is that step (194.9 ms back to back, 180.1 alone, in stop 26's
    probe)."""
    from scripts.planner.fit import fit_prefill_costs
    from scripts.planner.points import PrefillPoint

    points = [PrefillPoint(n, c, ms / 1e3) for n, c, ms in H200_8B_PROMPTS]
    prefill, eager, fits = fit_prefill_costs(points, 2.004e-4, 2048)
    assert max(f.worst_error for f in fits.values()) < 0.10
    assert eager.per_token_s > 10e-6 and prefill.min_tokens > 0 and prefill.context_min_tokens > 0
    six = 2.004e-4 + eager.step_seconds(7998, [(1333, 0)] * 6)
    assert six == pytest.approx(0.1801, rel=0.10)


def test_a_step_below_the_floors_costs_as_the_floors_say():
    """A step of fewer than `min_tokens` runs GEMMs that read every weight anyway; a chunk of fewer than
    `context_min_tokens` streams its context as slowly as that many would. Profiles without them cost as before."""
    cost = PrefillCost(base_s=0.001, per_token_s=1e-5, per_token_context_s=2e-9, per_chunk_pair_s=2e-9,
                       min_tokens=128, context_min_tokens=512)
    assert cost.seconds(64) == pytest.approx(0.001 + 128e-5 + 2e-9 * 64 * 64 / 2)
    assert cost.seconds(64, 4096) - cost.seconds(64) == pytest.approx(2e-9 * 512 * 4096)
    assert cost.seconds(1024, 4096) - cost.seconds(1024) == pytest.approx(2e-9 * 1024 * 4096)
    plain = PrefillCost(base_s=0.001, per_token_s=1e-5, per_token_context_s=2e-9)
    assert plain.seconds(64, 4096) == pytest.approx(0.001 + 64e-5 + 2e-9 * 64 * 4096)


def test_prompt_steps_back_to_back_slow_to_the_sustained_factor_and_recover_after_a_pause():
    """A GPU under its power limit runs prompt steps back to back slower than alone: the engine's heat (its recent
    share of time in prompt steps) scales each step between its time alone and `sustained_prefill_factor` times
    it; after a few SUSTAIN_S idle a step costs its time alone again. A factor of 1 changes nothing."""
    from scripts.planner.engine import SUSTAIN_S

    hot = SimEngine("p0", "prefill", make_profile(sustained_prefill_factor=1.2))
    cold = SimEngine("p0", "prefill", make_profile())

    ids = iter(range(3, 1 << 20))

    def run(engine: SimEngine, now: float) -> float:  # a prompt of its own: no prefix cache hits
        engine.add_prompt(f"r{now}", [next(ids)] * 1000, 1, prefill_only=True, now=now)
        end = engine.start(now)
        engine.collect(engine.finish())
        return end - now
    alone = cold.step_seconds(ScheduledBatch([Sequence("x", [3] * 1000, SamplingParams())], [1000]))
    now, times = 0.0, []
    for _ in range(40):
        times.append(run(hot, now))
        now += times[-1]
    assert times[0] == pytest.approx(alone) and times[-1] == pytest.approx(1.2 * alone, rel=1e-3)
    assert all(a <= b + 1e-12 for a, b in zip(times, times[1:]))
    assert run(hot, now + 10 * SUSTAIN_S) == pytest.approx(alone, rel=1e-3)
    assert [run(cold, 100.0 + i * alone) for i in range(3)] == pytest.approx([alone] * 3)


def test_decode_steps_of_a_few_sequences_are_costed_on_the_skinny_line():
    """Decode steps of up to `decode_skinny_max_batch` sequences run the skinny GEMMs: their own line, far below the
    one through larger batches; a profile without it costs every batch on `decode`."""
    skinny = DecodeCost(base_s=0.0005, per_seq_s=1e-4)
    profile = make_profile(decode_skinny_max_batch=2, decode_skinny=skinny)
    engine, launch = SimEngine("d0", "decode", profile), profile.host_launch_s

    def decodes(n: int) -> ScheduledBatch:
        seqs = [Sequence(f"d{i}", [1] * 100, SamplingParams()) for i in range(n)]
        for seq in seqs:
            seq.num_computed_tokens = 100
        return ScheduledBatch(seqs, [1] * n)
    assert engine.step_seconds(decodes(2)) == pytest.approx(launch + skinny.seconds(2, 200))
    assert engine.step_seconds(decodes(3)) == pytest.approx(launch + profile.decode.seconds(3, 300))
    plain = SimEngine("d0", "decode", make_profile())
    assert plain.step_seconds(decodes(1)) == pytest.approx(launch + plain.profile.decode.seconds(1, 100))


def test_decode_points_are_fitted_as_two_lines_at_the_skinny_limit():
    from scripts.planner.fit import fit_decode_costs
    from scripts.planner.points import DecodePoint

    skinny, wide = DecodeCost(base_s=0.0008, per_seq_s=2e-5), DecodeCost(base_s=0.0013, per_seq_s=6e-6)
    points = [DecodePoint(b, b * c, 0.0001 + (skinny if b <= 2 else wide).seconds(b, b * c))
              for b in (1, 2, 8, 32, 128) for c in (128, 1024)]
    decode, decode_skinny, fits = fit_decode_costs(points, 0.0001, 2)
    assert decode.base_s == pytest.approx(0.0013) and decode_skinny.base_s == pytest.approx(0.0008)
    assert set(fits) == {"decode", "decode_skinny"} and fits["decode"].worst_error < 1e-9
    one, none, fits = fit_decode_costs(points, 0.0001, 0)  # a CPU profile: one line through every point
    assert none is None and set(fits) == {"decode"} and fits["decode"].worst_error > 0.05


def tpot_and_ttft(requests) -> tuple[float, float]:
    tpot, ttft = sorted(r.tpot for r in requests), sorted(r.ttft for r in requests)
    return tpot[int(0.9 * len(tpot))], ttft[len(ttft) // 2]


def test_auto_prefills_locally_while_the_decodes_keep_their_pace():
    """A slow handoff and a fast prefill: prefilling on the decode worker gives first tokens sooner. `auto` does
    while the decode worker is lightly loaded, and where chunks are dear (eager decodes) it keeps TPOT near
    `always`'s, where `never` does not."""
    fast = dict(prefill=PrefillCost(base_s=0.002, per_token_s=1e-5), handoff={"host": HandoffCost(0.03, 1e8)})
    light = workload(300, 5.0, 200, 100, seed=2)
    runs = {pol: simulate(make_profile(**fast), Layout(prefill=1, decode=1, policy=pol), light)
            for pol in ("always", "auto")}
    assert tpot_and_ttft(runs["auto"])[1] < 0.5 * tpot_and_ttft(runs["always"])[1]
    busy, dear = workload(300, 20.0, 200, 100, seed=2), make_profile(mixed_step_s=0.02, **fast)
    tpot = {pol: tpot_and_ttft(simulate(dear, Layout(prefill=1, decode=1, policy=pol), busy))[0]
            for pol in ("always", "auto", "never")}
    assert tpot["auto"] < 1.2 * tpot["always"] and tpot["never"] > 1.5 * tpot["always"]


def test_a_prefill_worker_waiting_for_blocks_held_for_handoffs_goes_on_when_they_land():
    """Its cache holds one prompt at a time: each next prompt waits until the last one's KV has landed."""
    profile = make_profile(num_kv_blocks=48)
    load = Workload([0.0] * 6, [[i] * 600 for i in range(6)], [10] * 6, shared_prefixes=False)
    requests = simulate(profile, Layout(prefill=1, decode=3), load)
    firsts = sorted(r.first for r in requests)
    handoff = profile.handoff_seconds(600)
    assert all(b - a > handoff for a, b in zip(firsts, firsts[1:]))


def test_a_request_no_engine_can_hold_is_refused():
    profile = make_profile(num_kv_blocks=8)
    with pytest.raises(ValueError, match="more KV blocks"):
        simulate(profile, Layout(colocated=2), workload(3, 1.0, 200, 10))


# ---- the recommendation -------------------------------------------------------------------------
def plan_for(profile: Profile, **flags) -> dict:
    cfg = PlanConfig(profile="given", gpus=4, seed=0, disagg_policies="always", **flags)
    return run_plan(cfg, [profile]).results


def sustained(results: dict, slo: SLO) -> dict[str, float]:
    return {name: score(points, slo)[0] for name, points in results.items()}


def test_a_decode_heavy_workload_gets_more_decode_gpus():
    """Short prompts, long answers, few sequences per decode engine: each decode GPU adds capacity (a request that
    waits for a seat has streamed its first token already: the wait shows in its TPOT)."""
    slo = SLO(1.0, 0.02)
    results = plan_for(make_profile(max_num_seqs=16), input_len="32", output_len="400", rates="4,8,12,16",
                       num_requests=200, slo_ttft=slo.ttft, slo_tpot=slo.tpot)
    rates = sustained(results, slo)
    assert rates["1P:3D"] > rates["2P:2D"] > rates["3P:1D"]
    splits = {name: points for name, points in results.items() if not name.startswith("colocated")}
    assert recommend(splits, slo)[0] == "1P:3D"


def test_a_prefill_heavy_workload_gets_more_prefill_gpus():
    """Long prompts, a few tokens each: each prefill GPU adds capacity, and colocated decodes stall behind them."""
    slo = SLO(1.0, 0.05)
    results = plan_for(make_profile(), input_len="3000", output_len="4", rates="2,4,6", num_requests=200,
                       slo_ttft=slo.ttft, slo_tpot=slo.tpot)
    rates = sustained(results, slo)
    assert rates["3P:1D"] > rates["2P:2D"] > rates["1P:3D"]
    assert recommend(results, slo)[0] == "3P:1D"


def test_layouts_simulated_in_several_processes_give_the_plan_of_one(monkeypatch):
    from scripts.planner import plan as plan_module

    pooled = []
    made = plan_module.Layouts.__init__

    def recorded(self, *args):
        made(self, *args)
        pooled.append(self.pool is not None)
    monkeypatch.setattr(plan_module.Layouts, "__init__", recorded)
    flags = dict(input_len="64:512", output_len="16:128", rates="4,12", num_requests=120)
    one, several = plan_for(make_profile(), jobs=1, **flags), plan_for(make_profile(), jobs=2, **flags)
    assert pooled == [False, True]
    assert list(one) == ["1P:3D", "2P:2D", "3P:1D", "colocated x4"] and one == several


def test_profiles_at_two_tp_sizes_are_compared_on_the_same_gpus():
    tp1, tp2 = make_profile(), make_profile(tp=2, block_size=32, num_kv_blocks=4096)
    cfg = PlanConfig(profile="given", gpus=4, rates="5", num_requests=50, input_len="100", output_len="10",
                     disagg_policies="always")
    results = run_plan(cfg, [tp1, tp2]).results
    assert list(results) == ["1P:3D", "2P:2D", "3P:1D", "colocated x4", "tp2 1P:1D", "tp2 colocated x2"]


def test_a_trace_without_rates_is_simulated_as_recorded(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival": 10 + i * 0.5, "input_len": 50 + i, "output_len": 5}) + "\n"
                             for i in range(21)))
    results = plan_for(make_profile(), trace=str(trace))
    points = results["2P:2D"]
    assert len(points) == 1 and points[0].rate == pytest.approx(2.0) and points[0].requests == 21


@pytest.mark.parametrize("flags, message", [
    (dict(profile=""), "--profile"),
    (dict(gpus=0), "--gpus"),
    (dict(disagg_policies="always,sometimes"), "--disagg-policies"),
    (dict(placement="random"), "--placement"),
    (dict(workload="trace"), "--trace"),
    (dict(rates="4,fast"), "--rates"),
    (dict(output_len="0"), "--output-len"),
    (dict(router_rps=0), "--router-rps"),
    (dict(slower_gpus=1.0), "--slower-gpus"),
    (dict(slower_gpus=-0.1), "--slower-gpus"),
])
def test_plan_settings_are_checked_naming_the_flag(flags, message):
    with pytest.raises(ValueError, match=message):
        PlanConfig(**{"profile": "p.json", **flags})


# ---- the command --------------------------------------------------------------------------------
def plan_command(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.cli", "plan", "--profile", str(EXAMPLE), *args],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=timeout)


def test_plan_prints_every_split_and_a_recommendation(tmp_path):
    proc = plan_command("--gpus", "4", "--rates", "10,30", "--num-requests", "200", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for layout in ("1P:3D", "2P:2D", "3P:1D", "1P:3D (auto)", "3P:1D (auto)", "colocated x4"):
        assert layout in proc.stdout
    assert "recommendation: " in proc.stdout and "EXAMPLE" in proc.stdout
    record = json.loads((tmp_path / "plan.json").read_text())
    assert record["recommendation"]["layout"] in record["results"]
    assert len(record["results"]["2P:2D"]) == 2
    best = record["recommendation"]["layout"]
    assert f"machine: {best} on GPUs 4% slower in every step" in proc.stdout
    assert record["slower_gpus"]["layout"] == best and record["slower_gpus"]["share"] == 0.04
    assert [p["rate"] for p in record["slower_gpus"]["points"]] == [10, 30]
    from scripts.bench_plots import missing
    from scripts.planner.plots import PLOTS
    for name in PLOTS:  # drawn where matplotlib is installed (the bench extra), else said
        plot = tmp_path / name
        assert (plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n") if not missing() else not plot.exists()


def test_the_plots_shade_splits_by_prefill_share_and_mark_the_recommendation():
    """However many splits, each reads by its colour (its share of prefill engines, on one colour map), the policy by
    the line style, colocated in black; the recommended layout's line is the thickest."""
    from scripts.planner.plots import styles

    layouts = {str(lay): lay for lay in (Layout(prefill=1, decode=3), Layout(prefill=2, decode=2),
                                         Layout(prefill=3, decode=1), Layout(prefill=3, decode=1, policy="auto"),
                                         Layout(colocated=4))}
    looks = styles(layouts, "3P:1D (auto)")
    assert [looks[n].shade for n in ("1P:3D", "2P:2D", "3P:1D")] == [0.25, 0.5, 0.75]
    assert looks["3P:1D (auto)"].shade == looks["3P:1D"].shade
    assert looks["3P:1D"].linestyle != looks["3P:1D (auto)"].linestyle
    assert looks["colocated x4"].shade is None
    widest = max(looks, key=lambda n: looks[n].linewidth)
    assert widest == "3P:1D (auto)" and sorted(look.linewidth for look in looks.values())[-2] < looks[widest].linewidth


def test_plan_on_128_gpus_searches_a_coarse_grid_of_splits():
    proc = plan_command("--gpus", "128", "--rates", "400", "--num-requests", "300", "--output-len", "64",
                        "--disagg-policies", "always", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recommendation: " in proc.stdout and "coarse grid" in proc.stdout
    assert "note: at 400 req/s the 300 requests arrive within" in proc.stdout  # under a second: far from steady


def test_plan_without_rates_says_where_its_rates_come_from(tmp_path):
    proc = plan_command("--gpus", "4", "--num-requests", "100", "--disagg-policies", "always", "--slower-gpus", "0",
                        "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "plan.json").read_text())
    rates, cap = record["rates"], record["capacity"]
    assert len(rates) == 4 and rates[-1] == pytest.approx(1.25 * cap["rate"], rel=0.05)
    assert f"rates: {', '.join(f'{r:g}' for r in rates)} req/s (no --rates: half to 1.25 times the most 4 GPUs " \
           f"could serve, about {cap['rate']:.4g} req/s" in proc.stdout
    assert all(len(points) == 4 for points in record["results"].values())


def test_plan_refuses_a_missing_profile_with_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", "plan", "--profile", str(tmp_path / "none.json")],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "cannot read" in proc.stderr


def test_a_kv_copy_on_a_shared_gpu_waits_for_the_other_engines_step_unless_its_own_runs():
    """Two processes on one GPU (no MPS) take turns: an idle prefill worker's KV copy waits for the decode worker's
    step in flight to end (the workers' timelines on one H100: the send, 1.5 ms at the median, is that wait); with
    a step of its own in flight, the copy runs in that step's turn; alone on a GPU, at once."""
    profile = make_profile()
    load = workload(1, 1.0, 100, 4)
    shared = Simulation(profile, Layout(prefill=1, decode=1, gpus_per_engine=0.5), load)
    prefill, decode = (next(e for e in shared.engines.values() if e.role == r) for r in ("prefill", "decode"))
    gpu = shared.gpu_of[prefill.name]
    assert gpu is shared.gpu_of[decode.name] and gpu.shared
    gpu.add(decode, 0.004, now=0.0)
    assert shared._copy_starts(prefill, 0.001) == pytest.approx(0.004)
    gpu.add(prefill, 0.002, now=0.0)
    assert shared._copy_starts(prefill, 0.001) == 0.001
    alone = Simulation(profile, Layout(prefill=1, decode=1), load)
    prefill, decode = (next(e for e in alone.engines.values() if e.role == r) for r in ("prefill", "decode"))
    alone.gpu_of[decode.name].add(decode, 0.004, now=0.0)
    assert alone._copy_starts(prefill, 0.001) == 0.001


def test_handoffs_between_gpus_are_costed_over_nccl_where_the_profile_has_it(tmp_path):
    """`serve` gives each worker its own GPU, so a handoff between two goes over nccl (kvtransfer/choice.py): a plan
    costs it so; with no nccl cost in the profile (one measured on one GPU), over its fastest, and says so."""
    ipc, nccl = HandoffCost(base_s=0.0005, bytes_per_s=1e11), HandoffCost(base_s=0.02, bytes_per_s=1e9)
    both = make_profile(handoff={"cuda_ipc": ipc, "nccl": nccl})
    one_gpu = make_profile(handoff={"cuda_ipc": ipc})
    assert both.transport == "cuda_ipc" and both.cost_transport("nccl") == "nccl"
    assert one_gpu.cost_transport("nccl") == "cuda_ipc" and one_gpu.cost_transport(None) == "cuda_ipc"
    load = Workload([0.0], [list(range(300))], [4], shared_prefixes=False)
    over = {t: simulate(both, Layout(prefill=1, decode=1, transport=t), load)[0].ttft for t in ("cuda_ipc", "nccl")}
    assert over["nccl"] - over["cuda_ipc"] == pytest.approx(both.handoff_seconds(300, "nccl")
                                                            - both.handoff_seconds(300, "cuda_ipc"))
    cfg = PlanConfig(profile="p.json", gpus=2, rates="1", num_requests=20, disagg_policies="always")
    plan = run_plan(cfg, [both])
    assert plan.results["1P:1D"][0].ttft_p50 > run_plan(cfg, [one_gpu]).results["1P:1D"][0].ttft_p50 + 0.015
    save_profile(one_gpu, tmp_path / "one.json")
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", "plan", "--profile", str(tmp_path / "one.json"),
                           "--gpus", "2", "--rates", "1", "--num-requests", "20"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "note: KV handoffs between GPUs go over nccl, costed here as cuda_ipc" in proc.stdout
    assert "note: KV handoffs" not in plan_command("--gpus", "2", "--rates", "1", "--num-requests", "20").stdout


def test_an_nccl_handoff_moves_once_its_record_is_read_whatever_the_decode_worker_has_queued():
    """The decode worker posts an nccl receive as it reads the record, on the link's stream
    (kvtransfer/nccl/link.py): at the same cost as cuda_ipc, a prompt handed off while it decodes another request
    lands no later than one step launch after cuda_ipc's (what its loop may be doing when the record comes), not a
    step or two later behind the GPU work the worker has queued."""
    cost = HandoffCost(base_s=0.001, bytes_per_s=1e9)
    profile = make_profile(handoff={"cuda_ipc": cost, "nccl": cost})
    load = Workload([0.0, 0.5], [list(range(300)), list(range(1000, 1300))], [400, 4], shared_prefixes=False)
    runs = {t: simulate(profile, Layout(prefill=1, decode=1, transport=t), load) for t in ("cuda_ipc", "nccl")}
    assert runs["nccl"][0].first == pytest.approx(runs["cuda_ipc"][0].first, rel=1e-12)
    step = profile.host_launch_s + profile.decode.seconds(1, 700)  # the longest of request 0's decode steps
    wait = runs["nccl"][1].first - runs["cuda_ipc"][1].first
    assert abs(wait) <= profile.host_launch_s + 1e-9 < step


@pytest.mark.parametrize("transport", ["cuda_ipc", "nccl"])
def test_one_links_handoffs_land_one_after_another(transport):
    """Two prompts prefilled in one step go over one link: an nccl pair's transfers run in order on its stream, and a
    prefill worker's cuda_ipc copies in its loop. So the second lands a whole handoff after the first."""
    cost = HandoffCost(base_s=0.05, bytes_per_s=1e12)
    profile = make_profile(handoff={"cuda_ipc": cost, "nccl": cost})
    load = Workload([0.0, 0.0], [list(range(300)), list(range(1000, 1300))], [4, 4], shared_prefixes=False)
    first, second = sorted(r.first for r in simulate(profile, Layout(prefill=1, decode=1, transport=transport), load))
    assert second - first == pytest.approx(profile.handoff_seconds(300, transport), rel=0.05)


def test_a_phase_begins_once_every_request_of_the_one_before_has_finished():
    """A run served as the bench serves it (a warm-up, then load points): a phase's arrivals count from when the
    last request of the phase before finished; the engines, and what the router's per-request policy learned in
    one phase, carry into the next (one simulation, not one a phase)."""
    profile = make_profile()
    prompts = [list(range(1000 * i, 1000 * i + 100 + 50 * i)) for i in range(5)]
    load = Workload([0.0, 0.7, 1.2, 0.25, 0.5], prompts, [400, 5, 5, 8, 8], shared_prefixes=False, phases=[3, 0, 2])
    sim = Simulation(profile, Layout(prefill=1, decode=1, policy="auto"), load)
    done = sim.run()
    end = max(r.done for r in done[:3])
    assert sim.phase_starts == [0.0, end, end]
    assert [r.arrival for r in done[3:]] == [end + 0.25, end + 0.5]
    assert all(r.first > r.arrival for r in done[3:])
    # each engine's busy seconds as each phase began and at the end: what each phase added
    assert len(sim.phase_busy) == 4 and sim.phase_busy[0] == {name: 0.0 for name in sim.engines}
    assert all(sim.phase_busy[3][n] > sim.phase_busy[1][n] > 0 for n in sim.engines)
    # the policy measured the first phase (heartbeats, and a first token after them), so the last phase's requests
    # were chosen with those measurements, where a fresh run chooses its first ones blind
    assert done[0].estimate.remote_seconds is None
    assert all(r.estimate.remote_seconds is not None for r in done[3:])
    fresh = simulate(profile, Layout(prefill=1, decode=1, policy="auto"), Workload(
        [0.25, 0.5], prompts[3:], load.output_lens[3:], shared_prefixes=False))
    assert all(r.estimate.remote_seconds is None for r in fresh)


def test_a_rate_whose_arrivals_end_before_the_batches_fill_is_named_with_more_requests():
    """40 requests at 20 req/s arrive within two seconds, not four decodes long: the batches are still filling when
    they end, and TPOT comes out lower than with enough requests for a steady state, which the note asks for."""
    from scripts.planner.report import STEADY_LIVES, short_spans
    few = plan_for(make_profile(), input_len="32", output_len="200", rates="20", num_requests=40)
    (line,) = short_spans(few, 40)
    assert line.startswith("at 20 req/s the 40 requests arrive within")
    need = int(line.split("--num-requests ")[1].split()[0])
    assert need > 40
    enough = plan_for(make_profile(), input_len="32", output_len="200", rates="20", num_requests=4 * need)
    assert short_spans(enough, 4 * need) == []
    for name, (point,) in enough.items():
        assert point.span_s >= STEADY_LIVES * point.life_s
        assert point.tpot_p50 > few[name][0].tpot_p50, name
