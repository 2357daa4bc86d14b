from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from common.block_manager import BlockManager
from common.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """One step's work: seqs[i] computes num_new_tokens[i] tokens. Decodes (one token) come first."""

    seqs: list[Sequence]
    num_new_tokens: list[int]

    @property
    def num_decodes(self) -> int:
        return next((i for i, n in enumerate(self.num_new_tokens) if n != 1), len(self.num_new_tokens))

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    """Continuous batching with chunked prefill under a token budget and preemption by recompute.

    Each step serves running sequences first (decodes before unfinished prefills), then admits waiting
    ones while the budget, `max_num_seqs` and free blocks allow. A sequence's whole prompt gets its
    blocks when it is admitted; decodes that need a new block preempt the most recently admitted
    sequence when none is free.
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: list[int]):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        queue = deque(sorted(self.running, key=lambda s: s.num_uncomputed() > 1))
        preempted = False
        while queue and budget > 0:
            seq = queue.popleft()
            n = min(seq.num_uncomputed(), budget)
            while not self.block_manager.allocate(seq, seq.num_computed_tokens + n):
                victim = queue.pop() if queue else seq
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append((seq, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            if not self.block_manager.allocate(seq, seq.num_tokens):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_uncomputed(), budget)
            scheduled.append((seq, n))
            budget -= n
        if not scheduled:
            return None
        scheduled.sort(key=lambda item: item[1] != 1)
        return ScheduledBatch([s for s, _ in scheduled], [n for _, n in scheduled])

    def postprocess(self, batch: ScheduledBatch, sampled: list[int]) -> list[Sequence]:
        """Advance each sequence by what it computed; append sampled tokens where a prompt or decode completed.

        Returns the sequences that got a new token (finished ones included).
        """
        updated = []
        for seq, n, token in zip(batch.seqs, batch.num_new_tokens, sampled):
            if seq.status != SequenceStatus.RUNNING:
                continue  # aborted while its step was in flight
            old = seq.num_computed_tokens
            seq.num_computed_tokens += n
            self.block_manager.commit(seq, old)
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a chunk of a longer prompt: no token yet
            seq.token_ids.append(token)
            if seq.prefill_only:
                self.finish(seq, "prefilled", free=False)  # its blocks wait for the KV handoff
            elif reason := self.finish_reason(seq, token):
                self.finish(seq, reason)
            updated.append(seq)
        return updated

    def finish(self, seq: Sequence, reason: str, free: bool = True) -> None:
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        elif seq.status == SequenceStatus.FINISHED:
            return
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if free:
            self.block_manager.free_blocks(seq)

    def finish_reason(self, seq: Sequence, token: int) -> str | None:
        sp = seq.sampling
        if (token in self.eos_token_ids and not sp.ignore_eos) or token in sp.stop_token_ids:
            return "stop"
        if seq.num_completion_tokens >= sp.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free_blocks(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
