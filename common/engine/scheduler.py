from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from common.engine.block_manager import BlockManager
from common.engine.sequence import PENDING, Sequence, SequenceStatus
from common.engine.waiting_queue import WaitingQueue


@dataclass
class ScheduledBatch:
    """One step's work: seqs[i] computes num_new_tokens[i] tokens. Decodes (one token) come first."""

    seqs: list[Sequence]
    num_new_tokens: list[int]

    @cached_property
    def num_decodes(self) -> int:
        return next((i for i, n in enumerate(self.num_new_tokens) if n != 1), len(self.num_new_tokens))

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def decode_only(self) -> bool:
        return self.num_decodes == len(self.seqs)


class Scheduler:
    """Continuous batching with chunked prefill under a token budget and preemption by recompute.

    Each step serves running sequences first (decodes before unfinished prefills), then admits waiting
    ones in order while the budget, `max_num_seqs` and free blocks allow (a handed-off one, holding its
    prompt's blocks, passes one that waits for blocks). A sequence's whole prompt gets its blocks when it
    is admitted; decodes that need a new block preempt the most recently admitted sequence when none is free.
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: list[int]):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # Most prompt tokens one step computes (chunked beyond): a decode worker that prefills prompts itself
        # sets it low, so its running decodes keep their pace.
        self.max_prefill_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids)
        self.waiting = WaitingQueue()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def queued_tokens(self) -> int:
        """Prompt tokens still to compute: waiting prompts', and running prompts' chunks not yet prefilled."""
        return self.waiting_tokens() + self.running_prompt_tokens()

    def waiting_tokens(self) -> int:
        return self.waiting.tokens

    def running_prompt_tokens(self) -> int:
        return sum(n for s in self.running if (n := len(s.token_ids) - s.num_computed_tokens) > 1)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, running: list[Sequence] | None = None, decoding_apart: int = 0) -> ScheduledBatch | None:
        """The next step's batch. A caller that steps some running sequences' decodes itself (the planner's
        simulated decode pool, scripts/planner/decode_pool.py) names the others (`running`, in their order) and
        how many decode apart: each of those took a token of the budget first, and keeps its seat."""
        budget = self.max_num_batched_tokens - decoding_apart
        prefill_budget = self.max_prefill_tokens
        # Decodes (one token each, most of a step) and prompt chunks are kept apart as they are scheduled, so the
        # batch comes out decodes first without sorting; this runs every step, over every running sequence.
        decodes: list[Sequence] = []
        chunks: list[tuple[Sequence, int]] = []
        queue: list[Sequence] = []  # served from `head`; a preemption takes the last one still queued
        prompts: list[Sequence] = []  # running ones with prompt tokens left: after the decodes in the queue
        for s in self.running if running is None else running:
            if len(s.token_ids) - s.num_computed_tokens > 1:
                prompts.append(s)
            elif s.token_ids[-1] != PENDING or not self._pending_is_last(s):
                queue.append(s)
        queue += prompts
        allocate, block_size = self.block_manager.allocate, self.block_manager.block_size
        preempted = False
        head = 0
        while head < len(queue) and budget > 0:
            seq = queue[head]
            head += 1
            uncomputed = len(seq.token_ids) - seq.num_computed_tokens
            prefill = uncomputed > 1  # the next chunk of a prompt
            if prefill:
                n = min(uncomputed, budget, prefill_budget)
            elif uncomputed == 1:
                n = 1
            else:
                continue
            table, end = seq.block_table, seq.num_computed_tokens + n
            # A decode whose last block has room allocates nothing: checked here, as the block manager would
            while not ((table and end <= len(table) * block_size) or allocate(seq, end)):
                victim = queue.pop() if head < len(queue) else seq
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                budget -= n
                if prefill:
                    prefill_budget -= n
                if n == 1:
                    decodes.append(seq)
                else:
                    chunks.append((seq, n))
        # Admission is first come, first served, but a sequence that already holds its prompt's blocks (handed off,
        # its KV in) passes one that waits for blocks: behind a head needing more blocks than are free (a
        # preempted sequence, a long prompt), the handed-off ones would hold theirs forever with nothing running
        # to free any.
        # The head is taken in O(1) on every step; only behind a blocked head does the loop walk further.
        blocked = False  # a sequence ahead waits for blocks
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            seq = self.waiting[i]
            prefill = seq.num_uncomputed() > 1  # not a handed-off prompt (its KV is in) waiting to decode
            if blocked and (prefill or not seq.block_table):
                i += 1
                continue
            if prefill and prefill_budget <= 0:
                break
            if not self.block_manager.allocate(seq, seq.num_tokens):
                blocked = True
                i += 1
                continue
            del self.waiting[i]
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_uncomputed(), budget, prefill_budget if prefill else budget)
            budget -= n
            if prefill:
                prefill_budget -= n
            if n == 1:
                decodes.append(seq)
            else:
                chunks.append((seq, n))
        if not decodes and not chunks:
            return None
        return ScheduledBatch(decodes + [s for s, _ in chunks], [1] * len(decodes) + [n for _, n in chunks])

    def advance(self, batch: ScheduledBatch) -> list[int]:
        """Once a batch is launched: count its tokens as computed and give each sequence that completes a
        PENDING token, so the next step can be scheduled before this one's tokens are known. Returns the
        computed counts before the step, for `resolve`."""
        olds = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            olds.append(seq.num_computed_tokens)
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == seq.num_tokens:
                seq.token_ids.append(PENDING)
        return olds

    def resolve(self, batch: ScheduledBatch, olds: list[int], sampled: list[int]) -> list[Sequence]:
        """The batch's tokens are known: fill in its PENDING tokens, register full blocks in the prefix
        cache, finish what is done. Returns the sequences that got a token (finished ones included)."""
        updated = []
        commit, block_size = self.block_manager.commit, self.block_manager.block_size
        for seq, n, old, token in zip(batch.seqs, batch.num_new_tokens, olds, sampled):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted, preempted or finished (one step late) while this step was in flight
            pos = old + n
            full = old // block_size != seq.num_computed_tokens // block_size  # a block became full
            if seq.token_ids[pos] != PENDING:
                if full:
                    commit(seq, old)
                continue  # a chunk of a longer prompt: no token yet
            seq.token_ids[pos] = token
            if full:
                commit(seq, old)  # with its token in
            if seq.prefill_only:
                self.finish(seq, "prefilled", free=False)  # its blocks wait for the KV handoff
            elif reason := self.finish_reason(seq, token, pos + 1):
                self.finish(seq, reason)
            updated.append(seq)
        return updated

    def _pending_is_last(self, seq: Sequence) -> bool:
        """Given a PENDING last token: it will be the sequence's last (nothing more to compute)."""
        n = len(seq.token_ids)
        return seq.prefill_only or n - seq.num_prompt_tokens >= seq.sampling.max_tokens or n >= self.max_model_len

    def finish(self, seq: Sequence, reason: str, free: bool = True) -> None:
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        elif seq.status == SequenceStatus.FINISHED:
            return
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.drop_pending()  # a token sampled after the last one counts for nothing
        if free:
            self.block_manager.free_blocks(seq)

    def finish_reason(self, seq: Sequence, token: int, num_tokens: int) -> str | None:
        """Why `seq` ends with `token` as its `num_tokens`-th token, if it does."""
        sp = seq.sampling
        if (token in self.eos_token_ids and not sp.ignore_eos) or token in sp.stop_token_ids:
            return "stop"
        if num_tokens - seq.num_prompt_tokens >= sp.max_tokens or num_tokens >= self.max_model_len:
            return "length"
        return None

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free_blocks(seq)
        seq.status = SequenceStatus.WAITING
        seq.drop_pending()  # recomputed on its return
        seq.num_computed_tokens = seq.num_cached_tokens = 0  # its return finds what the cache then holds
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
