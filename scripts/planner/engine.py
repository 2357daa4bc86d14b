"""One simulated engine (a prefill, decode or colocated worker): the engine's own scheduler and block manager
(common/engine/scheduler.py, block_manager.py: pure Python, driven here as the worker drives them), with each
step's duration taken from the profile instead of a GPU.

A step is schedule -> advance, then at its end resolve with a sampled token for every row that completes one.
A step has two parts: the host's, launching it (`host_seconds`: `host_launch_s` for a decode-only step, which
replays a CUDA graph, and for prompts that replay a prompt graph; plus the eager prefill floor `prefill_eager.base_s`
for prompt tokens past the graphs, which run eagerly and whose floor is their kernel launches), then the rest on the
GPU. Alone on a GPU they add up to the profile's step. Prompt tokens are costed padded, as the engine runs them.
Overlapped scheduling (common/engine/llm_engine.py `step`) launches the next step before it collects this one's
tokens, so they reach the worker when the next step's launch ends (`launch_end`); scripts/planner/sim.py
delivers them then. It also schedules the next step while this one runs, once the host has launched this one: behind
a prompt step then, behind a decode step a lead before it ends if that is later (late launch,
common/engine/launch_clock.py, the same constants). A request that arrives after that point (`cutoff`) waits for the
step after. From that point the worker takes no message for the host's time to schedule and launch (the profile's
`launch_prep_s`), then takes them again while it waits for the step's tokens (`polls_at`; common/worker/runtime.py
`Worker._meanwhile`).

Engines that decode run their decodes in aggregate, several steps at once where nothing changes between them
(scripts/planner/decode_pool.py: `fast`, a run of steps, is theirs); this stepping is theirs when they hand over.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from common import protocol as P
from common.engine.launch_clock import LEAD_PREP_FACTOR, LEAD_STEP_SHARE
from common.engine.scheduler import ScheduledBatch, Scheduler
from common.engine.sequence import Sequence, SequenceStatus
from scripts.planner.block_pool import BlockPool
from scripts.planner.fast_run import FastRun
from scripts.planner.profile import Profile
from scripts.planner.sequences import TOKEN, sequence

# How fast a GPU's clock follows its load, the time constant of an engine's `heat`: prompt steps run back to back
# were slower within their first second, and one after a 0.5 s pause ran as fast as the first (stop 26's probe).
SUSTAIN_S = 0.5


@dataclass
class Done:
    """A step (or fast run) that ended, its tokens still to collect."""

    batch: ScheduledBatch
    olds: list[int]
    first_end: float


class SimEngine:
    def __init__(self, name: str, role: str, profile: Profile, max_prefill_tokens: int | None = None,
                 prefix_caching: bool = True, spares: BlockPool | None = None,
                 num_blocks: int | None = None):
        self.name, self.role, self.profile = name, role, profile
        self.block_manager = (spares or BlockPool()).take(num_blocks or profile.num_kv_blocks, profile.block_size,
                                                          prefix_caching)
        self.scheduler = Scheduler(self.block_manager, profile.max_num_seqs, profile.max_num_batched_tokens,
                                   max_model_len=10**9, eos_token_ids=[])
        if max_prefill_tokens is not None:
            self.scheduler.max_prefill_tokens = max_prefill_tokens
        self.batch: ScheduledBatch | None = None
        self.olds: list[int] = []
        self.fast: FastRun | None = None
        self.shown_steps = 0  # of the fast run in flight, the steps begun when the router last saw the engine
        self.busy_until: float | None = None  # end of the step (or fast run) in flight
        self.generation = 0  # bumped when a fast run is cut: its old end event is stale
        self.step_time = self.step_end = 0.0
        self.rows = 0  # the decode rows of the step in flight
        self.started = self.launch_end = 0.0  # when the step in flight began, and when its launch ends
        self.busy_seconds = 0.0
        # The engine's recent share of time in prompt steps (an exponential average, SUSTAIN_S), as of `heat_t`:
        # how far its prompt steps run at the profile's sustained pace rather than their pace alone.
        self.heat, self.heat_t = 0.0, 0.0
        self.steps = 0
        self.prefill_tokens_run = 0
        self.prompt_steps = 0  # steps with prompt tokens (they do not overlap here: each is its batch's)
        self.prompt_seconds = 0.0
        # The worker schedules step N+1 while step N runs (overlapped scheduling): a prompt step's successor as
        # soon as it starts, a decode step's a lead before it ends (late launch, common/engine/launch_clock.py).
        # What arrives after that (a sequence's `arrival_time`, simulated seconds here) waits for the step after.
        # inf: nothing in flight, the next step takes all.
        self.cutoff = math.inf
        # While the worker's loop schedules and launches the next step, reading no message. On a CPU the launch
        # computes the step: the loop is blocked through all of it, and the next step takes all that came.
        self.blocked_from = self.blocked_until = math.inf
        self.carried = (math.inf, math.inf)  # the span of the step before the one in flight (`_block`)
        self.synchronous = profile.device == "cpu"
        # The host's time to schedule and launch a step, as the engine's launch clock takes it, and its part of the
        # lead before a decode step's end at which the next one is scheduled (LaunchClock.in_flight)
        self.prep = profile.launch_prep_s or profile.host_launch_s
        self.lead_prep = LEAD_PREP_FACTOR * self.prep
        # The fast run whose steps' blocked spans (`_fast_window`) are kept, and those spans by step
        self.windows_of: FastRun | None = None
        self.windows: dict[int, tuple[float, float]] = {}

    # ---- what the router sees -------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    def load(self, now: float) -> P.WorkerLoad:
        """The heartbeat's load record at `now`, as common/engine/llm_engine.py's `LLMEngine.load` makes it (keep in
        step; that module loads torch): a fast run's steps ended by then counted, as stepping counts them."""
        sched, steps, busy = self.scheduler, self.steps, self.busy_seconds
        if (run := self.fast) is not None:
            ended = run.in_flight(now) - 1
            steps, busy = steps + ended, busy + run.elapsed(ended)
        return P.WorkerLoad(
            queued_requests=len(sched.waiting),
            queued_tokens=self._queued_tokens(),
            running_requests=len(sched.running),
            kv_blocks_total=self.block_manager.num_blocks,
            kv_blocks_free=self.block_manager.num_free_blocks,
            busy_steps=steps,
            busy_seconds=busy,
            prefill_tokens_run=self.prefill_tokens_run,
            prompt_steps=self.prompt_steps,
            prompt_seconds=self.prompt_seconds,
            prompt_batches=self.prompt_steps)

    def _queued_tokens(self) -> int:
        return self.scheduler.queued_tokens()

    # ---- requests in --------------------------------------------------------------------------------
    def add_prompt(self, rid: str, prompt: list[int], output_len: int, prefill_only: bool,
                   now: float = 0.0, keys: list[int] | None = None) -> Sequence:
        """`keys`: the prompt's chain keys (the router's `PromptKeys.keys`), if known: not hashed again."""
        seq = self._sequence(rid, prompt, output_len, prefill_only, keys)
        seq.arrival_time = now
        self.scheduler.add(seq)
        return seq

    def reserve(self, rid: str, prompt: list[int], output_len: int,
                keys: list[int] | None = None) -> Sequence | None:
        """Decode side of a handoff: blocks for the prompt, outside the scheduler (LLMEngine.reserve)."""
        seq = self._sequence(rid, prompt, output_len, False, keys)
        if not self.block_manager.allocate(seq, seq.num_tokens, use_cache=False):
            return None
        seq.status = SequenceStatus.RESERVED
        return seq

    def _sequence(self, rid: str, prompt: list[int], output_len: int, prefill_only: bool,
                  keys: list[int] | None) -> Sequence:
        caching = self.block_manager.enable_prefix_caching
        seq = sequence(rid, prompt, output_len, prefill_only, caching)
        if caching and keys is not None:
            seq.prompt_keys = list(keys)  # its own: the block manager may add to them
        return seq

    def land(self, seq: Sequence, now: float = 0.0) -> bool:
        """The KV is in: the sequence holds its prompt's KV and its first token, and joins continuous batching
        (LLMEngine.admit_prefilled). Returns whether that first token was its last."""
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = seq.num_prompt_tokens
        self.block_manager.commit(seq, 0)
        seq.token_ids.append(TOKEN)
        seq.arrival_time = now  # at this engine's scheduler
        self.scheduler.add(seq)
        if reason := self.scheduler.finish_reason(seq, TOKEN, seq.num_tokens):
            self.scheduler.finish(seq, reason)
            return True
        return False

    def release(self, seq: Sequence) -> None:
        """A prefill worker's held blocks, once the decode worker has the KV."""
        self.block_manager.free_blocks(seq)

    # ---- steps --------------------------------------------------------------------------------------
    def step_seconds(self, batch: ScheduledBatch, pooled: int = 0, pooled_context: int = 0) -> float:
        """`pooled`: decodes beside the batch's (a pool's members, holding `pooled_context` tokens)."""
        p, d = self.profile, batch.num_decodes
        decodes, context = d + pooled, pooled_context + sum(s.num_computed_tokens for s in batch.seqs[:d])
        seconds = p.host_launch_s + p.decode_cost(decodes).seconds(decodes, context)
        tokens = batch.num_new_tokens[d:]
        if tokens:
            padded = p.padded(sum(tokens))
            pc, _ = p.prefill_cost(padded)
            seconds += pc.step_seconds(padded, [(n, s.num_computed_tokens) for s, n in zip(batch.seqs[d:], tokens)])
            if decodes:
                seconds += p.mixed_step_s
        return seconds

    def host_seconds(self, batch: ScheduledBatch) -> float:
        """The host's part of a step, launching it: prompts that run eagerly launch their kernels one by one (the
        floor of their cost, launch-bound); a decode-only step, and prompts that replay a prompt graph, launch a
        graph."""
        if batch.decode_only:
            return self.profile.host_launch_s
        return self.profile.prompt_launch(sum(batch.num_new_tokens[batch.num_decodes:]))

    def _schedule(self, running: list[Sequence] | None = None, pooled: int = 0) -> ScheduledBatch | None:
        """The scheduler's next batch from what had arrived by the cutoff (all of it if the step would run nothing);
        of `running` beside `pooled` decodes stepped apart (Scheduler.schedule), if given."""
        waiting, late = self.scheduler.waiting, []
        while waiting and waiting[-1].arrival_time > self.cutoff:
            late.append(waiting.pop())
        batch = self.scheduler.schedule(running, pooled)
        waiting.extend(reversed(late))
        if batch is None and late and not pooled:
            batch = self.scheduler.schedule(running)
        return batch

    def polls_at(self, now: float) -> float:
        """When the worker's loop next takes a message: now, unless it is scheduling and launching the next step
        (then when that is done)."""
        if self.busy_until is None:
            return now
        for blocked, until in self._launch_windows(now):
            if blocked < now < until:
                now = until
        return now

    def _launch_windows(self, now: float) -> tuple[tuple[float, float], ...]:
        """When the worker launches the step after the one in flight at `now` (a fast run's current one), from when
        until when, and the same for the step before it (a launch may run past the end of the step it follows)."""
        if self.fast is None:
            return self.carried, (self.blocked_from, self.blocked_until)
        k = self.fast.in_flight(now)
        if k == 1:
            return self.carried, self._fast_window(1)
        return self._fast_window(k - 1), self._fast_window(k)

    def _fast_window(self, i: int) -> tuple[float, float]:
        """The blocked span that follows the fast run's step i (counted from 1), worked out once per run."""
        run = self.fast
        if self.windows_of is not run:
            self.windows_of, self.windows = run, {}
        if (window := self.windows.get(i)) is None:
            window = self.windows[i] = self._window(run.start + run.elapsed(i), run.first + run.growth * (i - 1),
                                                    decode_only=True)[1:]
        return window

    def _lead(self, step: float) -> float:
        """How long before a decode step ends the worker schedules the next one (LaunchClock.in_flight)."""
        return self.lead_prep + LEAD_STEP_SHARE * step

    def start(self, now: float, fast: bool = True) -> float | None:
        """Starts the next step, if there is work; returns when it ends. (`fast`: whether a pool may run several
        steps at once, scripts/planner/decode_pool.py; a step here is one.)"""
        batch = self._schedule()
        if batch is None:
            self.cutoff = self.blocked_from = self.blocked_until = math.inf
            return None
        return self._start_step(now, batch)

    def _start_step(self, now: float, batch: ScheduledBatch, pooled: int = 0, pooled_context: int = 0) -> float:
        """One step of `batch` (beside `pooled` decodes stepped apart: `step_seconds`); returns when it ends."""
        self.step_time = self.step_seconds(batch, pooled, pooled_context)
        if not batch.decode_only:
            self.step_time *= 1 + (self.profile.sustained_prefill_factor - 1) * self._heat_at(now)
        self.started, self.launch_end = now, now + min(self.host_seconds(batch), self.step_time)
        self.batch, self.olds = batch, self.scheduler.advance(batch)
        self.rows = batch.num_decodes + pooled
        self.busy_until = self.step_end = now + self.step_time
        self._block(self.busy_until, self.step_time, batch.decode_only)
        return self.busy_until

    def shared_step(self, now: float) -> tuple[float, float, int, int]:
        """The step started at `now`, as a GPU shared with another engine takes it (scripts/planner/gpu.py): its
        seconds alone, its launch-bound floor (0 for a graph replay), its longest prompt (0: it only decodes) and its
        decode rows."""
        batch = self.batch
        launch = 0.0 if batch.decode_only else self.launch_end - now
        longest = max((s.num_prompt_tokens for s in batch.seqs[batch.num_decodes:]), default=0)
        return self.step_time, launch, longest, self.rows

    def _block(self, end: float, last_step: float, decode_only: bool, carry: bool = True) -> None:
        """`cutoff` and the blocked span for the step (or a fast run's last step) ending at `end`; with `carry`, a new
        step's: the one before's span is kept (`carried`), as its launch may outlast it."""
        if carry:
            self.carried = (self.blocked_from, self.blocked_until)
        self.cutoff, self.blocked_from, self.blocked_until = self._window(end, last_step, decode_only)

    def _window(self, end: float, step: float, decode_only: bool) -> tuple[float, float, float]:
        """(cutoff, blocked from, blocked until) of a step of `step` seconds ending at `end`: the next step is
        scheduled at the cutoff, and its launch blocks the loop for the host's time. The loop schedules it only once
        it has launched this one (LLMEngine.step launches, then collects; a server steps again after), so never
        before this step's start plus the host's launch work: where that work nears the step (a small model), a
        prompt arriving while a decode step runs still rides the next launch (docs/gpu_runs/stop28_arrival_probe.py).

        Behind a decode step the loop is deaf from the lead before its end, or from its start where the lead covers
        the whole step (launch work near the step), for the host's launch work, which may run past the step's end: a
        KV handoff that lands as a decode step starts waits for most of a launch (the served timelines, stop 29)."""
        if self.synchronous:
            return math.inf, end - step, end
        prep = self.prep
        launched = end - step + prep  # this step launched
        if not decode_only:
            cutoff = min(launched, end)
            return cutoff, cutoff, min(end, cutoff + prep)
        lead = end - self._lead(step)
        begin = max(end - step, lead)
        return min(max(launched, lead), end), begin, begin + prep

    def cut(self, now: float) -> float | None:
        """Something arrived, or wants blocks: a step runs to its end (a pool's run of steps may end sooner). Returns
        the new end, or None when the end stays."""
        return None

    def finish(self) -> Done:
        """The step in flight ended. Its tokens wait for `collect`, as the engine with overlapped scheduling schedules
        and launches its next step before it resolves this one."""
        batch = self.batch
        self.batch, self.busy_until = None, None
        self.busy_seconds += self.step_time
        self.steps += 1
        self.prefill_tokens_run += sum(batch.num_new_tokens[batch.num_decodes:])
        if not batch.decode_only:
            self.prompt_steps += 1
            self.prompt_seconds += self.step_time
            heat = self._heat_at(self.started)
            self.heat = 1 - (1 - heat) * math.exp(-(self.step_end - self.started) / SUSTAIN_S)
            self.heat_t = self.step_end
        return Done(batch, self.olds, self.step_end)

    def _heat_at(self, now: float) -> float:
        return self.heat * math.exp(-max(0.0, now - self.heat_t) / SUSTAIN_S)

    def collect(self, done: Done) -> tuple[list[Sequence], float]:
        """The sequences that got tokens from the step `done` (resolved now), and when it ended."""
        return self.scheduler.resolve(done.batch, done.olds, [TOKEN] * len(done.batch.seqs)), done.first_end
