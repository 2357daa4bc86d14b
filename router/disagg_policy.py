"""Per request, in a disaggregated cluster: prefill on a prefill worker and hand the KV over (`remote`), or have
the decode worker prefill it itself (`local`), in chunks of at most `local_prefill_chunk` prompt tokens a step.

`--disagg-policy always` is remote for every request, `never` local for every request, and `auto` picks the one
whose estimated time to first token is less, among those that keep the decode worker's TPOT within TPOT_GUARD:

    remote = (tokens waiting on the prefill worker + the prompt's tokens not cached there) / prefill rate
             + handoff overhead (reserve, transfer, admission: measured per request, past the prefill)
    local  = decode step (the one in flight when it arrives) + chunks * (decode step + chunk cost)

where `chunks` are the decode worker's queued and this prompt's uncached tokens in chunks of `local_prefill_chunk`.
A step that mixes a prompt chunk with decodes runs the chunk in an eager forward of its own beside the decodes'
graph replay (model_runner.py's `execute`; before that, the whole batch ran eagerly), so a chunk costs the decode
worker its eager forward's time, more than its tokens' prefill time on a busy prefill worker, and every running
decode waits for it. So the chunk cost is measured on the decode workers themselves (heartbeat totals: the
seconds of the steps that ran prompt tokens beyond as many decode-only steps, per prompt batch), not derived from
the prefill workers' rate (until a chunk has run: a decode step plus a full chunk at the prefill rate).

The TPOT guard, since every chunk delays each decode running there:
- a budget per decode worker: it may spend 1 - 1 / TPOT_GUARD of its time on chunks, which stretches its steps by
  TPOT_GUARD on average (refilled with the clock, at most BURST_S of it saved up); a local prompt spends its own
  chunks' cost, unless no decode runs there to slow;
- feedback: no local prompt where decodes run while the decode workers' recent mean step exceeds TPOT_GUARD times
  their decode-only step (the budget's figures were too low), or TPOT_CEILING times their unloaded step (the
  least decode-only step of a heartbeat span): under a load that already slows decoding that much, every prompt
  goes remote, as under `always`.

The prefill rate (prompt tokens per busy second of the prefill workers), the decode-only step and the chunk cost
come from the heartbeats' engine totals; the handoff overhead from each remote request's dispatch-to-first-token
time less its estimated prefill. Every figure is a moving average; until the remote ones are measured `auto` is
`remote`. So short prompts, and prompts whose prefix the decode worker holds, go local while the budget lasts;
long uncached prompts, and everything once the budget is spent, go to the prefill workers.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from common import protocol as P

POLICIES = ("always", "never", "auto")
ALPHA = 0.2  # weight of a new measurement in a moving average
TPOT_GUARD = 1.1  # most a decode worker's mean step may be of its decode-only step for `auto` to add chunks
TPOT_CEILING = 1.2  # ... and of its unloaded step (issue 19's bound on TPOT p90 against unloaded)
MIN_SPAN_STEPS = 10  # decode-only steps a heartbeat span needs to stand for the unloaded step
BURST_S = 0.5  # seconds of a decode worker's chunk budget it may save up (TPOT is judged over a request's life)


def _mix(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new


@dataclass
class LocalWork:
    """The decode worker's side of a choice."""

    worker_id: str
    tokens: int  # prompt tokens it computes before this prompt's first token: its queue and the prompt's uncached
    own_tokens: int  # of those, this prompt's
    decodes: int  # requests it decodes, or will once their KV lands: the ones a chunk delays


@dataclass
class Estimate:
    """What a choice was based on, kept with the request to learn from its first token."""

    local: bool
    prefill_tokens: int  # tokens the chosen worker computes before this prompt's first token
    local_seconds: float | None  # None: not measured, or the TPOT guard ruled it out
    remote_seconds: float | None


