"""Per request, in a disaggregated cluster: prefill on a prefill worker and hand the KV over (`remote`), or have
the decode worker prefill it itself (`local`), in chunks of at most `local_prefill_chunk` prompt tokens a step.

`--disagg-policy always` is remote for every request, `never` local for every request, and `auto` picks local only
when it costs the cluster less, from what the router measures:

    remote = (tokens waiting on the prefill worker + the prompt's tokens not cached there) / prefill rate
             + handoff overhead (reserve, transfer, admission: measured per request, past the prefill)
    local  = chunks * (decode step + chunk cost)                   the steps before this prompt's first token
             + decodes there * chunks * chunk cost                 what those steps take from the others' TPOT

where `chunks` are the decode worker's queued and this prompt's uncached tokens in chunks of `local_prefill_chunk`.
A step that mixes a prompt chunk with decodes does not replay the decode CUDA graph (cuda_graph.py's `bucket`):
the whole batch runs eagerly, so the chunk costs the decode worker far more than its tokens' prefill time, and
every running decode waits for it. The chunk cost is measured on the decode workers themselves (heartbeat totals:
the seconds of steps that ran prompt tokens beyond as many decode-only steps, per prompt batch), not derived from
the prefill workers' rate, and is charged once for this prompt's first token and once for each decode it delays.

Guards, so that `auto` is never worse than `always`:
- until the decode workers have run a prompt chunk (its cost unknown), local only where no decode runs to slow;
- local only while the decode workers' recent mean step is within TPOT_GUARD of their decode-only step (the
  chunks already admitted have not yet raised TPOT past it).

The prefill rate (prompt tokens per busy second of the prefill workers), the decode-only step and the chunk cost
come from the heartbeats' engine totals; the handoff overhead from each remote request's dispatch-to-first-token
time less its estimated prefill. Every figure is a moving average; until the remote ones are measured `auto` is
`remote`. So short prompts, and prompts whose prefix the decode worker holds, go local when the decode worker is
idle or lightly loaded; everything else goes to the prefill workers.
"""
from __future__ import annotations

from dataclasses import dataclass

from common import protocol as P

POLICIES = ("always", "never", "auto")
ALPHA = 0.2  # weight of a new measurement in a moving average
TPOT_GUARD = 1.1  # most a decode worker's mean step may exceed its decode-only step for `auto` to add chunks


def _mix(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new


@dataclass
class Estimate:
    """What a choice was based on, kept with the request to learn from its first token."""

    local: bool
    prefill_tokens: int  # tokens the chosen worker computes before this prompt's first token
    local_seconds: float | None  # the local choice's cost: its time to first token and the delay to other decodes
    remote_seconds: float | None


class DisaggPolicy:
    def __init__(self, policy: str = "always", local_prefill_chunk: int = 512):
        if policy not in POLICIES:
            raise ValueError(f"disagg_policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self.chunk = local_prefill_chunk
        self.prefill_rate: float | None = None  # prompt tokens per second of a busy prefill worker
        self.decode_step: float | None = None  # seconds per decode-only step of a busy decode worker
        self.chunk_cost: float | None = None  # seconds a prompt batch adds to a decode worker's steps
        self.recent_step: float | None = None  # seconds per step of a busy decode worker, chunks included
        self.handoff: float | None = None  # seconds a remote request spends past its prefill
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

    def local_cost(self, local_tokens: int, decodes: int) -> float | None:
        """Seconds the local choice costs: to this prompt's first token, and to the `decodes` running on the decode
        worker (each delayed by every chunk); None where it must not be local (see the module's guards)."""
        chunks = -(-local_tokens // self.chunk)
        if self.chunk_cost is None:  # never measured: the first chunks only where they slow no one
            if decodes > 0:
                return None
            return local_tokens / self.prefill_rate + chunks * self.decode_step
        if decodes > 0 and self.recent_step is not None and self.recent_step > TPOT_GUARD * self.decode_step:
            return None
        return chunks * (self.decode_step + self.chunk_cost) + decodes * chunks * self.chunk_cost

    def choose(self, remote_tokens: int, local_tokens: int, local_decodes: int = 0) -> Estimate:
        """`remote_tokens`: what the best prefill worker computes before this prompt is prefilled (its queue and the
        prompt's uncached tokens); `local_tokens`: the same on the decode worker, which runs or awaits
        `local_decodes` requests' decodes. Negative: no such worker."""
        local_s = remote_s = None
        if self.measured:
            if local_tokens >= 0:
                local_s = self.local_cost(local_tokens, local_decodes)
            if remote_tokens >= 0:
                remote_s = remote_tokens / self.prefill_rate + self.handoff
        if self.policy == "never" or remote_tokens < 0:
            local = True
        elif self.policy == "always" or local_tokens < 0:
            local = False
        else:
            local = local_s is not None and remote_s is not None and local_s < remote_s
        if local:
            self.local_choices += 1
        else:
            self.remote_choices += 1
        return Estimate(local, local_tokens if local else remote_tokens, local_s, remote_s)
