"""Per request, in a disaggregated cluster: prefill on a prefill worker and hand the KV over (`remote`), or have
the decode worker prefill it itself (`local`), in chunks small enough that its running decodes keep their pace.

`--disagg-policy always` is remote for every request, `never` local for every request, and `auto` picks the one
whose estimated time to first token is less, from what the router measures:

    remote = (tokens waiting on the prefill worker + the prompt's tokens not cached there) / prefill rate
             + handoff overhead (reserve, transfer, admission: measured per request, past the prefill)
    local  = (prompt tokens waiting on the decode worker + the prompt's tokens not cached there) / prefill rate
             + the steps those tokens take in chunks of `local_prefill_chunk`, each a decode step long

The prefill rate (prompt tokens per busy second of the prefill workers) and the decode step (busy seconds per step
of the decode workers) come from the heartbeats' engine totals; the handoff overhead from each remote request's
dispatch-to-first-token time less its estimated prefill. Every figure is a moving average; until all three are
measured `auto` is `remote`. So short prompts, prompts whose prefix the decode worker holds, and long prefill
queues go local; long uncached prompts go to the prefill workers.
"""
from __future__ import annotations

from dataclasses import dataclass

from common import protocol as P

POLICIES = ("always", "never", "auto")
ALPHA = 0.2  # weight of a new measurement in a moving average


def _mix(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new


@dataclass
class Estimate:
    """What a choice was based on, kept with the request to learn from its first token."""

    local: bool
    prefill_tokens: int  # tokens the chosen worker computes before this prompt's first token
    local_seconds: float | None
    remote_seconds: float | None


class DisaggPolicy:
    def __init__(self, policy: str = "always", local_prefill_chunk: int = 512):
        if policy not in POLICIES:
            raise ValueError(f"disagg_policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self.chunk = local_prefill_chunk
        self.prefill_rate: float | None = None  # prompt tokens per second of a busy prefill worker
        self.decode_step: float | None = None  # seconds per step of a busy decode worker
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
            self.decode_step = _mix(self.decode_step, seconds / steps)

    def observe_first_token(self, estimate: Estimate, seconds: float) -> None:
        """A request's first token came `seconds` after it was dispatched."""
        if estimate.local or self.prefill_rate is None:
            return
        self.handoff = _mix(self.handoff, max(0.0, seconds - estimate.prefill_tokens / self.prefill_rate))

    # ---- the choice ---------------------------------------------------------------------------------
    @property
    def measured(self) -> bool:
        return None not in (self.prefill_rate, self.decode_step, self.handoff)

    def choose(self, remote_tokens: int, local_tokens: int) -> Estimate:
        """`remote_tokens`: what the best prefill worker computes before this prompt is prefilled (its queue and the
        prompt's uncached tokens); `local_tokens`: the same on the decode worker. Negative: no such worker."""
        local_s = remote_s = None
        if self.measured:
            if local_tokens >= 0:
                steps = -(-local_tokens // self.chunk)
                local_s = local_tokens / self.prefill_rate + steps * self.decode_step
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
