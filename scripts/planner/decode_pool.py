"""An engine that decodes, simulated in aggregate: the steps of a batch that only decodes, run without walking the
batch.

On a decode worker while its prompts are prefilled elsewhere (`--disagg-policy always`), and beside the prompts it
prefills itself (`auto`, `never`, and colocated replicas, which prefill every prompt), every step is the same
decision for the sequences that decode: each computes one token, a sequence whose KV has landed joins at the next
step, and one leaves after its last token. So this engine keeps no per-step state in its sequences while they run.
The pool counts steps; a sequence's tokens are what it had when it joined plus the steps since (`Member`); its
blocks are taken as the steps that need them begin (a sequence needs a new block every `block_size` steps:
`by_residue` files the sequences by the step, modulo the block size, at which they cross into one); the next to
finish come from a heap; the step's cost from the batch size and the sum of the contexts, kept as they change. A run
of steps (`FastRun`) lasts to the next step in which a sequence computes its last token, or until something lands
(one step while one waits), and a sequence's tokens are written into it when it finishes. On a GPU it
shares with another engine a run is one step (`shared_step`), whose end the GPU re-times as the other's steps start
and end: no walk of the batch, but no bulk either.

What the scheduler would decide otherwise (scripts/planner/engine.py steps it: common/engine/scheduler.py):
sequences join in the order they landed, while `max_num_seqs` seats, the token budget and the free blocks allow;
one that lands after the next step was scheduled (`cutoff`) waits for the step after. A prompt prefilled here (or
a sequence recomputed) is the scheduler's to step, in the pool's `lane`: each step of the members is then one step
beside the scheduler's batch of the lane and of what waits, given the budget and seats the members leave
(`Scheduler.schedule(lane, len(members))`), so the scheduler never walks the members; a lane sequence joins them
once it decodes (`_settle`). Where the scheduler would do more (preempt a sequence for want of blocks, run more
decodes than its token budget), the pool hands its sequences to it as they stand (`pooled` False) and the engine
steps until the members' decision is the pool's again, then takes them back (`_repool`). While a request waits at
the router the pool steps one at a time, as the router tries again at each stepped engine's step (sim.py
`_dispatch`). The router sees the blocks taken by the steps begun (SimEngine's `catch_up`, before each placement),
as it does of a stepped engine; tests/test_planner_bulk.py checks that every request's times are those of stepping
one by one.
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from common.engine.sequence import PENDING, Sequence, SequenceStatus
from scripts.planner.engine import Done, SimEngine
from scripts.planner.fast_run import FastRun
from scripts.planner.sequences import TOKEN


@dataclass(eq=False, slots=True)
class Member:
    """A sequence in the pool's batch: its computed tokens before step s are `base + s - joined`."""

    seq: Sequence
    joined: int  # the pool's step in which it first decoded
    base: int  # its computed tokens then
    last: int  # the step in which it computes its last token

    def computed(self, step: int) -> int:
        return self.base + step - self.joined


@dataclass
class PoolDone:
    """A pool's run that ended: the sequences that computed their last token in its last step."""

    finishers: list[Sequence]
    first_end: float


@dataclass
class MixedDone:
    """A step of the members beside the scheduler's batch of the lane, ended: that batch's `Done`, and the members
    that computed their last token in it."""

    step: Done
    finishers: list[Sequence]


