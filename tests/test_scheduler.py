from __future__ import annotations

import copy as copy_module
import pickle
import random
from collections import deque

import pytest

from common.engine.block_manager import BlockManager
from common.engine.scheduler import Scheduler
from common.engine.sequence import PENDING, Sequence, SequenceStatus
from common.engine.waiting_queue import WaitingQueue
from common.sampling_params import SamplingParams

EOS = 0


def make(num_blocks=64, block_size=4, max_seqs=8, budget=64, max_len=1024, caching=True):
    bm = BlockManager(num_blocks, block_size, caching)
    return Scheduler(bm, max_seqs, budget, max_len, [EOS]), bm


def add(s: Scheduler, rid: str, n: int, max_tokens: int = 4, **kw) -> Sequence:
    seq = Sequence(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens, **kw))
    s.add(seq)
    return seq


def run_step(s: Scheduler, token: int = 7):
    batch = s.schedule()
    if batch is None:
        return None, []
    return batch, s.resolve(batch, s.advance(batch), [token] * len(batch.seqs))


def test_long_prompt_is_chunked_under_the_budget_and_decodes_go_first():
    s, _ = make(budget=16)
    short = add(s, "short", 3, max_tokens=10)
    batch, _ = run_step(s)
    assert batch.num_new_tokens == [3]
    long = add(s, "long", 40)
    chunks = []
    while long.num_computed_tokens < long.num_prompt_tokens:
        batch, _ = run_step(s)
        assert batch.seqs[0] is short and batch.num_new_tokens[0] == 1  # the decode is never starved
        assert batch.num_tokens <= 16
        chunks.append(batch.num_new_tokens[1])
    assert chunks == [15, 15, 10]
    assert long.num_completion_tokens == 1  # a token only once the whole prompt is in


def test_a_prefill_chunk_cap_keeps_decodes_at_pace():
    """max_prefill_tokens (a decode worker prefilling prompts itself): every step still carries every decode,
    and the prompts share at most the cap, in chunks."""
    s, _ = make(budget=64)
    s.max_prefill_tokens = 8
    decodes = [add(s, f"d{i}", 3, max_tokens=30) for i in range(3)]
    while any(d.num_computed_tokens < 3 for d in decodes):
        run_step(s)
    a, b = add(s, "a", 20), add(s, "b", 6)
    while a.num_completion_tokens == 0 or b.num_completion_tokens == 0:
        batch, _ = run_step(s)
        assert batch.seqs[:3] == decodes and batch.num_new_tokens[:3] == [1, 1, 1]
        assert sum(batch.num_new_tokens[3:]) <= 8
    assert a.num_completion_tokens == 1 and b.num_completion_tokens == 1


def test_max_num_seqs_limits_the_running_set():
    s, _ = make(max_seqs=2)
    for i in range(4):
        add(s, f"r{i}", 3)
    batch, _ = run_step(s)
    assert len(batch.seqs) == 2 and len(s.waiting) == 2


def test_finish_by_eos_length_stop_ids_and_max_model_len():
    s, bm = make(max_len=8)
    eos = add(s, "eos", 3, max_tokens=10)
    run_step(s, token=EOS)
    assert eos.finish_reason == "stop" and eos.completion_token_ids == [EOS]
    ign = add(s, "ign", 3, max_tokens=2, ignore_eos=True)
    run_step(s, token=EOS)
    run_step(s, token=EOS)
    assert ign.finish_reason == "length" and ign.num_completion_tokens == 2
    stop = add(s, "stop", 3, max_tokens=10, stop_token_ids=[5])
    run_step(s, token=5)
    assert stop.finish_reason == "stop"
    capped = add(s, "capped", 6, max_tokens=100)
    while not capped.is_finished:
        run_step(s)
    assert capped.finish_reason == "length" and capped.num_tokens == 8
    assert bm.num_free_blocks == bm.num_blocks