class DisaggPolicy:
    def __init__(self, policy: str = "always", local_prefill_chunk: int = 512,
                 clock: Callable[[], float] = time.monotonic):
        if policy not in POLICIES:
            raise ValueError(f"disagg_policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self.chunk = local_prefill_chunk
        self.clock = clock
        self.prefill_rate: float | None = None  # prompt tokens per second of a busy prefill worker
        self.decode_step: float | None = None  # seconds per decode-only step of a busy decode worker
        self.chunk_cost: float | None = None  # seconds a prompt batch adds to a decode worker's steps
        self.recent_step: float | None = None  # seconds per step of a busy decode worker, chunks included
        self.unloaded_step: float | None = None  # the least decode-only step of a heartbeat span
        self.handoff: float | None = None  # seconds a remote request spends past its prefill
        self.budget: dict[str, tuple[float, float]] = {}  # decode worker -> (chunk seconds it may spend, as of when)
        self.local_choices = self.remote_choices = 0

    # ---- measurements -------------------------------------------------------------------------------
    def observe_load(self, role: str, old: P.WorkerLoad, new: P.WorkerLoad) -> None:
        """A heartbeat: the engine totals since the last one."""
        steps, seconds = new.busy_steps - old.busy_steps, new.busy_seconds - old.busy_seconds
        if steps <= 0 or seconds <= 0:
            return
        if role == "prefill":
            tokens = new.prefill_tokens_run - old.prefill_tokens_run
            if tokens > 0:
                self.prefill_rate = _mix(self.prefill_rate, tokens / seconds)
        elif role == "decode":
            self._observe_decode(steps, seconds, new.prompt_steps - old.prompt_steps,
                                 new.prompt_seconds - old.prompt_seconds, new.prompt_batches - old.prompt_batches)

    def _observe_decode(self, steps: int, seconds: float, prompt_steps: int, prompt_seconds: float,
                        prompt_batches: int) -> None:
        self.recent_step = _mix(self.recent_step, seconds / steps)
        decode_step = self.decode_step  # the span's own, where it had decode-only steps: the same batches
        if steps > prompt_steps:
            decode_step = max(0.0, seconds - prompt_seconds) / (steps - prompt_steps)
            self.decode_step = _mix(self.decode_step, decode_step)
            if steps - prompt_steps >= MIN_SPAN_STEPS:
                self.unloaded_step = min(self.unloaded_step or decode_step, decode_step)
        if prompt_batches > 0 and decode_step is not None:
            extra = max(0.0, prompt_seconds - prompt_steps * decode_step) / prompt_batches
            self.chunk_cost = _mix(self.chunk_cost, extra)

    def observe_first_token(self, estimate: Estimate, seconds: float) -> None:
        """A request's first token came `seconds` after it was dispatched."""
        if estimate.local or self.prefill_rate is None:
            return
        self.handoff = _mix(self.handoff, max(0.0, seconds - estimate.prefill_tokens / self.prefill_rate))

    # ---- the choice ---------------------------------------------------------------------------------
    @property
    def measured(self) -> bool:
        return None not in (self.prefill_rate, self.decode_step, self.handoff)

    def chunk_seconds(self) -> float:
        """What a chunk adds to a decode worker's time: measured, or until then a decode step and a full chunk at
        the prefill workers' rate."""
        return self.chunk_cost if self.chunk_cost is not None else self.decode_step + self.chunk / self.prefill_rate

    def _chunks(self, tokens: int) -> int:
        return -(-tokens // self.chunk)

    def _budget(self, worker_id: str) -> float:
        share = 1 - 1 / TPOT_GUARD  # of a decode worker's time, for chunks
        saved, since = self.budget.get(worker_id, (share * BURST_S, self.clock()))
        return min(share * BURST_S, saved + share * (self.clock() - since))

    def within_guard(self, work: LocalWork) -> bool:
        """Whether this prompt's chunks keep the decode worker's TPOT within the guard (see the module)."""
        if work.decodes == 0:
            return True
        if self.recent_step is not None and (self.recent_step > TPOT_GUARD * self.decode_step or (
                self.unloaded_step is not None and self.recent_step > TPOT_CEILING * self.unloaded_step)):
            return False
        return self._chunks(work.own_tokens) * self.chunk_seconds() <= self._budget(work.worker_id)

    def choose(self, remote_tokens: int, local: LocalWork | None) -> Estimate:
        """`remote_tokens`: what the best prefill worker computes before this prompt is prefilled (its queue and the
        prompt's uncached tokens), negative where there is none; `local`: the decode worker's side, None where the
        prompt cannot be prefilled there."""
        local_s = remote_s = None
        if self.measured:
            if local is not None and self.within_guard(local):
                local_s = self.decode_step + self._chunks(local.tokens) * (self.decode_step + self.chunk_seconds())
            if remote_tokens >= 0:
                remote_s = remote_tokens / self.prefill_rate + self.handoff
        if self.policy == "never" or remote_tokens < 0:
            chosen = True
        elif self.policy == "always" or local is None:
            chosen = False
        else:
            chosen = local_s is not None and remote_s is not None and local_s < remote_s
        if chosen:
            self.local_choices += 1
            if self.policy == "auto" and local is not None and local.decodes > 0 and self.measured:
                spent = self._chunks(local.own_tokens) * self.chunk_seconds()
                self.budget[local.worker_id] = (self._budget(local.worker_id) - spent, self.clock())
        else:
            self.remote_choices += 1
        tokens = (local.tokens if local is not None else 0) if chosen else remote_tokens
        return Estimate(chosen, tokens, local_s, remote_s)