class DecodePool(SimEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pooled = True
        self.clock = 0  # steps run
        self.allocated = 0  # steps whose blocks are taken
        self.members: dict[Member, None] = {}  # in the order they joined, as the scheduler's `running`
        self.by_residue: list[dict[Member, None]] = [{} for _ in range(self.block_manager.block_size)]
        self.ends: list[tuple[int, int, Member]] = []  # (last step, order, member): the next to finish first
        self.order = itertools.count()
        self.context = 0  # the members' computed tokens before step `clock`
        self.unresolved: list[tuple[Sequence, int]] = []  # (sequence, index of its unseen token) once unpooled
        # The running sequences the scheduler steps beside the members, in the order it admitted them: prompts being
        # prefilled here, and the few that take a decode step before they may join (`_settle`)
        self.lane: list[Sequence] = []
        self.handovers = 0  # times the pool handed its batch to the scheduler

    # ---- runs ---------------------------------------------------------------------------------------
    def start(self, now: float, fast: bool = True) -> float | None:
        if self.pooled:
            self._settle()
            if not self._poolable():
                self._unpool()
        elif (parts := self._repoolable()) is not None:
            self._repool(*parts)
        if not self.pooled:
            return super().start(now, fast=False)  # one step at a time, as the scheduler decides
        self._allocate_to(self.clock + 1)
        if self.lane or not self._nothing_to_prefill():
            return self._start_mixed(now)
        self._admit()
        return self._start_run(now, fast)

    def _start_mixed(self, now: float) -> float | None:
        """The members' step beside the scheduler's batch of the lane and of what waits (the members' blocks for it
        taken first, as the scheduler allocates decodes before it admits): one step."""
        sched = self.scheduler
        admitted = len(sched.running)
        batch = self._schedule(self.lane, len(self.members))
        self.lane += sched.running[admitted:]
        if batch is None:
            return self._start_run(now, fast=False)
        self.fast = None
        return self._start_step(now, batch, len(self.members), self.context)

    def _start_run(self, now: float, fast: bool) -> float | None:
        """A run of the members' steps alone: to the next step in which one computes its last token, if `fast`."""
        if not self.members:
            self.cutoff = self.blocked_from = self.blocked_until = math.inf
            return None
        # Sequences left waiting (landed after the cutoff, or short of a seat or a block until the finished ones are
        # collected) are considered again at the next step, and a request waiting at the router (`fast` False) is
        # tried again as each step starts: then the run is one step
        k = self.ends[0][0] - self.clock + 1 if fast and not self.scheduler.waiting else 1
        while k > 1 and not self._blocks_for(self.clock + 1, self.clock + k):
            k //= 2
        p, d = self.profile, len(self.members)
        cost = p.decode_cost(d)
        first = p.host_launch_s + cost.seconds(d, self.context)
        self.fast = FastRun(now, k, first, cost.per_seq_context_s * d)
        self.shown_steps = 1  # the simulation shows the engine to the router once it has started (`_kick`)
        self.started, self.launch_end = now, now + min(p.host_launch_s, first)
        self.busy_until = now + self.fast.elapsed(k)
        self._block(self.busy_until, first + self.fast.growth * (k - 1), decode_only=True)
        return self.busy_until

    def shared_step(self, now: float) -> tuple[float, float, int, int]:
        if self.fast is None:  # a step of the scheduler's batch (beside the members, or handed over)
            return super().shared_step(now)
        assert self.fast.steps == 1, "a run of several steps on a shared GPU"  # each re-timed as the other's change
        return self.fast.first, 0.0, 0, len(self.members)

    def cut(self, now: float) -> float | None:
        """Something arrived, or wants blocks, during a run: it ends with the step in flight now, whose blocks are
        taken at once. Returns the new end, or None when the end stays (no run, or its last step is in flight)."""
        run = self.fast
        if run is None:
            return None
        k = self._take_begun(now)  # what comes next cannot take the blocks of the steps begun
        if k == run.steps:
            return None
        run.steps = k
        self.generation += 1
        self.busy_until = run.start + run.elapsed(k)
        self._block(self.busy_until, run.first + run.growth * (k - 1), decode_only=True, carry=False)
        return self.busy_until

    def catch_up(self, now: float) -> bool:
        """Whether the router's view of the engine is older than the step in flight at `now`: a stepped engine is
        shown as each step starts (its blocks taken, what finished the step before not yet freed). In a run the
        blocks of the steps begun are then taken, to be shown now."""
        run = self.fast
        if run is None or self.shown_steps >= run.steps or now - run.start < run.elapsed(self.shown_steps):
            return False  # no step has begun since
        self._take_begun(now)
        return True

    def _take_begun(self, now: float) -> int:
        """Takes the blocks of the run's steps begun by `now` (shown to the router once taken); returns how many
        have begun."""
        k = self.shown_steps = self.fast.in_flight(now)
        self._allocate_to(self.clock + k)
        return k

    def finish(self):
        if not self.pooled:
            return super().finish()
        if self.fast is None:  # a mixed step
            return MixedDone(super().finish(), self._advance(1))
        run, k, end = self.fast, self.fast.steps, self.busy_until
        self.fast = self.batch = self.busy_until = None
        self.busy_seconds += run.elapsed(k)
        self.steps += k
        # its first step's tokens came back once its second step was launched (a graph replay); a run of one step's
        # when it ended (on a shared GPU, as the GPU re-timed it)
        return PoolDone(self._advance(k), run.start + run.first + self.profile.host_launch_s if k > 1 else end)

    def _advance(self, k: int) -> list[Sequence]:
        """The members' k steps ended: the sequences that computed their last token in the last of them."""
        self._allocate_to(self.clock + k)
        self.clock += k
        self.context += len(self.members) * k
        finishers = []
        while self.ends and self.ends[0][0] < self.clock:
            m = heapq.heappop(self.ends)[2]
            del self.members[m]
            del self.by_residue[(m.joined - m.base) % len(self.by_residue)][m]
            self.context -= m.computed(self.clock)
            self._write(m)
            finishers.append(m.seq)
        return finishers

    def collect(self, done) -> tuple[list[Sequence], float]:
        if isinstance(done, Done):
            return super().collect(done)
        for seq, pos in self.unresolved:  # handed to the scheduler with the run's last token unseen
            if seq.status is SequenceStatus.RUNNING:  # (not preempted meanwhile: then it was dropped)
                seq.token_ids[pos] = TOKEN
        self.unresolved = []
        for seq in done.finishers:  # resolved now, after the next step was scheduled, as the scheduler does
            seq.token_ids[-1] = TOKEN
            self.scheduler.finish(seq, "length")
        if isinstance(done, MixedDone):
            seqs, first_end = super().collect(done.step)
            return done.finishers + seqs, first_end
        return done.finishers, done.first_end

    def _queued_tokens(self) -> int:
        """Members only decode: only the lane's prompts have chunks left."""
        if not self.pooled:
            return self.scheduler.queued_tokens()
        return self.scheduler.waiting_tokens() + sum(n for s in self.lane
                                                     if (n := len(s.token_ids) - s.num_computed_tokens) > 1)

    # ---- the pool's own ---------------------------------------------------------------------------------
    def _poolable(self) -> bool:
        """Whether the scheduler would step the members as the pool does: every decode (the members' and the lane's)
        within the token budget, and a free block for every member that needs one (else it preempts). The lane's
        decodes need none: a prompt's last token, or a sequence whose table holds its next block already."""
        return self._within_budget(len(self.members), self.lane) and self._blocks_for(self.clock, self.clock + 1)

    def _within_budget(self, members: int, lane: list[Sequence]) -> bool:
        """Whether the members' decodes and the lane's fit the token budget, as the scheduler takes decodes first."""
        lane_decodes = sum(len(s.token_ids) - s.num_computed_tokens == 1 for s in lane)
        return members + lane_decodes <= self.scheduler.max_num_batched_tokens

    def _settle(self) -> None:
        """The lane's sequences that now decode (their prompt done, or landed and admitted) join the members; those
        finished, or finishing with the token of the step in flight, leave it."""
        keep = []
        for s in self.lane:
            if s.status is not SequenceStatus.RUNNING or self._finishing(s):
                continue
            if self._joins(s):
                self._join(s)
            else:
                keep.append(s)
        self.lane = keep

    def _joins(self, seq: Sequence) -> bool:
        """Whether a running sequence may be a member: it decodes, and its table holds the blocks of its computed
        tokens and no more, as the pool counts a member's crossings (one admitted before its first step, whose
        reservation held its first token's place, or recomputed after a preemption, may hold its next block: it
        steps in the lane until its tokens reach it)."""
        return _decodes(seq) and len(seq.block_table) == -(-seq.num_computed_tokens // self.block_manager.block_size)

    def _repoolable(self) -> tuple[list[Sequence], list[Sequence]] | None:
        """Where the scheduler's batch is the pool's again: the running sequences that may be members (not
        finishing) and the lane (the others), where they are as `_poolable` asks; None where they are not."""
        sched, bs = self.scheduler, self.block_manager.block_size
        decoding, lane = [], []
        for s in sched.running:
            if not self._finishing(s):
                (decoding if self._joins(s) else lane).append(s)
        if (self._within_budget(len(decoding), lane)
                and sum(s.num_computed_tokens + 1 > len(s.block_table) * bs for s in decoding)
                <= self.block_manager.num_free_blocks):
            return decoding, lane
        return None

    def _repool(self, decoding: list[Sequence], lane: list[Sequence]) -> None:
        """The running sequences that decode on (`_repoolable`) become members again as they stand: each has its
        last step's token still unseen (the scheduler resolves it when it collects that step); those whose unseen
        token is their last finish then, outside the pool."""
        self.lane = lane
        for seq in decoding:
            self._join(seq)
        self.allocated = self.clock  # this step's blocks are still to take
        self.pooled = True

    def _nothing_to_prefill(self) -> bool:
        """Every sequence waiting has landed with its prompt's KV (none to prefill here, none preempted)."""
        return all(_decodes(s) for s in self.scheduler.waiting)

    def _finishing(self, seq: Sequence) -> bool:
        return seq.token_ids[-1] == PENDING and self.scheduler._pending_is_last(seq)

    def _admit(self) -> None:
        """The scheduler's admission of landed sequences (each holds its prompt's blocks and has its first token):
        in order, while seats and the token budget last, passing one that waits for a block; those that landed after
        the cutoff wait for the next step, unless nothing else would run."""
        waiting = self.scheduler.waiting
        if not waiting:
            return
        on_time = len(waiting)
        while on_time and waiting[on_time - 1].arrival_time > self.cutoff:
            on_time -= 1
        if not self._admit_from(on_time) and not self.members:
            self._admit_from(len(waiting))

    def _admit_from(self, limit: int) -> bool:
        sched, waiting, admitted = self.scheduler, self.scheduler.waiting, False
        budget = sched.max_num_batched_tokens - len(self.members)
        i = 0
        while i < limit and budget > 0 and len(sched.running) < sched.max_num_seqs:
            seq = waiting[i]
            if not self.block_manager.allocate(seq, seq.num_tokens):
                i += 1
                continue
            del waiting[i]
            limit -= 1
            seq.status = SequenceStatus.RUNNING
            sched.running.append(seq)
            self._join(seq)
            budget -= 1
            admitted = True
        return admitted

    def _join(self, seq: Sequence) -> None:
        """`seq` decodes from step `clock` on (its tokens so far count as one: it has its first, or an unseen one)."""
        m = Member(seq, self.clock, seq.num_computed_tokens,
                   self.clock + seq.sampling.max_tokens - seq.num_completion_tokens - 1)
        self.members[m] = None
        self.by_residue[(m.joined - m.base) % len(self.by_residue)][m] = None
        heapq.heappush(self.ends, (m.last, next(self.order), m))
        self.context += m.base

    def _blocks_for(self, start: int, end: int) -> bool:
        """Whether the free blocks cover the members' crossings in steps start..end-1; at once where they cover the
        most there could be (each member crosses once in every block_size steps, or in fewer)."""
        free = self.block_manager.num_free_blocks
        most = -(-(end - start) // len(self.by_residue)) * len(self.members)
        return most <= free or self._crossings(start, end) <= free

    def _crossings(self, start: int, end: int) -> int:
        """New blocks the members need in steps start..end-1 (one each every block_size steps)."""
        bs, n = len(self.by_residue), end - start
        total = (n // bs) * len(self.members)
        return total + sum(len(self.by_residue[s % bs]) for s in range(start + n // bs * bs, end))

    def _allocate_to(self, end: int) -> None:
        """Takes the blocks of steps up to `end` (exclusive): in one call, the steps' crossings in their order, as
        one call a step would take them."""
        if end <= self.allocated:
            return
        bs, by_residue = len(self.by_residue), self.by_residue
        if crossing := [m.seq for s in range(self.allocated, end) for m in by_residue[s % bs]]:
            ok = self.block_manager.append_blocks(crossing)
            assert ok, "a pooled step without the blocks it counted on"
        self.allocated = end

    def _write(self, m: Member) -> None:
        """The member's tokens up to step `clock` into its sequence, the newest still unseen (PENDING) as the
        scheduler leaves it until the step is collected, and its full blocks into the prefix cache."""
        seq, steps = m.seq, self.clock - m.joined
        if steps:
            seq.num_computed_tokens = m.base + steps
            seq.token_ids.extend(itertools.repeat(TOKEN, steps - 1))
            seq.token_ids.append(PENDING)
            self.block_manager.commit(seq, m.base)  # the blocks full before the newest token

    def _unpool(self) -> None:
        """The scheduler steps from now on: every member's tokens written into its sequence, the newest unseen until
        the run that computed it is collected (the scheduler then schedules the next step). One that joined as this
        step starts has no token of the pool's: its unseen one is the scheduler's step's, resolved with it."""
        for m in self.members:
            self._write(m)
            if m.joined < self.clock:
                self.unresolved.append((m.seq, m.seq.num_computed_tokens))
        self.members.clear()
        self.lane = []
        self.ends.clear()
        self.by_residue = [{} for _ in self.by_residue]
        self.context = 0
        self.pooled = False
        self.handovers += 1


def _decodes(seq: Sequence) -> bool:
    """Its next step computes one token past its prompt: it has its first token (or one unseen). A prompt whose last
    chunk is one token also has one to compute, but that step gives its first token, which the pool would not see."""
    return seq.num_uncomputed() == 1 and seq.num_completion_tokens > 0
