"""What a simulation is given and gives back: the requests that arrive (`Workload`), and each one's simulated
life (`SimRequest`: when it arrived, reached a worker, got its first token and its last)."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.engine.sequence import Sequence
from router.disagg_policy import Estimate
from router.prefix_index import PromptKeys
from router.request import Request


@dataclass
class Placed:
    """A request's sequence on a worker."""

    worker: str
    seq: Sequence


@dataclass(eq=False)
class SimRequest:
    rid: str
    attempt_ids: list[int]  # the prompt (the name WaitQueue counts)
    output_len: int
    arrival: float
    keys: PromptKeys | None = None
    router: Request | None = None  # the router's state machine of it (what the workers are counted to hold)
    estimate: Estimate | None = None
    dispatched: float = 0.0
    first: float | None = None  # when its first token reached the router
    done: float | None = None
    prefill_seq: Placed | None = None
    decode_seq: Placed | None = None
    refused: str = ""  # the router's answer to a request it did not take (`overloaded`)
    landing: bool = False  # its KV handoff waits for the decode worker to take the message
    receiving: bool = False  # an nccl handoff: the decode worker has posted its receive, the bytes are under way

    @property
    def ttft(self) -> float:
        return self.first - self.arrival

    @property
    def tpot(self) -> float:
        return (self.done - self.first) / (self.output_len - 1) if self.output_len > 1 else 0.0


@dataclass
class Workload:
    """What arrives: (arrival seconds, prompt token ids, output tokens), sorted by arrival."""

    arrivals: list[float]
    prompts: list[list[int]]
    output_lens: list[int]
    # Whether prompts share prefixes: without, the engines' prefix caches could never hit, and the simulation
    # skips their hashing (the same results, sooner).
    shared_prefixes: bool = True
    # Each prompt's prefix-cache keys by block size: computed once, shared by every layout
    keys: dict[int, list[PromptKeys]] = field(default_factory=dict)
    # The prompts the router's admission check passed, by what it was given: checked once, shared by every layout
    # (scripts/planner/checked_prompts.py)
    checked: dict[tuple, list[int]] = field(default_factory=dict)
    # How many requests each phase of a run holds, in order, as the bench serves one cluster: its warm-up, its
    # unloaded requests one at a time, then its load points. A phase's arrivals count from when every request of
    # the phase before has finished. None: one phase.
    phases: list[int] | None = None
    # How the arrivals were drawn, for a router's share of them (scripts/planner/shards.py `router_share`): the
    # coefficient of variation of their gaps (1: Poisson; gamma's), or None for given times (a trace); and the seed
    arrival_cv: float | None = 1.0
    seed: int = 0
