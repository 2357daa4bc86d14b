"""A request's life at the router, as a state machine.

    QUEUED --pair()--> RESERVING --reserved()--> PREFILLING --first_token()--> DECODING      (disaggregated)
    QUEUED --run_on()--> RUNNING --first_token()--> RUNNING          (colocated; disagg: prefilled on the decode worker)
    any of them --requeue()--> QUEUED          (refused for room)
    any of them --restart()--> QUEUED          (a worker died before the client saw a token: a new attempt, new id)
    any of them --migrate()--> QUEUED          (a worker died after: the prompt and the tokens streamed so far are
                                                prefilled again elsewhere, and the stream goes on where it stopped)
    any of them --end()--> DONE                (its result or error went out)

The transitions are the only code that changes what the workers are counted to hold for a request: the prompt
tokens a worker still has to prefill (`prefill_tokens`: those its prefix cache is not reckoned to hold), the
requests it works on (`assigned`) and the blocks a decode worker was asked to reserve (`blocks_promised`, until its
next heartbeat). So the counts cannot drift.

What an attempt sends to the workers is `attempt_ids` and `attempt_sampling`: the client's prompt and sampling,
or after a migration the prompt followed by the tokens already streamed and the tokens still to come.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import msgspec

from common import protocol as P
from common.sampling_params import SamplingParams
from router.disagg_policy import Estimate
from router.prefix_index import PromptKeys
from router.registry import WorkerInfo
from router.stop import CompletionText


class Phase(Enum):
    QUEUED = "queued"  # waiting at the router for workers
    RESERVING = "reserving"  # a decode worker sets blocks aside for the KV
    PREFILLING = "prefilling"  # a prefill worker computes the KV and the first token
    DECODING = "decoding"  # the decode worker streams tokens
    RUNNING = "running"  # colocated: one worker prefills and decodes
    DONE = "done"


class IllegalTransition(RuntimeError):
    pass


@dataclass(eq=False)
class Request:
    rid: str  # the router's id of this attempt: every worker message about it carries it
    client: bytes
    client_rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    stream: bool
    detok: CompletionText  # the completion's text as the client sees it (stop strings applied)
    arrival: float = field(default_factory=time.monotonic)
    dispatched: float | None = None
    reserved_at: float | None = None  # disaggregated: when the decode worker's reservation answer came
    phase: Phase = Phase.QUEUED
    prefill: WorkerInfo | None = None  # disaggregated: the prefill worker, until the first token
    decode: WorkerInfo | None = None  # the decode worker, or the colocated one
    token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    attempts: int = 0  # restarts after a worker died
    may_migrate: bool = True  # may continue on other workers after the client saw tokens (Submit.migrate)
    migrations: int = 0
    resumed_at: int = 0  # tokens streamed before this attempt began (a migration resumes after them)
    prefilled_on: str = ""  # the worker that computed its KV (disaggregated: the prefill worker's id)
    attempt_ids: list[int] = field(default_factory=list)  # what this attempt prefills (set in __post_init__)
    keys: PromptKeys | None = None  # attempt_ids' prefix-cache keys, once placement asked
    estimate: Estimate | None = None  # disagg: where this attempt is prefilled, and the time it was expected to take
    _prefilling_on: WorkerInfo | None = None  # whose prefill_tokens count this prompt
    _prefill_count: int = 0  # how many

    def __post_init__(self) -> None:
        self.attempt_ids = self.prompt_ids

    @property
    def delivered(self) -> bool:
        """Whether the client has seen part of the completion (then it cannot be started over)."""
        return self.stream and bool(self.token_ids)

    @property
    def attempt_sampling(self) -> SamplingParams:
        if not self.resumed_at:
            return self.sampling
        return msgspec.structs.replace(self.sampling, max_tokens=self.sampling.max_tokens - self.resumed_at)

    @property
    def awaiting_first_token(self) -> bool:
        """No token of this attempt came yet: the next one ends its prefill."""
        return len(self.token_ids) == self.resumed_at and self.phase in (Phase.PREFILLING, Phase.RUNNING)

    @property
    def workers(self) -> list[WorkerInfo]:
        """The workers that hold something of this request."""
        return [w for w in (self.prefill, self.decode) if w is not None]

    def held_by(self, worker_id: str) -> bool:
        return any(w.worker_id == worker_id for w in self.workers)

    def timings(self, now: float) -> P.Timings:
        """Its times as the result reports them, ending `now`."""
        first = self.token_times[0] if self.token_times else None
        return P.Timings(queued=(self.dispatched or now) - self.arrival,
                         ttft=None if first is None else first - self.arrival, e2e=now - self.arrival,
                         itl=[b - a for a, b in zip(self.token_times, self.token_times[1:])],
                         reserved=None if self.reserved_at is None else self.reserved_at - self.arrival)

    def usage(self) -> P.Usage:
        return P.Usage(prompt_tokens=len(self.prompt_ids), completion_tokens=len(self.token_ids),
                       cached_tokens=min(self.cached_tokens, len(self.prompt_ids)))

    # ---- transitions --------------------------------------------------------------------------------
    def run_on(self, worker: WorkerInfo, cached: int = 0, blocks: int = 0) -> None:
        """One worker prefills and decodes it (a colocated one, or a decode worker that prefills it itself, with
        `blocks` for it); `cached`: prompt tokens its cache is reckoned to hold."""
        self._expect(Phase.QUEUED)
        self.decode = worker
        worker.blocks_promised += blocks
        worker.assigned.add(self.rid)
        self._count_prefill(worker, cached)
        self._dispatched(Phase.RUNNING)

    def pair(self, prefill: WorkerInfo, decode: WorkerInfo, blocks: int, cached: int = 0) -> None:
        """Disaggregated: `decode` reserves `blocks` for the KV that `prefill` will compute."""
        self._expect(Phase.QUEUED)
        self.prefill, self.decode = prefill, decode
        decode.blocks_promised += blocks
        decode.assigned.add(self.rid)
        prefill.assigned.add(self.rid)
        self._count_prefill(prefill, cached)
        self._dispatched(Phase.RESERVING)

    def reserved(self, prefill: WorkerInfo) -> None:
        """The blocks are set aside; `prefill` (the paired worker, or another if that one stopped accepting)
        computes the KV."""
        self._expect(Phase.RESERVING)
        self.reserved_at = time.monotonic()
        if prefill is not self.prefill:
            self._release_prefill()
            self.prefill = prefill
            prefill.assigned.add(self.rid)
            self._count_prefill(prefill)
        self.phase = Phase.PREFILLING

    def first_token(self) -> None:
        """The prompt is prefilled: its prefill worker is done with it."""
        self._expect(Phase.PREFILLING, Phase.RUNNING)
        self.prefilled_on = (self.prefill or self.decode).worker_id
        self._uncount_prefill()
        if self.phase is Phase.PREFILLING:
            self._release_prefill()
            self.phase = Phase.DECODING

    def requeue(self) -> None:
        """Back to the queue, holding nothing on any worker."""
        self._expect(Phase.RESERVING, Phase.PREFILLING, Phase.DECODING, Phase.RUNNING)
        self._release()
        self.dispatched = self.reserved_at = None
        self.phase = Phase.QUEUED

    def restart(self, rid: str, detok: CompletionText) -> None:
        """A new attempt under the id `rid` (late messages about the old one are then ignored): back to the queue,
        holding nothing and having produced nothing."""
        self.requeue()
        self.rid, self.attempts = rid, self.attempts + 1
        self.token_ids, self.token_times, self.cached_tokens, self.prefilled_on = [], [], 0, ""
        self.detok = detok
        self.resumed_at, self.attempt_ids, self.keys = 0, self.prompt_ids, None

    def migrate(self, rid: str) -> None:
        """A new attempt under the id `rid` that resumes the stream: back to the queue, holding nothing, keeping the
        tokens streamed so far (and the detokenizer's text); it prefills the prompt followed by them."""
        self.requeue()
        self.rid, self.migrations = rid, self.migrations + 1
        self.resumed_at, self.attempt_ids, self.keys = len(self.token_ids), self.prompt_ids + self.token_ids, None

    def end(self) -> None:
        """Its last message went to the client: it holds nothing on any worker (they are told to abort it)."""
        self._release()
        self.phase = Phase.DONE

    # ---- bookkeeping --------------------------------------------------------------------------------
    def _expect(self, *phases: Phase) -> None:
        if self.phase not in phases:
            raise IllegalTransition(f"request {self.rid} is {self.phase.value}, not "
                                    f"{' or '.join(p.value for p in phases)}")

    def _dispatched(self, phase: Phase) -> None:
        self.dispatched = time.monotonic()
        self.phase = phase

    def _count_prefill(self, worker: WorkerInfo, cached: int = 0) -> None:
        self._prefill_count = max(len(self.attempt_ids) - cached, 1)
        worker.prefill_tokens += self._prefill_count
        self._prefilling_on = worker

    def _uncount_prefill(self) -> None:
        if self._prefilling_on is not None:
            worker = self._prefilling_on
            worker.prefill_tokens = max(0, worker.prefill_tokens - self._prefill_count)
            self._prefilling_on = None

    def _release_prefill(self) -> None:
        self._uncount_prefill()
        if self.prefill is not None:
            self.prefill.assigned.discard(self.rid)
            self.prefill = None

    def _release(self) -> None:
        self._release_prefill()
        if self.decode is not None:
            self.decode.assigned.discard(self.rid)
            self.decode = None
