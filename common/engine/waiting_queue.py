"""The scheduler's queue of waiting sequences, which keeps the tokens they still have to compute as a running total.

Every heartbeat reports those tokens (`WorkerLoad.queued_tokens`), and an overloaded prefill worker's queue holds
hundreds of prompts: summing them at each report walked the whole queue. A sequence's count is taken as it joins
and given back as it leaves, so a change made to it while it waits (a prefix-cache hit found by an allocation just
before it is admitted) does not skew the total; the rest of the scheduler keeps a waiting sequence's tokens as they
are.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from common.engine.sequence import Sequence


class WaitingQueue(deque):
    """A deque of sequences (oldest first) whose every change of members goes through `_count` or `_uncount`:
    `tokens` is the sum of each member's uncomputed tokens as it joined."""

    def __init__(self, seqs: Iterable[Sequence] = ()) -> None:
        super().__init__()
        self.tokens = 0
        self._counted: dict[Sequence, int] = {}
        self.extend(seqs)

    def _count(self, seq: Sequence) -> None:
        n = self._counted[seq] = len(seq.token_ids) - seq.num_computed_tokens
        self.tokens += n

    def _uncount(self, seq: Sequence) -> None:
        self.tokens -= self._counted.pop(seq)

    def append(self, seq: Sequence) -> None:
        super().append(seq)
        self._count(seq)

    def appendleft(self, seq: Sequence) -> None:
        super().appendleft(seq)
        self._count(seq)

    def extend(self, seqs: Iterable[Sequence]) -> None:
        for seq in list(seqs) if seqs is self else seqs:
            self.append(seq)

    def extendleft(self, seqs: Iterable[Sequence]) -> None:
        for seq in list(seqs) if seqs is self else seqs:
            self.appendleft(seq)

    def insert(self, i: int, seq: Sequence) -> None:
        super().insert(i, seq)
        self._count(seq)

    def pop(self) -> Sequence:
        seq = super().pop()
        self._uncount(seq)
        return seq

    def popleft(self) -> Sequence:
        seq = super().popleft()
        self._uncount(seq)
        return seq

    def remove(self, seq: Sequence) -> None:
        super().remove(seq)
        self._uncount(seq)

    def __contains__(self, seq: object) -> bool:
        return seq in self._counted  # a sequence is equal only to itself

    def __delitem__(self, i: int) -> None:
        seq = self[i]
        super().__delitem__(i)
        self._uncount(seq)

    def __setitem__(self, i: int, seq: Sequence) -> None:
        old = self[i]
        super().__setitem__(i, seq)
        self._uncount(old)
        self._count(seq)

    def __iadd__(self, seqs: Iterable[Sequence]) -> WaitingQueue:
        self.extend(seqs)
        return self

    def __add__(self, seqs: Iterable[Sequence]) -> WaitingQueue:
        joined = self.copy()
        joined.extend(seqs)
        return joined

    def __mul__(self, n: int) -> WaitingQueue:
        raise TypeError("a sequence waits once: WaitingQueue does not repeat")

    __rmul__ = __imul__ = __mul__

    def __reduce__(self) -> tuple:
        return type(self), (list(self),)  # counted again as they join the copy (deque's would count them twice)

    def clear(self) -> None:
        super().clear()
        self._counted.clear()
        self.tokens = 0
