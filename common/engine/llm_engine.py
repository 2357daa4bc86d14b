from __future__ import annotations

import logging
import multiprocessing as mp
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.config import EngineConfig
from common.engine.block_manager import BlockManager
from common.engine.device import mps_client, place
from common.engine.in_flight import InFlight
from common.engine.launch_clock import LaunchClock
from common.engine.model_runner import ModelRunner
from common.engine.scheduler import ScheduledBatch, Scheduler
from common.engine.sequence import Sequence, SequenceStatus
from common.engine.warmup import WarmupReport, warm_up
from common.prompt import check_prompt
from common.protocol import WorkerLoad
from common.sampling_params import InvalidRequest, SamplingParams

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass
class StepStats:
    """One step's work or, as `LLMEngine.totals`, the sum over every step that ran or collected a batch."""

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    gpu_seconds: float = 0.0  # GPU time of the batch collected (CUDA events; 0 off CUDA)
    # Steps that launched or collected a batch with prompt tokens, their seconds, and such batches launched. Both
    # ends count: with overlap an eager mixed batch's cost falls partly in the step that launches it (host-bound)
    # and partly in the one that collects it (GPU-bound).
    prompt_steps: int = 0
    prompt_seconds: float = 0.0
    prompt_batches: int = 0

    def add(self, step: StepStats) -> None:
        self.num_prefill_tokens += step.num_prefill_tokens
        self.num_decode_tokens += step.num_decode_tokens
        self.seconds += step.seconds
        self.steps += step.steps
        self.gpu_seconds += step.gpu_seconds
        self.prompt_steps += step.prompt_steps
        self.prompt_seconds += step.prompt_seconds
        self.prompt_batches += step.prompt_batches


