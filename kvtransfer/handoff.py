"""One KV handoff per request, on each side of it, with named states; the table a worker keeps them in and polls.

    prefill:  RESERVED (prefilling) -> SENDING -> LANDED (sent, waiting for the ack) -> ACKED
    decode:   RESERVED (blocks set aside, KV not here) -> LANDING -> LANDED -> ACKED (admitted, acknowledged)
    either:   -> FAILED, with the error code and reason the client sees

A handoff's blocks are never freed while its transport still reads or writes them (`busy`): a request aborted or
timed out meanwhile is FAILED at once and its blocks are freed when the transfer ends. Every wait has a deadline
and one owner. Until the prefill worker sends, both sides wait on its prefill, which may be long (a long prompt,
a queue): that wait is the router's, which ends the request everywhere if the prefill worker dies or refuses
it. From the send on, the handoff's own deadline runs on both sides (the prefill side's until the ack, the
decode side's once the KV starts to land); a prefill worker whose send times out reports it, and the router
frees the decode side's reservation.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum

from common.protocol import ABORTED, TIMEOUT, KVHandoff, PrefillTask, TransportTotals


class HandoffState(Enum):
    RESERVED = "reserved"
    SENDING = "sending"
    LANDING = "landing"
    LANDED = "landed"
    ACKED = "acked"
    FAILED = "failed"


@dataclass(eq=False)
class Handoff:
    request_id: str  # the router's: one id end to end
    peer_id: str
    deadline: float | None  # None: not running yet (the prefill still computing the blocks)
    state: HandoffState = HandoffState.RESERVED
    pending: Future | None = None  # the transport's work on the blocks, while it runs
    code: str = ""  # FAILED: the error code and reason the client sees
    reason: str = ""
    report: bool = True  # FAILED: tell the router (not when the router itself aborted the request)
    reported: bool = False
    answered: bool = False  # decode: the prefill worker got its handoff_ack
    task: PrefillTask | None = None  # prefill: what to send where
    record: KVHandoff | None = None  # decode: the announcement, once it came
    sent_at: float = 0.0  # prefill: when the send began (time.monotonic)
    sent_bytes: int = 0  # prefill: what it moves

    @property
    def transport(self) -> str:
        """The KV transport moving it: the task's (prefill), the record's (decode; "" until the record came)."""
        source = self.task if self.task is not None else self.record
        return source.transport if source is not None else ""

    @property
    def busy(self) -> bool:
        """Whether a transport still reads or writes this handoff's blocks."""
        return self.pending is not None

    def moving(self, pending: Future | None, state: HandoffState, deadline: float) -> None:
        """The transport started (SENDING or LANDING until `pending` resolves), or finished at once (LANDED)."""
        self.pending, self.deadline = pending, deadline
        self.state = state if pending is not None else HandoffState.LANDED

    def fail(self, code: str, reason: str, report: bool = True) -> None:
        """FAILED, once: a later failure (a transfer ending after an abort) keeps the first reason."""
        if self.state is HandoffState.FAILED:
            return
        self.state, self.code, self.reason, self.report = HandoffState.FAILED, code, reason, report


class HandoffTable:
    """A worker's open handoffs, by request id. The worker polls it: `transfers_ended` on every loop (cheap: only
    the handoffs with a transfer in flight; `on_transfer_end` wakes the loop for it), `expired` now and then; and
    settles each handoff either returns."""

    def __init__(self, on_transfer_end: Callable[[], None] | None = None) -> None:
        self.on_transfer_end = on_transfer_end  # called (on the transport's thread) as a watched transfer ends
        self._open: dict[str, Handoff] = {}
        self._moving: dict[str, Handoff] = {}  # those with a transfer in flight
        self._totals: dict[str, TransportTotals] = {}  # acknowledged handoffs by transport (heartbeats carry them)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._open

    def __len__(self) -> int:
        return len(self._open)

    def open(self, handoff: Handoff) -> Handoff:
        self._open[handoff.request_id] = handoff
        return handoff

    def get(self, request_id: str) -> Handoff | None:
        return self._open.get(request_id)

    def close(self, request_id: str) -> None:
        self._open.pop(request_id, None)
        self._moving.pop(request_id, None)

    def acked(self, h: Handoff, now: float) -> None:
        """Prefill: the decode side acknowledged `h`: counted in its transport's totals."""
        h.state = HandoffState.ACKED
        t = self._totals.get(h.transport) or TransportTotals(transport=h.transport)
        self._totals[h.transport] = TransportTotals(transport=h.transport, count=t.count + 1,
                                                    bytes=t.bytes + h.sent_bytes,
                                                    seconds=t.seconds + max(0.0, now - h.sent_at))

    def totals(self) -> list[TransportTotals]:
        return list(self._totals.values())

    def watch(self, handoff: Handoff) -> None:
        """Poll this handoff's transfer (after `Handoff.moving` with a future)."""
        if handoff.pending is not None:
            self._moving[handoff.request_id] = handoff
            if self.on_transfer_end is not None:
                handoff.pending.add_done_callback(lambda _: self.on_transfer_end())

    @property
    def transferring(self) -> bool:
        return bool(self._moving)

    def transfers_ended(self) -> list[Handoff]:
        """Handoffs whose transfer just ended: LANDED, or FAILED (by the transfer, or earlier by an abort or the
        deadline, whose blocks may now be freed)."""
        ended = [h for h in self._moving.values() if h.pending.done()]
        for h in ended:
            del self._moving[h.request_id]
            error, h.pending = h.pending.exception(), None
            if h.state in (HandoffState.SENDING, HandoffState.LANDING):
                if error is None:
                    h.state = HandoffState.LANDED
                else:
                    h.fail(ABORTED, f"KV transfer failed: {error}")
        return ended

    def expired(self, now: float) -> list[Handoff]:
        """Handoffs past their deadline, now FAILED with `timeout`."""
        late = [h for h in self._open.values() if h.deadline is not None and h.deadline < now
                and h.state not in (HandoffState.FAILED, HandoffState.ACKED)]
        for h in late:
            h.fail(TIMEOUT, "KV handoff timed out")
        return late
