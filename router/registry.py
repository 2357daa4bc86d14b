"""The workers the router knows: their hellos, their last load, whether they are alive or draining, and what the
router counts them to hold between heartbeats (changed only by router/request.py's transitions)."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from common import protocol as P


@dataclass(eq=False)
class WorkerInfo:
    hello: P.WorkerHello
    identity: bytes  # ZMQ routing id
    load: P.WorkerLoad
    last_seen: float = field(default_factory=time.monotonic)
    # Router-side estimates between heartbeats.
    blocks_promised: int = 0  # reserved since the last heartbeat
    prefill_tokens: int = 0  # tokens sent to prefill and not yet reported done
    # Router request ids this worker is working on (a prefill worker: until the first token).
    assigned: set[str] = field(default_factory=set)
    # Ids of requests taken away when it was declared dead: aborted there should it be heard from again.
    lost: set[str] = field(default_factory=set)
    busy_seconds: float = 0.0  # how long its current step has run, as its last `alive` said (0: between steps)
    _alive: bool = field(default=True, repr=False)
    _draining: bool = field(default=False, repr=False)  # takes no new requests
    on_change: Callable[[], None] | None = field(default=None, repr=False)  # told when `accepting` may change

    @property
    def alive(self) -> bool:
        return self._alive

    @alive.setter
    def alive(self, value: bool) -> None:
        self._alive = value
        if self.on_change is not None:
            self.on_change()

    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._draining = value
        if self.on_change is not None:
            self.on_change()

    @property
    def worker_id(self) -> str:
        return self.hello.worker_id

    @property
    def role(self) -> str:
        return self.hello.role

    @property
    def free_blocks(self) -> int:
        return self.load.kv_blocks_free - self.blocks_promised

    @property
    def accepting(self) -> bool:
        return self.alive and not self.draining

    def idle_since(self, when: float) -> bool:
        """Whether it holds nothing: no request assigned by the router, and a heartbeat after `when`
        reporting nothing queued or running and every KV block free (a prefill worker keeps blocks
        until the decode side acknowledges them)."""
        load = self.load
        return (not self.alive or not self.assigned and self.last_seen > when and load.queued_requests == 0
                and load.running_requests == 0 and load.kv_blocks_free == load.kv_blocks_total)

    def stats(self) -> P.WorkerStats:
        return P.WorkerStats(worker_id=self.worker_id, role=self.role, alive=self.alive, draining=self.draining,
                             node_id=self.hello.node_id, **msgspec.structs.asdict(self.load))


@dataclass
class Roster:
    """The accepting workers (registry order) by role, and what they share; each request's admission and placement
    read it, so it is rebuilt only when a worker joins, leaves, dies, comes back or drains, not per request."""

    accepting: list[WorkerInfo]
    by_role: dict[str, list[WorkerInfo]]
    limits: tuple[int, int] | None  # (max_model_len, vocab_size) every accepting worker supports
    largest_blocks: dict[str, int]  # by role: the most KV blocks one worker has (a worker's count is fixed)

    @classmethod
    def of(cls, workers: list[WorkerInfo]) -> Roster:
        accepting = [w for w in workers if w.accepting]
        by_role: dict[str, list[WorkerInfo]] = {}
        for w in accepting:
            by_role.setdefault(w.role, []).append(w)
        limits = None
        if accepting:
            limits = min(w.hello.max_model_len for w in accepting), min(w.hello.vocab_size for w in accepting)
        largest = {role: max(w.hello.num_blocks for w in ws) for role, ws in by_role.items()}
        return cls(accepting, by_role, limits, largest)


class WorkerRegistry:
    """The workers the router knows, by id and by ZMQ identity. No worker gets more than `max_requests` requests
    at a time (`has_room`): the rest wait in the router's bounded queue, so a burst cannot pile up unbounded work
    (and memory) on a worker."""

    def __init__(self, max_requests: int = 1024):
        self.workers: dict[str, WorkerInfo] = {}
        self.identities: dict[bytes, str] = {}
        self.max_requests = max_requests
        self._roster: Roster | None = None

    def _changed(self) -> None:
        self._roster = None

    def roster(self) -> Roster:
        if self._roster is None:
            self._roster = Roster.of(list(self.workers.values()))
        return self._roster

    def register(self, hello: P.WorkerHello, identity: bytes) -> WorkerInfo:
        """Adds (or re-adds) a worker; raises ValueError when it cannot work with the others."""
        for other in self.workers.values():
            if other.worker_id == hello.worker_id or not other.alive:
                continue
            if other.hello.model_fingerprint != hello.model_fingerprint:
                raise ValueError(f"model mismatch: {hello.worker_id} serves {hello.model_fingerprint}, "
                                 f"{other.worker_id} serves {other.hello.model_fingerprint}")
            if other.hello.layout != hello.layout:
                raise ValueError(f"KV layout mismatch: {hello.worker_id} has {hello.layout}, "
                                 f"{other.worker_id} has {other.hello.layout}")
        load = P.WorkerLoad(queued_requests=0, queued_tokens=0, running_requests=0,
                            kv_blocks_total=hello.num_blocks, kv_blocks_free=hello.num_blocks)
        old = self.workers.get(hello.worker_id)
        if old is not None:
            self.identities.pop(old.identity, None)
        info = WorkerInfo(hello, identity, load, on_change=self._changed)
        self.workers[hello.worker_id] = info
        self._changed()
        self.identities[identity] = hello.worker_id
        self.identities[P.liveness_identity(hello.worker_id)] = hello.worker_id  # its `alive` connection
        return info

    def forget(self, worker_id: str) -> None:
        """Drops a worker that was removed on purpose (`pdcluster scale`)."""
        info = self.workers.pop(worker_id, None)
        self._changed()
        if info is not None and self.identities.get(info.identity) == worker_id:
            del self.identities[info.identity]
        self.identities.pop(P.liveness_identity(worker_id), None)

    def by_identity(self, identity: bytes) -> WorkerInfo | None:
        worker_id = self.identities.get(identity)
        return None if worker_id is None else self.workers.get(worker_id)

    def heartbeat(self, worker: WorkerInfo, hb: P.Heartbeat) -> None:
        worker.load = hb.load
        worker.last_seen = time.monotonic()
        worker.blocks_promised = 0
        worker.busy_seconds = 0.0

    def alive(self, worker: WorkerInfo, msg: P.Alive) -> None:
        """Heard from its liveness thread: alive, inside one long step; its load is as its last heartbeat said."""
        worker.last_seen = time.monotonic()
        worker.busy_seconds = msg.busy_seconds

    def expire(self, timeout: float) -> list[WorkerInfo]:
        """The live workers not heard from within `timeout` seconds (the caller declares them dead)."""
        now = time.monotonic()
        return [w for w in self.workers.values() if w.alive and now - w.last_seen > timeout]

    def of_role(self, *roles: str) -> list[WorkerInfo]:
        roster = self.roster()
        if len(roles) == 1:
            return list(roster.by_role.get(roles[0], ()))
        return [w for w in roster.accepting if w.role in roles]

    def with_room(self, role: str) -> list[WorkerInfo]:
        """The accepting workers of `role` that may take one more request."""
        return [w for w in self.roster().by_role.get(role, ()) if len(w.assigned) < self.max_requests]

    def limits(self) -> tuple[int, int] | None:
        """(max_model_len, vocab_size) every accepting worker supports; None without workers."""
        return self.roster().limits

    def largest_blocks(self, role: str) -> int:
        """The most KV blocks an accepting worker of `role` has (0: none)."""
        return self.roster().largest_blocks.get(role, 0)

    def can_serve(self, mode: str) -> bool:
        by_role = self.roster().by_role
        if mode == "colocated":
            return "colocated" in by_role
        return "prefill" in by_role and "decode" in by_role