def test_preemption_by_recompute_when_blocks_run_out():
    s, bm = make(num_blocks=6, block_size=4)
    a = add(s, "a", 7, max_tokens=12)
    b = add(s, "b", 7, max_tokens=12)
    run_step(s)  # both prefilled: 2 blocks each, 2 free
    preempted = False
    for _ in range(40):
        run_step(s)
        if b.status == SequenceStatus.WAITING:
            preempted = True
            assert b.block_table == [] and b.num_computed_tokens == 0
        if not s.has_unfinished():
            break
    assert preempted and s.num_preemptions >= 1
    assert a.num_completion_tokens == 12 and b.num_completion_tokens == 12
    assert bm.num_free_blocks == bm.num_blocks


def test_a_preempted_request_that_finds_no_cached_prefix_on_its_return_reports_none() -> None:
    """Preemption bookkeeping: the cached-token count is reset with the block table, so what a request reports as
    taken from the prefix cache is what its last (re)computation took."""
    s, bm = make(num_blocks=16, block_size=4)
    add(s, "a", 9, max_tokens=1)
    run_step(s)  # a finishes: its two full prompt blocks stay cached
    c = add(s, "c", 9, max_tokens=8)
    run_step(s)
    assert c.num_cached_tokens == 8  # the same prompt: both blocks hit
    s._preempt(c)
    bm.clear_cache()  # its prefix is evicted while it waits
    run_step(s)
    assert c.num_computed_tokens == 10 and c.num_cached_tokens == 0


def test_abort_frees_blocks_of_running_and_waiting():
    s, bm = make(max_seqs=1)
    r = add(s, "running", 5, max_tokens=10)
    w = add(s, "waiting", 5)
    run_step(s)
    s.finish(r, "abort")
    s.finish(w, "abort")
    assert r.finish_reason == w.finish_reason == "abort"
    assert bm.num_free_blocks == bm.num_blocks and not s.has_unfinished()


def test_aborted_while_in_flight_gets_no_token():
    s, bm = make()
    seq = add(s, "x", 3, max_tokens=5)
    batch = s.schedule()
    olds = s.advance(batch)
    s.finish(seq, "abort")
    assert s.resolve(batch, olds, [7]) == []
    assert seq.num_completion_tokens == 0 and bm.num_free_blocks == bm.num_blocks


# ---- overlapped scheduling: step N+1 is scheduled before step N's tokens are known ----------------------
def run_overlapped(s: Scheduler, tokens_for, steps: int = 100) -> int:
    """Drives the scheduler one step behind, like LLMEngine with overlap; tokens_for(seq, step) picks the
    token each row samples. Returns the steps taken."""
    in_flight = None
    for step in range(steps):
        batch = s.schedule()
        launched = (batch, s.advance(batch), [tokens_for(q, step) for q in batch.seqs]) if batch else None
        if in_flight:
            s.resolve(*in_flight)
        in_flight = launched
        if in_flight is None and not s.has_unfinished():
            return step
    raise AssertionError("did not finish")


def test_overlap_lagged_eos_finishes_once_and_emits_nothing_after_it():
    s, bm = make()
    a = add(s, "a", 5, max_tokens=50)
    b = add(s, "b", 6, max_tokens=50)
    # a samples EOS on its 3rd token; by then its 4th step is already scheduled.
    run_overlapped(s, lambda q, step: EOS if (q is a and q.num_completion_tokens == 3) else 7)
    assert a.finish_reason == "stop" and a.completion_token_ids[-1] == EOS
    assert a.num_completion_tokens == 3 and PENDING not in a.token_ids
    assert b.finish_reason == "length" and b.num_completion_tokens == 50
    assert bm.num_free_blocks == bm.num_blocks  # freed exactly once: a double free would overcount


