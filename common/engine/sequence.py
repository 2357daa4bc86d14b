from __future__ import annotations

import time
from enum import Enum, auto

from common.sampling_params import SamplingParams


# Stands in for a token the GPU has sampled but the CPU has not seen yet (overlapped scheduling): the
# next step's input for that row is taken from the previous step's sampled tokens on the device.
PENDING = -1


class SequenceStatus(Enum):
    WAITING = auto()  # queued in the scheduler
    RUNNING = auto()  # in the scheduler's batch
    FINISHED = auto()
    RESERVED = auto()  # disaggregated, decode side: holds blocks its KV will be written into, outside the scheduler
    HELD = auto()  # disaggregated, prefill side: prefilled, its blocks kept until the decode worker has the KV


class Sequence:
    """One request inside an engine: its tokens, its place in the KV cache, and how far it has been computed."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                 prefill_only: bool = False):
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling = sampling
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # of the prompt, found in the prefix cache
        self.finish_reason: str | None = None
        self.arrival_time = time.monotonic()
        self.num_preemptions = 0
        self.prefill_only = prefill_only  # a prefill worker's: stop after the first token, keep the blocks
        self.sample_ref: tuple[int, int] = (-1, -1)  # (launch id, row) that samples its PENDING token
        # The chain keys of the prompt's first full blocks (common/prefix_hash.py), as far as known: the block
        # manager hashes each once (a prompt is matched, then committed); a caller that has them may give them.
        self.prompt_keys: list[int] = []

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose values are known on the CPU: all but the trailing PENDING ones (at most two)."""
        n = len(self.token_ids)
        while n and self.token_ids[n - 1] == PENDING:
            n -= 1
        return n

    @property
    def last_token(self) -> int:
        return self.token_ids[self.num_known_tokens - 1]

    def drop_pending(self) -> None:
        while self.token_ids and self.token_ids[-1] == PENDING:
            self.token_ids.pop()

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens
