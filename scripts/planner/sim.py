"""A discrete-event simulation of the router and its workers: arrivals -> the router's queue -> placement ->
prefill workers (batched and chunked under a token budget) -> KV handoff -> decode workers (continuous batching)
-> completion; or colocated replicas that prefill (chunked) and decode.

The same policy code the cluster runs, imported:
- placement: router/placement.py's `Placement` over a real `WorkerRegistry` (prefix-aware or by load, its prefix
  index, the decode choice by free blocks), each worker's load a heartbeat from its simulated engine after every
  change (`_sync`: exact and instant; the real router's are a heartbeat late, and it counts in between);
- where a prompt is prefilled: router/disagg_policy.py's `DisaggPolicy` (`always`, `never`, `auto`), fed
  heartbeat totals every `HEARTBEAT_S` and each remote request's first token, as the router feeds it;
- admission and the queue: router/admission.py's `Admission` (its checks and its bounded `WaitQueue`, at the
  router's default bounds: beyond them a request is refused, `overloaded`);
- each request's router-side state: router/request.py's `Request`, whose transitions count what each worker holds
  (`assigned`, so `WorkerRegistry.with_room` caps each worker at the router's default `max_worker_requests`;
  `prefill_tokens`);
- each worker's batching: the engine's `Scheduler` and `BlockManager` (scripts/planner/engine.py; a decode worker
  in aggregate while its every step only decodes: scripts/planner/decode_pool.py).

Reused: router/dispatch.py's `choose_disagg`, the disaggregated choice itself; `_dispatch_one` below only applies
it without messages (the router's `Dispatcher` is async and sends them).

The worker loop around each engine (common/worker/runtime.py), as far as it moves a request: a step's successor is
scheduled while the step runs (`SimEngine.cutoff`), and a worker takes no message while it schedules and launches
a step (`SimEngine.polls_at`): the decode worker's answer to a reservation (the prompt then goes to the prefill
worker) and its taking in of a KV handoff wait for that. On a GPU two engines share, an idle prefill worker's KV
copy waits for the other engine's step in flight (`_copy_starts`). The decode worker reports a handed-off request's
first token (the prefill worker's) as it takes it in; an nccl handoff's bytes move once the decode worker has read
its record (it posts the receive then, on the link's stream); one link's handoffs (an nccl pair's, a prefill worker's
cuda_ipc copies) run one after another (`_transfer`). Not modelled yet: the messages' own
latencies (the bench's unloaded reference measures them: validate.py's offset), preemption's recompute cost beyond
the scheduler's own, tensor parallelism other than through the profile's `tp`.
"""
from __future__ import annotations

import heapq
import itertools
import weakref

from common import protocol as P
from common.protocol.kv import KVLayout
from router.admission import Refused
from router.config import RouterConfig
from router.disagg_policy import DisaggPolicy
from router.dispatch import choose_disagg
from router.placement import Placement
from router.registry import WorkerInfo, WorkerRegistry
from router.request import Request
from scripts.planner.checked_prompts import CheckedAdmission
from scripts.planner.collector import collector_paused
from scripts.planner.decode_pool import DecodePool
from scripts.planner.block_pool import BlockPool
from scripts.planner.engine import SimEngine
from scripts.planner.gpu import Gpu
from scripts.planner.layout import Layout
from scripts.planner.profile import TIME_SLICED, Profile
from scripts.planner.sequences import sampling
from scripts.planner.unshared_prefixes import prefix_index, prompt_keys
from scripts.planner.workload import Placed, SimRequest, Workload

HEARTBEAT_S = 0.5  # how often workers' engine totals reach the disaggregation policy (`auto`)
# `serve` gives each worker its own GPU, and kvtransfer/choice.py pairs workers on two GPUs over nccl
ACROSS_GPUS = "nccl"
# The transports whose bytes move only once the decode worker has read the `kv_handoff` record and posted a receive
RECEIVER_POSTS = frozenset({"nccl"})