def test_overlap_never_passes_max_tokens_or_schedules_a_finished_prefill():
    s, bm = make()
    seqs = [add(s, f"r{i}", 3 + i, max_tokens=1 + i) for i in range(5)]
    scheduled = {q.request_id: 0 for q in seqs}

    def tokens_for(q, step):
        scheduled[q.request_id] += 1
        return 7
    run_overlapped(s, tokens_for)
    for i, q in enumerate(seqs):
        assert q.finish_reason == "length" and q.completion_token_ids == [7] * (1 + i)
        assert scheduled[q.request_id] == 1 + i  # one prefill, then one decode per further token: no wasted row
    assert bm.num_free_blocks == bm.num_blocks


def test_overlap_caches_generated_blocks_under_their_sampled_tokens():
    """A block filled by generated tokens is registered once its tokens are known, not while a PENDING one is in
    it: a prompt that repeats a finished request's prompt and answer finds every full block but the last in the
    cache."""
    s, bm = make(block_size=4)
    a = add(s, "a", 5, max_tokens=12)
    run_overlapped(s, lambda q, step: 100 + step)  # every token a different one
    assert a.num_completion_tokens == 12 and PENDING not in a.token_ids
    again = Sequence("again", a.token_ids[:], SamplingParams(max_tokens=1))
    assert bm.allocate(again, again.num_tokens)
    assert again.num_cached_tokens == 16  # 17 tokens: blocks 0-3 hit (the last token is always recomputed)


def test_overlap_preemption_drops_the_pending_token_and_recomputes():
    s, bm = make(num_blocks=6, block_size=4, budget=64)
    seqs = [add(s, f"r{i}", 7, max_tokens=12) for i in range(3)]
    run_overlapped(s, lambda q, step: 7, steps=400)
    assert s.num_preemptions > 0
    for q in seqs:
        assert q.finish_reason == "length" and q.completion_token_ids == [7] * 12
    assert bm.num_free_blocks == bm.num_blocks


# ---- handed-off sequences (disaggregated decode): they wait in `waiting` holding their prompt's blocks --------
def hand_off(s: Scheduler, bm: BlockManager, rid: str, n: int, max_tokens: int, token: int = 7) -> Sequence | None:
    """LLMEngine.reserve then admit_prefilled: blocks for the prompt outside the scheduler, then (the KV in) the
    sequence joins `waiting` with its prompt computed and its first token. None if the blocks are not free."""
    seq = Sequence(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens))
    if not bm.allocate(seq, seq.num_tokens, use_cache=False):
        return None
    seq.status = SequenceStatus.WAITING
    seq.num_computed_tokens = seq.num_prompt_tokens
    bm.commit(seq, 0)
    seq.token_ids.append(token)
    s.add(seq)
    return seq


def test_overlap_preempted_head_does_not_deadlock_handed_off_sequences_behind_it():
    """A decode worker under overload: b is preempted while its step is in flight (scheduled in N, preempted
    scheduling N+1, then N resolved), and the router reserves the blocks it freed (and a's, once a finishes)
    for handed-off prompts that land behind b in `waiting`, holding them. b needs more blocks than are left, so
    it cannot be admitted, and nothing runs to free any: the sequences that hold their KV must pass it. (The
    planner's simulator stalled so: scripts/planner/sim.py, 29P:3D, long-short at 2048 req/s.)"""
    s, bm = make(num_blocks=6, block_size=4)
    pending = deque([("a", 11, 4), ("b", 7, 8), ("c", 7, 6), ("d", 11, 4)])
    landed: list[Sequence] = []
    in_flight = None
    for _ in range(100):
        while pending and (seq := hand_off(s, bm, *pending[0])):  # the router reserves whatever is free
            landed.append(seq)
            pending.popleft()
        batch = s.schedule()
        launched = (batch, s.advance(batch), [7] * len(batch.seqs)) if batch else None
        if in_flight:
            s.resolve(*in_flight)
        in_flight = launched
        if in_flight is None and not s.has_unfinished() and not pending:
            break
    else:
        raise AssertionError(f"stalled: waiting {[q.request_id for q in s.waiting]}, "
                             f"{bm.num_free_blocks} of {bm.num_blocks} blocks free, nothing running")
    a, b, c, d = landed
    assert b.num_preemptions == 1  # recomputed: its prompt and first token as a prompt
    for q in landed:
        assert q.finish_reason == "length" and q.completion_token_ids == [7] * q.sampling.max_tokens
    assert bm.num_free_blocks == bm.num_blocks  # no block leaked