def _tp_worker(config: EngineConfig, rank: int, init_method: str) -> None:
    ModelRunner(config, rank, init_method).serve_forever()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LLMEngine:
    """Requests in, tokens out: schedule -> run -> postprocess, one step at a time. Speaks token ids only."""

    def __init__(self, config: EngineConfig):
        self.config = config = place(config)
        self._procs: list[mp.Process] = []
        init_method = None
        if config.tensor_parallel_size > 1:
            init_method = f"tcp://127.0.0.1:{_free_port()}"
            ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA state
            self._procs = [ctx.Process(target=_tp_worker, args=(config, r, init_method), daemon=True)
                           for r in range(1, config.tensor_parallel_size)]
            for p in self._procs:
                p.start()
        self.runner = ModelRunner(config, 0, init_method)
        capacity = self.runner.num_blocks * config.block_size
        if capacity < config.max_model_len:
            log.warning("max_model_len lowered from %d to %d: the KV pool holds no more", config.max_model_len,
                        capacity)
            config.max_model_len = capacity
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_model_len, config.model_config.eos_token_ids)
        # Every live sequence, by request id: queued or running in the scheduler, or (disaggregated) holding
        # blocks outside it, RESERVED or HELD (its status says which).
        self.requests: dict[str, Sequence] = {}
        self.last_step = StepStats()
        self.totals = StepStats()  # since start: what a benchmark diffs over a load point (via heartbeats)
        # With overlap: the batch whose tokens are still on their way (batch, tokens, computed counts before).
        # (batch, tokens, computed counts before, its launch number)
        self._in_flight: tuple[ScheduledBatch, InFlight, list[int], int] | None = None
        self._launches = 0
        self.launched: ScheduledBatch | None = None  # the batch the last step launched
        self.clock = LaunchClock(contended=mps_client())
        self._last_step_end: float | None = None  # when the last busy step ended; None after an idle one
        self.warmup: WarmupReport | None = None
        self.startup = self.runner.startup  # how long each part of starting took (common/startup.py)
        if config.device == "cuda" and config.warmup:
            with self.startup.timed("warm-up"):
                self.warmup = warm_up(self)

    def reset_after_warmup(self) -> None:
        """Leaves no trace of warm-up requests: no cached prefix, no step in the totals."""
        assert not self.has_unfinished() and not self.requests
        self.block_manager.clear_cache()
        self.last_step, self.totals = StepStats(), StepStats()
        self._last_step_end = None

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                    prefill_only: bool = False) -> Sequence:
        """Validates and queues a request; raises InvalidRequest (naming the field) and changes nothing on bad input.

        A `prefill_only` request stops after its first token and keeps its blocks (HELD) until `abort`.
        """
        seq = self._new_sequence(request_id, prompt_token_ids, sampling, prefill_only)
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def reserve(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams) -> list[int] | None:
        """Decode side: blocks for a prompt whose KV a prefill worker will write; None if they are not free now."""
        seq = self._new_sequence(request_id, prompt_token_ids, sampling)
        if not self.block_manager.allocate(seq, seq.num_tokens, use_cache=False, remote=True):
            return None
        seq.status = SequenceStatus.RESERVED
        self.requests[request_id] = seq
        return list(seq.block_table)

    def admit_prefilled(self, request_id: str, first_token: int, cached_tokens: int = 0) -> Sequence:
        """Decode side: the KV of a reserved request has arrived; it joins the batch as a decode."""
        seq = self.requests[request_id]
        assert seq.status is SequenceStatus.RESERVED, seq
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = seq.num_prompt_tokens
        seq.num_cached_tokens = cached_tokens
        self.block_manager.commit(seq, 0)
        seq.token_ids.append(first_token)
        self.scheduler.add(seq)
        if reason := self.scheduler.finish_reason(seq, first_token, seq.num_tokens):
            self.scheduler.finish(seq, reason)
            self.requests.pop(request_id)
        return seq

    def get(self, request_id: str) -> Sequence | None:
        return self.requests.get(request_id)

    def _new_sequence(self, request_id: str, ids: list[int], sampling: SamplingParams,
                      prefill_only: bool = False) -> Sequence:
        if request_id in self.requests:
            raise InvalidRequest("request_id", f"{request_id!r} is already in use")
        self.validate_prompt(ids)
        sampling.validate()
        return Sequence(request_id, ids, sampling, prefill_only)

    def validate_prompt(self, ids: list[int]) -> None:
        check_prompt(ids, self.config.max_model_len, self.config.model_config.vocab_size)

    def abort(self, request_id: str) -> bool:
        """The request leaves this engine, whatever its status, and its blocks are freed (a HELD one's too: the
        decode worker has its KV, or never will)."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        if seq.status in (SequenceStatus.RESERVED, SequenceStatus.HELD):
            self.block_manager.free_blocks(seq)
            seq.status = SequenceStatus.FINISHED
        else:
            self.scheduler.finish(seq, "abort")
        return True

    def step(self, idle: Callable[[torch.cuda.Event], None] | None = None) -> list[Sequence]:
        """Launches the next scheduled batch, then collects the tokens of the batch launched before it (with
        overlap) or of this one (without). Returns the sequences that got a token. `idle` runs over and over
        while the GPU has yet to produce them (`InFlight.tokens`): it may add, reserve and abort requests, not step."""
        start = time.perf_counter()
        batch = self.scheduler.schedule()
        launched, self.launched = None, batch
        if batch is not None:
            in_flight = self.runner.launch(batch)
            self._launches += 1
            self.block_manager.epoch = self._launches  # a block freed from now on waits for this launch
            launched = (batch, in_flight, self.scheduler.advance(batch), self._launches)
            self.clock.launched(time.perf_counter() - start)
        if self.config.overlap_scheduling:
            done, self._in_flight = self._in_flight, launched
        else:
            done = launched
        updated = self._collect(*done, idle) if done else []
        end = time.perf_counter()
        gpu_s = done[1].gpu_seconds() if done is not None else None
        if done is not None:
            self.clock.collected(gpu_s, done[0].decode_only)
        if self._in_flight is not None:  # on the GPU since the batch before it ended, or since its launch
            self.clock.in_flight(end if done is not None else start, self._in_flight[0].decode_only)
        nd = batch.num_decodes if batch else 0
        busy = batch is not None or done is not None
        # A busy step lasts from the end of the one before (the server may wait between them, launch_delay).
        seconds = end - (self._last_step_end if self._last_step_end is not None else start)
        launched_prompt = batch is not None and not batch.decode_only
        prompt = launched_prompt or (done is not None and not done[0].decode_only)
        self.last_step = StepStats(batch.num_tokens - nd if batch else 0, nd, seconds, int(busy), gpu_s or 0.0,
                                   int(prompt), seconds if prompt else 0.0, int(launched_prompt))
        self._last_step_end = end if busy and self.has_unfinished() else None  # idle gaps are no step
        if busy:
            self.totals.add(self.last_step)
        return updated

    def launch_delay(self) -> float:
        """Seconds a server should wait before the next step (taking requests meanwhile): with overlap and
        late_launch, until just before the GPU finishes the batch in flight (common/engine/launch_clock.py); in an
        MPS client, not once it has finished, however late the clock said."""
        if not (self.config.overlap_scheduling and self.config.late_launch) or self._in_flight is None:
            return 0.0
        delay = self.clock.delay(time.perf_counter())
        finished = self.early_launch_event()
        return 0.0 if delay and finished is not None and finished.query() else delay

    def early_launch_event(self) -> torch.cuda.Event | None:
        """In an MPS client, the event of the batch in flight's tokens, whose completion ends late launch's wait (a
        server's loop wakes on it); None elsewhere, with nothing in flight, or off CUDA."""
        if not self.clock.contended or self._in_flight is None:
            return None
        return self._in_flight[1].event

    def _collect(self, batch: ScheduledBatch, in_flight: InFlight, olds: list[int], launch: int,
                 idle: Callable[[torch.cuda.Event], None] | None = None) -> list[Sequence]:
        tokens = in_flight.tokens(idle)
        updated = self.scheduler.resolve(batch, olds, tokens)
        self.block_manager.release(launch)
        for seq in updated:
            if seq.finish_reason == "prefilled":
                seq.status = SequenceStatus.HELD
            elif seq.is_finished:
                self.requests.pop(seq.request_id, None)
        return updated

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None

    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    def load(self) -> WorkerLoad:
        """What a router needs to balance work (queue depths and KV use), and the busy steps' totals."""
        sched = self.scheduler
        return WorkerLoad(
            queued_requests=len(sched.waiting),
            queued_tokens=sched.queued_tokens(),
            running_requests=len(sched.running),
            kv_blocks_total=self.block_manager.num_blocks,
            kv_blocks_free=self.block_manager.num_free_blocks,
            busy_steps=self.totals.steps,
            busy_seconds=self.totals.seconds,
            prefill_tokens_run=self.totals.num_prefill_tokens,
            decode_tokens_run=self.totals.num_decode_tokens,
            gpu_seconds=self.totals.gpu_seconds,
            prompt_steps=self.totals.prompt_steps,
            prompt_seconds=self.totals.prompt_seconds,
            prompt_batches=self.totals.prompt_batches,
            prefix_query_tokens=self.block_manager.cache_query_tokens,
            prefix_hit_tokens=self.block_manager.cache_hit_tokens,
        )

    def close(self) -> None:
        self.runner.close()
        for p in self._procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        self._procs = []