class Simulation:
    def __init__(self, profile: Profile, layout: Layout, workload: Workload, fast_forward: bool = True,
                 spares: BlockPool | None = None):
        self.profile, self.layout, self.workload = profile, layout, workload
        config = RouterConfig(model="simulated", mode=layout.mode)
        self.registry = WorkerRegistry(config.max_worker_requests)
        self.placement = Placement(self.registry, policy=layout.placement, prefixes=prefix_index(workload))
        # The policy reads the simulated clock through a weak reference: a cycle back to the simulation would keep it
        # (every request's sequences) for the cyclic collector to scan and free, not freed as it is let go
        ref = weakref.ref(self)
        self.disagg = DisaggPolicy(layout.policy, layout.local_prefill_chunk, clock=lambda: ref().now)
        self.admission = CheckedAdmission(config, self.registry, self.placement, workload.checked)
        self.queue = self.admission.queue
        self.engines: dict[str, SimEngine] = {}
        self.infos: dict[str, WorkerInfo] = {}
        self.num_blocks = max(1, int(profile.num_kv_blocks * min(1.0, layout.gpus_per_engine)))
        placed = layout.gpus()
        self.gpus = [Gpu(i, shared=placed.count(i) > 1) for i in range(max(placed, default=-1) + 1)]
        self.gpu_of: dict[str, Gpu] = {}
        layout_rec = KVLayout(block_size=profile.block_size, num_layers=1, num_kv_heads=1, head_dim=1,
                              dtype="bfloat16")
        roles = ([("prefill", "p")] * layout.prefill + [("decode", "d")] * layout.decode
                 + [("colocated", "c")] * layout.colocated)
        for i, ((role, letter), gpu) in enumerate(zip(roles, layout.gpus())):
            name = f"{letter}{i}"
            chunk = layout.local_prefill_chunk if role == "decode" else None
            # Decodes in aggregate, beside the prompts prefilled there (scripts/planner/decode_pool.py)
            pooled = role != "prefill" and fast_forward
            self.engines[name] = (DecodePool if pooled else SimEngine)(
                name, role, profile, chunk, workload.shared_prefixes, spares, self.num_blocks)
            self.gpu_of[name] = self.gpus[gpu]
            hello = P.WorkerHello(worker_id=name, role=role, model_fingerprint=profile.model or "sim",
                                  num_blocks=self.num_blocks, layout=layout_rec, max_model_len=1 << 30,
                                  vocab_size=1 << 30)
            self.infos[name] = self.registry.register(hello, name.encode())
        # Engines that may run several steps in bulk (not on a shared GPU: there a pool runs one step at a time, each
        # re-timed as the other engine's start and end), shown as of their step in flight (`catch_up`): a
        # prefill worker's last step is its prompts', never repeated (`SimEngine.start`)
        self.bulk = [e for name, e in self.engines.items()
                     if fast_forward and not self.gpu_of[name].shared and e.role != "prefill"]
        self.events: list[tuple[float, int, str, object, int]] = []
        self.counter = itertools.count()
        self.requests: list[SimRequest] = []
        self.by_rid: dict[str, SimRequest] = {}
        self.now = 0.0
        self.finished = 0
        self.phase_ends = list(itertools.accumulate(workload.phases or [len(workload.arrivals)]))
        self.phase_starts: list[float] = []  # when each phase began
        self.phase_busy: list[dict[str, float]] = []  # each engine's busy seconds as each phase began, and at the end
        self._last_loads: dict[str, P.WorkerLoad] = {}
        self.link_free: dict[tuple[str, ...], float] = {}  # when each link's handoffs so far are done (`_transfer`)

    # ---- the event loop -----------------------------------------------------------------------------
    def push(self, t: float, kind: str, obj: object, gen: int = 0) -> None:
        heapq.heappush(self.events, (t, next(self.counter), kind, obj, gen))

    @collector_paused()
    def run(self) -> list[SimRequest]:
        w = self.workload
        largest = max(map(len, w.prompts), default=0) + max(w.output_lens, default=0)
        if -(-largest // self.profile.block_size) > self.num_blocks:
            raise ValueError(f"a request of {largest} tokens needs more KV blocks than an engine has "
                             f"({self.num_blocks} of {self.profile.block_size} tokens)")
        bs = self.profile.block_size
        if bs not in w.keys:
            w.keys[bs] = prompt_keys(w, bs)
        total = len(w.arrivals)
        self._next_phases()
        if self.layout.policy == "auto" and self.layout.mode == "disagg":
            self.push(HEARTBEAT_S, "heartbeat", None)
        while self.events and self.finished < total:
            self.now, _, kind, obj, gen = heapq.heappop(self.events)
            if kind == "step":  # the commonest first
                if gen == obj.generation:
                    self.finished += self._step_done(obj)
            elif kind == "land":
                self._land(obj)
            elif kind == "arrive":
                self._arrive(obj)
            elif kind == "reserved":
                self._run_on(obj[0], obj[1], prefill_only=True)
            elif kind == "heartbeat":
                self._heartbeat()
                self.push(self.now + HEARTBEAT_S, "heartbeat", None)
            if self.finished == len(self.requests):
                self._next_phases()
        if self.finished < total:
            raise RuntimeError(f"simulation of {self.layout} stalled at {self.now:.3f} s with "
                               f"{total - self.finished} requests unfinished")
        self.phase_busy.append(self._busy())
        return self.requests

    def _next_phases(self) -> None:
        """Once every request so far has finished, the next phase's requests arrive, counted from now."""
        w = self.workload
        while len(self.phase_starts) < len(self.phase_ends) and self.finished == len(self.requests):
            self.phase_starts.append(self.now)
            self.phase_busy.append(self._busy())
            for i in range(len(self.requests), self.phase_ends[len(self.phase_starts) - 1]):
                req = SimRequest(str(i), w.prompts[i], w.output_lens[i], self.now + w.arrivals[i],
                                 keys=w.keys[self.profile.block_size][i])
                req.router = Request(rid=req.rid, client=b"", client_rid=req.rid, prompt_ids=req.attempt_ids,
                                     sampling=sampling(req.output_len),
                                     stream=False, detok=None)
                self.requests.append(req)
                self.by_rid[req.rid] = req
                self.push(req.arrival, "arrive", req)

    def phase(self, k: int) -> list[SimRequest]:
        """Phase `k`'s requests (after `run`)."""
        return self.requests[self.phase_ends[k - 1] if k else 0:self.phase_ends[k]]

    def _busy(self) -> dict[str, float]:
        return {name: e.busy_seconds for name, e in self.engines.items()}

    def _arrive(self, req: SimRequest) -> None:
        """router/admission.py takes it into its queue, or refuses it (a full queue: `overloaded`)."""
        try:
            self.admission.admit(P.Submit(request_id=req.rid, token_ids=req.attempt_ids))
        except Refused as e:
            req.refused = e.code
            self.finished += 1
            return
        self.queue.push(req)
        self._dispatch()

    def _kick(self, engine: SimEngine) -> None:
        """Work arrived at `engine`: start a step if it is idle, or cut a fast run short."""
        if engine.busy_until is None:
            self._start(engine)
        else:
            self._cut(engine)
        self._sync(engine)

    def _cut(self, engine: SimEngine) -> None:
        end = engine.cut(self.now)
        if end is not None:
            self.push(end, "step", engine, engine.generation)

    def _start(self, engine: SimEngine) -> None:
        """The engine's next step, if it has work. On a GPU it shares, the step is a share of the GPU's work
        (scripts/planner/gpu.py), stepped one by one: every start and end re-times the steps in flight there."""
        if not engine.scheduler.has_unfinished():
            return
        gpu = self.gpu_of[engine.name]
        end = engine.start(self.now, fast=not gpu.shared and not self.queue)
        if end is None:
            return
        if gpu.shared:
            alone, launch, longest, rows = engine.shared_step(self.now)
            pace = self.profile.mps_cost(engine.role) if self.layout.mps else TIME_SLICED
            gpu.add(engine, pace.step_seconds(alone, launch), self.now, launch,
                    pace.contention if pace.by_step else pace.beside, longest, rows)
            self._retime(gpu)
        else:
            self.push(end, "step", engine, engine.generation)

    def _retime(self, gpu: Gpu) -> None:
        for engine, end in gpu.ends(self.now).items():
            engine.generation += 1  # its old end event is stale
            engine.busy_until = engine.step_end = end
            self.push(end, "step", engine, engine.generation)

    def _step_done(self, engine: SimEngine) -> int:
        done = engine.finish()
        gpu = self.gpu_of[engine.name]
        if gpu.shared:
            gpu.remove(engine, self.now)
            self._retime(gpu)  # the other engine's step has the GPU to itself until this one's next starts
        # Overlapped scheduling (LLMEngine.step): the engine schedules and launches its next step, then collects
        # this one's tokens (the sequences that get their last token still hold their seats and blocks meanwhile)
        self._kick(engine)
        launched = engine.busy_until is not None and engine.started == self.now
        seqs, first_end = engine.collect(done)
        collected = engine.launch_end if launched else self.now
        finished = 0
        for seq in seqs:
            req = self.by_rid[seq.request_id]
            if seq.prefill_only:
                if self.layout.transport in RECEIVER_POSTS:  # the record goes now; the bytes once it is read
                    self.push(collected, "land", req)
                    continue
                handoff = self.profile.handoff_seconds(seq.num_prompt_tokens, self.layout.transport)
                self.push(self._transfer((engine.name,), self._copy_starts(engine, collected), handoff), "land", req)
                continue
            if req.first is None:
                req.first = first_end if first_end < self.now else collected  # a fast run's first step: earlier
                req.router.first_token()
                if req.estimate is not None:
                    self.disagg.observe_first_token(req.estimate, req.first - req.dispatched)
            if seq.is_finished:
                req.done = collected
                req.router.end()
                finished += 1
        if not launched:
            self._kick(engine)  # what waited for a seat or blocks those sequences held
        if self.queue:
            self._dispatch()
        return finished

    def _copy_starts(self, engine: SimEngine, at: float) -> float:
        """When a prefill worker's KV copy, queued at `at`, gets the GPU. Alone on it, or beside the other engine under
        MPS: at once. Time-slicing it, the GPU runs one process at a time: with a step of its own in flight the copy
        runs in that step's turn; idle, it waits for the other engine's step in flight to end
        (docs/gpu_runs/stop20_timeslice_probe.py: a short job waits for the step in flight)."""
        gpu = self.gpu_of[engine.name]
        if not gpu.shared or self.layout.mps or engine in gpu.work:
            return at
        return max([at, *(end for other, end in gpu.ends(self.now).items() if other is not engine)])

    def _transfer(self, link: tuple[str, ...], start: float, seconds: float) -> float:
        """When a handoff that can start at `start` is done. One link's handoffs run one after another: an nccl
        pair's on its link's thread and stream (kvtransfer/nccl/link.py), a prefill worker's cuda_ipc copies in its
        loop (each `send` waits for its copy). So a batch's prompts, finished together, land one after another."""
        end = max(start, self.link_free.get(link, 0.0)) + seconds
        self.link_free[link] = end
        return end

    def _land(self, req: SimRequest) -> None:
        decode = self.engines[req.decode_seq.worker]
        if (at := decode.polls_at(self.now)) > self.now and not req.landing:
            req.landing = True
            self.push(at, "land", req)
            return
        prefill = self.engines[req.prefill_seq.worker]
        if self.layout.transport in RECEIVER_POSTS and not req.receiving:
            # The decode worker posts its receive as it reads the record, on the link's stream: it waits for none of
            # the GPU work the worker has queued (kvtransfer/nccl/link.py, `Link.on_stream`).
            req.receiving = True
            handoff = self.profile.handoff_seconds(req.prefill_seq.seq.num_prompt_tokens, self.layout.transport)
            self.push(self._transfer((prefill.name, decode.name), self.now, handoff), "land", req)
            return
        prefill.release(req.prefill_seq.seq)
        self._kick(prefill)  # it may have waited for these blocks
        # The decode worker reports the first token (the prefill worker's) as it admits the request.
        req.first = self.now
        req.router.first_token()
        if req.estimate is not None:
            self.disagg.observe_first_token(req.estimate, req.first - req.dispatched)
        if decode.land(req.decode_seq.seq, self.now):
            req.done = self.now
            req.router.end()
            self.finished += 1
        self._kick(decode)
        if self.queue:
            self._dispatch()

    def _heartbeat(self) -> None:
        for name, engine in self.engines.items():
            load = engine.load(self.now)
            old = self._last_loads.get(name)
            if old is not None:
                self.disagg.observe_load(engine.role, old, load)
            self._last_loads[name] = load

    # ---- the router ---------------------------------------------------------------------------------
    def _sync(self, engine: SimEngine) -> None:
        """What the router knows of the worker: an up-to-date heartbeat's load (so nothing to count between)."""
        if engine.role == "decode" and self.layout.policy == "always":  # never prefills: only its blocks matter
            info = self.infos[engine.name]
            info.blocks_promised = info.load.kv_blocks_free - engine.free_blocks
            return
        self.registry.heartbeat(self.infos[engine.name], P.Heartbeat(worker_id=engine.name, load=engine.load(self.now)))

    def _dispatch(self) -> None:
        while self.queue:
            if not self._dispatch_one(self.queue.peek()):
                # The router tries again at every step of stepped engines: runs end, one step at a time (`_start`)
                for engine in self.bulk:
                    self._cut(engine)
                return
            self.queue.pop()

    def _dispatch_one(self, req: SimRequest) -> bool:
        """router/dispatch.py's choice for the oldest queued request; False when no worker can take it."""
        place, ids = self.placement, req.attempt_ids
        req.dispatched = self.now
        for engine in self.bulk:
            if engine.catch_up(self.now):
                self._sync(engine)
        if self.layout.mode == "colocated":
            worker = place.colocated(len(ids), req.keys)
            if worker is None:
                return False
            req.router.run_on(worker, place.cached_tokens(worker, req.keys))
            place.placed(worker, req.keys)
            self._run_on(worker.worker_id, req, prefill_only=False)
            return True
        choice = choose_disagg(place, self.disagg, ids, req.keys)  # the router's own choice
        if choice is None:
            return False
        decode, prefill, blocks, req.estimate = choice.decode, choice.prefill, choice.blocks, choice.estimate
        if req.estimate.local:
            req.router.run_on(decode, place.cached_tokens(decode, req.keys), blocks)
            place.placed(decode, req.keys)
            self._run_on(decode.worker_id, req, prefill_only=False)
            return True
        engine = self.engines[decode.worker_id]
        self._kick(engine)  # a fast run there takes its blocks before the reservation does
        seq = engine.reserve(req.rid, ids, req.output_len, req.keys.keys)
        if seq is None:
            return False
        place.placed(decode, req.keys)
        req.router.pair(prefill, decode, blocks, place.cached_tokens(prefill, req.keys))
        req.router.reserved(prefill)  # the blocks are held at once; the prompt goes out when the answer comes
        self._sync(engine)
        req.decode_seq = Placed(decode.worker_id, seq)
        place.placed(prefill, req.keys)
        # The prompt goes to the prefill worker once the decode worker has answered the reservation.
        if (at := engine.polls_at(self.now)) > self.now:
            self.push(at, "reserved", (prefill.worker_id, req))
        else:
            self._run_on(prefill.worker_id, req, prefill_only=True)
        return True

    def _run_on(self, name: str, req: SimRequest, prefill_only: bool) -> None:
        engine = self.engines[name]
        seq = engine.add_prompt(req.rid, req.attempt_ids, req.output_len, prefill_only, self.now, req.keys.keys)
        if prefill_only:
            req.prefill_seq = Placed(name, seq)
        self._kick(engine)


@collector_paused()
def simulate(profile: Profile, layout: Layout, workload: Workload, fast_forward: bool = True,
             spares: BlockPool | None = None) -> list[SimRequest]:
    """Every request's times; given `spares`, the engines' block managers are taken from it and given back."""
    sim = Simulation(profile, layout, workload, fast_forward, spares)
    requests = sim.run()
    if spares is not None:
        for engine in sim.engines.values():
            spares.give(engine.block_manager)
    return requests