# ---- the waiting queue's running count of tokens to compute (common/engine/waiting_queue.py) ----------------
def uncomputed(seqs) -> int:
    return sum(len(q.token_ids) - q.num_computed_tokens for q in seqs)


def test_waiting_queue_counts_what_joins_and_gives_back_what_leaves():
    seqs = [Sequence(f"r{i}", list(range(1, 3 + i)), SamplingParams(max_tokens=4)) for i in range(6)]
    w = WaitingQueue(seqs[:2])
    w.append(seqs[2])
    w.appendleft(seqs[3])
    w.extend(seqs[4:5])
    w += [seqs[5]]
    assert w.tokens == uncomputed(w) == uncomputed(seqs)
    for change in (lambda: w.pop(), lambda: w.popleft(), lambda: w.remove(seqs[4]), lambda: w.__delitem__(1),
                   lambda: w.insert(1, seqs[4]), lambda: w.__setitem__(0, seqs[3]), lambda: w.extendleft([seqs[5]])):
        change()
        assert w.tokens == uncomputed(w)
        assert all((q in w) == any(q is x for x in w) for q in seqs)
    for copy in (w.copy(), pickle.loads(pickle.dumps(w)), copy_module.deepcopy(w)):
        assert isinstance(copy, WaitingQueue) and copy.tokens == w.tokens == uncomputed(copy)
    joined = WaitingQueue(seqs[:2]) + WaitingQueue(seqs[2:4])
    assert isinstance(joined, WaitingQueue) and joined.tokens == uncomputed(seqs[:4])
    with pytest.raises(TypeError, match="waits once"):
        w * 2
    seqs[0].num_computed_tokens = 1  # as a prefix-cache hit would, just before it leaves: its own count goes back
    w.clear()
    assert w.tokens == 0 and not w and seqs[0] not in w


def test_scheduler_waiting_tokens_stay_the_sum_over_prefix_hits_preemptions_handoffs_and_aborts():
    """A small, crowded engine driven at random, steps overlapped: after every change the running count is the sum
    over the waiting sequences (prompts that repeat one another hit the prefix cache as they are admitted)."""
    rng = random.Random(0)
    s, bm = make(num_blocks=24, block_size=4, max_seqs=4, budget=16)
    prompts = [list(range(1, 13)), list(range(1, 9)) + [50, 51], list(range(30, 37))]
    seqs: list[Sequence] = []
    in_flight = None
    preemptions = hits = 0
    for step in range(400):
        for _ in range(rng.randrange(3)):
            if rng.random() < 0.3:
                seq = hand_off(s, bm, f"h{step}", rng.randrange(3, 9), rng.randrange(1, 6))
            else:
                seq = Sequence(f"p{step}", list(rng.choice(prompts)), SamplingParams(max_tokens=rng.randrange(1, 8)))
                s.add(seq)
            if seq is not None:
                seqs.append(seq)
        if seqs and rng.random() < 0.1:
            s.finish(rng.choice(seqs), "abort")
        assert s.waiting_tokens() == uncomputed(s.waiting)
        batch = s.schedule()
        assert s.waiting_tokens() == uncomputed(s.waiting)
        launched = (batch, s.advance(batch), [7] * len(batch.seqs)) if batch else None
        if in_flight:
            s.resolve(*in_flight)
        in_flight = launched
        assert s.waiting_tokens() == uncomputed(s.waiting)
        preemptions, hits = s.num_preemptions, bm.cache_hit_tokens
    assert preemptions > 0 and hits > 0  # both ways a waiting sequence's count changes were taken
