"""The router: clients in front, workers behind, every request's life in between.

    client --submit--> `submit` (admission.py) --queue--> `dispatch` (dispatch.py, placement.py)
        --reserve--> decode worker;
    `on_reserved` --prefill_task--> prefill worker --KV--> decode worker (colocated: one `generate_task`);
    worker --token_batch--> `on_tokens` --delta / result--> client

A request's phases and what it holds on each worker are router/request.py's, the requests in flight by both keys
request_table.py's; this module handles each message (the sockets' plumbing is sockets.py's)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from common import auth
from common import protocol as P
from common.stalls import Stalls, startup_heap_frozen
from kvtransfer.errors import TransferError
from router.admission import Admission, Refused, WaitQueue
from router.config import RouterConfig
from router.disagg_policy import DisaggPolicy
from router.dispatch import Dispatcher
from router.links import KVLinks
from router.metrics import Metrics
from router.placement import Placement
from router.registry import WorkerInfo, WorkerRegistry
from router.request import Phase, Request
from router.request_table import RequestTable
from router.scaling import Scaling
from router.sockets import bind_router_socket, bind_worker_socket, receive_forever
from router.text import RouterText

log = logging.getLogger(__name__)

# Identities of in-process clients (the HTTP front end) begin with this byte; ZMQ gives its peers identities that
# begin with 0, and a peer that picked one beginning with it is not heard (it could read another client's replies).
LOCAL_PREFIX = b"\xff"
LocalSink = Callable[[P.Message], None]


class Router:
    def __init__(self, config: RouterConfig, text: RouterText | None = None):
        """`text`: its tokenizer perhaps still loading (`serve` starts Ray meanwhile); by default loaded here."""
        config.check()
        # Before anything slow: serving another machine without a secret is refused outright.
        self.auth_token = auth.load_token(config.auth_token_file)
        auth.require_token_for([config.bind, config.worker_host, *config.http_addresses()], self.auth_token)
        keys = auth.keys_from_token(self.auth_token) if self.auth_token else None
        self.config = config
        self.text = text or RouterText.load(config.model)
        self.ctx = zmq.asyncio.Context()
        self._authenticator = auth.start_authenticator(self.ctx, keys) if keys else None
        self.frontend = bind_router_socket(self.ctx, config.bind, keys)
        self.backend, self.worker_address = bind_worker_socket(self.ctx, config.worker_host, keys)
        self.registry = WorkerRegistry(config.max_worker_requests)
        self.placement = Placement(self.registry, config.kv_transport, config.placement)
        self.disagg = DisaggPolicy(config.disagg_policy, config.local_prefill_chunk)
        self.admission = Admission(config, self.registry, self.placement, self.text)
        self.dispatcher = Dispatcher(config.mode, self.placement, self.disagg,
                                     lambda worker, msg: self.to_worker(worker, msg))
        self.scaling = Scaling(config, self.registry, self.on_worker_lost)
        self.links = KVLinks(self.registry, self.placement, lambda worker, msg: self.to_worker(worker, msg),
                             limit=config.eager_kv_links)
        self.requests = RequestTable()
        self.local_clients: dict[bytes, LocalSink] = {}  # in-process clients: identity -> where its replies go
        split = config.mode == "disagg"  # its KV links and where it prefills are metrics too
        self.metrics = Metrics(self.requests, self.registry, self.links if split else None,
                               self.disagg if split else None)
        self.started = time.monotonic()
        self.stalls = Stalls(stacks=config.log_stall_stacks)
        self.prompt_tokens = self.cached_tokens = 0  # of the requests that ended with a result
        self.migrations = 0

    @property
    def queue(self) -> WaitQueue:
        return self.admission.queue

    # ---- loops --------------------------------------------------------------------------------------
    async def serve(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(c) for c in (self._client_loop(), self._worker_loop(), self._housekeeping())]
        with startup_heap_frozen():  # its full collection first: a startup pause, not a stall while serving
            async with self.stalls.watching():
                await stop.wait()
        tasks += self.scaling.tasks
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for req in self.requests:  # every request still gets its terminal message
            await self.to_client(req.client, P.Error(request_id=req.client_rid, code=P.UNAVAILABLE,
                                                     message="the router is shutting down"))
            self._forget(req)
        await self._broadcast(P.Shutdown(reason="router stopping"))

    def close(self) -> None:
        self.frontend.close()
        self.backend.close()
        if self._authenticator is not None:
            self._authenticator.stop()
        self.ctx.term()

    async def _client_loop(self) -> None:
        async def from_zmq(identity: bytes, msg: P.Message) -> None:
            if not identity.startswith(LOCAL_PREFIX):
                await self.on_client(identity, msg)
        await receive_forever(self.frontend, P.CLIENT_TO_ROUTER, from_zmq, self.to_client)

    def attach_local(self, identity: bytes, sink: LocalSink) -> None:
        """An in-process client (the HTTP front end): it calls `on_client` with typed records under `identity`, and
        every reply to it goes to `sink` instead of the ZMQ socket."""
        if not identity.startswith(LOCAL_PREFIX):
            raise ValueError(f"a local client's identity must begin with {LOCAL_PREFIX!r}")
        self.local_clients[identity] = sink

    async def _worker_loop(self) -> None:
        async def log_it(identity: bytes, error: P.Error) -> None:  # never answer a worker's error with one
            log.warning("bad frame from worker %r: %s", identity, error.message)
        await receive_forever(self.backend, P.WORKER_TO_ROUTER, self.on_worker, log_it)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.worker_timeout / 4))
            for worker in self.registry.expire(self.config.worker_timeout):
                await self.on_worker_lost(worker, "stopped answering")
            await self.dispatch()

    # ---- clients ------------------------------------------------------------------------------------
    async def on_client(self, identity: bytes, msg: P.Message) -> None:
        if isinstance(msg, P.Submit):
            await self.submit(identity, msg)
        elif isinstance(msg, P.Abort):
            req = self.requests.of_client(identity, msg.request_id)
            if req is not None:
                await self.finish(req, "abort")
        elif isinstance(msg, P.Ping):
            await self.to_client(identity, P.Pong(nonce=msg.nonce))
        elif isinstance(msg, P.StatsRequest):
            await self.to_client(identity, self.stats())
        elif isinstance(msg, P.ScaleRequest):  # takes long: answered when done, other messages meanwhile
            self.scaling.start(msg, lambda reply: self.to_client(identity, reply))

    async def submit(self, identity: bytes, msg: P.Submit) -> None:
        """request -> router: validate, admit, tokenize, queue, and hand out what workers can take now."""
        try:
            if self.requests.of_client(identity, msg.request_id) is not None:
                raise Refused(P.BAD_REQUEST, f"request_id {msg.request_id!r} is already in flight")
            ids = self.admission.admit(msg)
        except Refused as e:
            self.metrics.failed(e.code)
            await self.to_client(identity, P.Error(request_id=msg.request_id, code=e.code, message=e.message,
                                                   retry_after=e.retry_after))
            return
        req = Request(self.requests.new_rid(), identity, msg.request_id, ids, msg.sampling, msg.stream,
                      self.text.completion(msg.stop), may_migrate=msg.migrate)
        self.requests.add(req)
        self.queue.push(req)
        await self.dispatch()

    # ---- dispatch -----------------------------------------------------------------------------------
    async def dispatch(self) -> None:
        """router -> workers: queued requests, oldest first, while some worker can take the oldest (dispatch.py)."""
        await self.dispatcher.run(self.queue)

    # ---- workers ------------------------------------------------------------------------------------
    async def on_worker(self, identity: bytes, msg: P.Message) -> None:
        if isinstance(msg, P.WorkerHello):
            return await self.on_hello(identity, msg)
        worker = self.registry.by_identity(identity)
        if worker is None:  # only a worker that said hello (and was accepted) speaks for requests
            if not isinstance(msg, P.Error):  # never answer an error with one: two peers could loop forever
                await self.backend.send_multipart([identity, P.encode(P.Error(
                    request_id="", code=P.UNAUTHORIZED, message="send worker_hello first"))])
            return
        if isinstance(msg, P.TokenBatch):
            for update in msg.updates:
                await self.on_tokens(worker, update)
        elif isinstance(msg, (P.Heartbeat, P.Alive)) and msg.worker_id != worker.worker_id:
            log.warning("worker %s sent a %s for %s", worker.worker_id, msg.TYPE, msg.worker_id)
        elif isinstance(msg, P.Heartbeat):
            if not worker.alive:
                await self.on_worker_back(worker)
            self.disagg.observe_load(worker.role, worker.load, msg.load)
            self.registry.heartbeat(worker, msg)
            await self.dispatch()
        elif isinstance(msg, P.Alive):
            await self.on_alive(worker, msg)
        elif isinstance(msg, P.Reserved):
            await self.on_reserved(worker, msg)
        elif isinstance(msg, P.LinkOpened):
            self.links.answered(worker, msg)
        elif isinstance(msg, P.Error):
            await self.on_worker_error(worker, msg)
        elif isinstance(msg, P.Ping):
            await self.to_worker(worker, P.Pong(nonce=msg.nonce))

    async def on_hello(self, identity: bytes, msg: P.WorkerHello) -> None:
        old = self.registry.workers.get(msg.worker_id)
        if old is not None and old.alive:  # a restarted worker: what its old self held is gone
            await self.on_worker_lost(old, "restarted")
        self.placement.forget_worker(msg.worker_id)  # and so is its prefix cache
        try:
            self.registry.register(msg, identity)
            log.info("worker %s (%s) joined: %d KV blocks", msg.worker_id, msg.role, msg.num_blocks)
        except ValueError as e:
            log.error("refusing worker %s: %s", msg.worker_id, e)
            await self.backend.send_multipart([identity, P.encode(P.Shutdown(reason=str(e)[:P.MAX_MESSAGE_LEN]))])
            return
        await self.links.meet(self.registry.workers[msg.worker_id])  # KV links opened before a handoff needs them
        await self.dispatch()

    async def on_alive(self, worker: WorkerInfo, msg: P.Alive) -> None:
        """A worker inside a long step: busy, not dead (common/worker/liveness.py)."""
        if not worker.alive:
            await self.on_worker_back(worker)
        if worker.busy_seconds < self.config.worker_timeout <= msg.busy_seconds:  # once a step
            log.info("%s worker %s is busy in one step for %.0f s (longer than --worker-timeout); it is alive",
                     worker.role, worker.worker_id, msg.busy_seconds)
        self.registry.alive(worker, msg)

    async def on_reserved(self, worker: WorkerInfo, msg: P.Reserved) -> None:
        """decode reserved blocks -> prefill batch: the prompt goes to the prefill worker, with where its KV goes."""
        req = self.requests.get(msg.request_id)
        if req is None or req.phase is not Phase.RESERVING or req.decode.worker_id != worker.worker_id:
            return  # aborted or restarted meanwhile: the abort_request that followed the reserve frees the blocks
        prefill = req.prefill if req.prefill.accepting else self.placement.prefill(len(req.attempt_ids), req.keys)
        if prefill is None:
            return await self.fail(req, P.UNAVAILABLE, "no prefill worker is available",
                                   retry_after=self.config.retry_after)
        try:
            transport = self.placement.transport(prefill, worker)
        except TransferError as e:  # --kv-transport names one these two workers cannot use
            return await self.fail(req, P.UNAVAILABLE, str(e))
        if prefill is not req.prefill:  # the paired one stopped accepting
            self.placement.placed(prefill, req.keys)
        req.reserved(prefill)
        await self.to_worker(prefill, P.PrefillTask(
            request_id=req.rid, token_ids=req.attempt_ids, sampling=req.attempt_sampling,
            decode_worker_id=worker.worker_id,
            decode_kv_address=worker.hello.kv_address, dst_block_ids=msg.block_ids, transport=transport,
            decode_kv=worker.hello.kv))

    async def on_worker_error(self, worker: WorkerInfo, msg: P.Error) -> None:
        req = self.requests.get(msg.request_id)
        if req is None or not req.held_by(worker.worker_id):
            if msg.request_id == "":
                log.warning("worker %s error: %s: %s", worker.worker_id, msg.code, msg.message)
            return
        if req.phase is Phase.RESERVING and msg.code == P.OVERLOADED:  # try again when blocks free up
            req.requeue()
            self.queue.push(req, front=True)
            return
        await self.fail(req, msg.code, msg.message, msg.retry_after)

    async def on_tokens(self, worker: WorkerInfo, u: P.TokenUpdate) -> None:
        """decode batch -> tokens -> client."""
        req = self.requests.get(u.request_id)
        if req is None or req.decode is None or req.decode.worker_id != worker.worker_id:
            return
        now = time.monotonic()
        if req.awaiting_first_token:
            if not req.resumed_at:  # a migrated attempt's cache hits are not the client's prompt's
                req.cached_tokens = u.cached_tokens
            if req.estimate is not None:
                self.disagg.observe_first_token(req.estimate, now - req.dispatched)
            req.first_token()
        index, ids, text = len(req.token_ids), u.token_ids, ""
        if req.stream or req.detok.stops:
            text, kept = req.detok.add(ids)
            ids = ids[:kept]
        req.token_ids.extend(ids)
        req.token_times.extend([now] * len(ids))
        if req.stream:
            await self.to_client(req.client, P.Delta(request_id=req.client_rid, token_ids=ids, text=text, index=index))
        if req.detok.stopped:  # a stop string: the worker is still generating, and is told to stop
            await self.finish(req, "stop")
        elif u.finish_reason is not None:
            await self.finish(req, u.finish_reason, from_worker=True)

    async def on_worker_lost(self, worker: WorkerInfo, why: str) -> None:
        """A worker died (or restarted): start its requests over elsewhere where the client saw nothing of
        them yet, move the others (the prompt and the tokens streamed so far prefilled again, the stream going on
        where it stopped) unless their client opted out, end the rest with `aborted`. Either way the surviving
        side frees its blocks."""
        log.error("%s worker %s %s: %d requests affected", worker.role, worker.worker_id, why, len(worker.assigned))
        worker.alive = False
        self.placement.forget_worker(worker.worker_id)
        self.links.forget(worker.worker_id)
        for rid in list(worker.assigned):
            worker.assigned.discard(rid)
            worker.lost.add(rid)
            req = self.requests.get(rid)
            if req is None:
                continue
            if not req.delivered and req.attempts < self.config.request_restarts:
                await self.restart(req)
            elif (req.delivered and req.may_migrate and req.migrations < self.config.request_migrations
                  and self.admission.fits(req.prompt_ids + req.token_ids)):
                await self.migrate(req)
            else:
                done = f" after {len(req.token_ids)} tokens" if req.token_ids else ""
                await self.fail(req, P.ABORTED, f"{worker.role} worker {worker.worker_id} {why}{done}",
                                retry_after=0.0)

    async def on_worker_back(self, worker: WorkerInfo) -> None:
        """A worker declared dead is heard from again: drop what it still holds for requests it lost."""
        log.warning("worker %s is back; aborting %d requests it lost", worker.worker_id, len(worker.lost))
        worker.alive = True
        for rid in worker.lost:
            await self.to_worker(worker, P.AbortRequest(request_id=rid))
        worker.lost.clear()

    async def restart(self, req: Request) -> None:
        """Start a request over under a new id (late messages about the old attempt are then ignored)."""
        await self._again(req, lambda rid: req.restart(rid, self.text.completion(req.detok.stops)))

    async def migrate(self, req: Request) -> None:
        """Continue a streamed request elsewhere under a new id: its prompt and the tokens the client has are
        prefilled again and decoding resumes, the stream's next `Delta.index` where it stopped."""
        log.info("request %s continues on other workers after %d tokens", req.client_rid, len(req.token_ids))
        self.migrations += 1
        await self._again(req, req.migrate)

    async def _again(self, req: Request, new_attempt: Callable[[str], None]) -> None:
        """The request's next attempt, under a new id, first in the queue; its old attempt is aborted everywhere."""
        await self._abort_on_workers(req)
        self.requests.next_attempt(req, new_attempt)
        self.queue.push(req, front=True)

    # ---- endings ------------------------------------------------------------------------------------
    async def finish(self, req: Request, reason: str, from_worker: bool = False) -> None:
        """The request's last word to the client: a `result` with whatever it produced."""
        if not from_worker:
            await self._abort_on_workers(req)
        if req.stream or req.detok.stops:
            tail = req.detok.flush()
            if tail and req.stream:
                await self.to_client(req.client, P.Delta(request_id=req.client_rid, token_ids=[], text=tail,
                                                         index=len(req.token_ids)))
            text = req.detok.text
        else:
            text = self.text.decode(req.token_ids)
        timings, usage = req.timings(time.monotonic()), req.usage()
        self.metrics.finished(reason, usage, timings)
        self.prompt_tokens += usage.prompt_tokens
        self.cached_tokens += usage.cached_tokens
        await self.to_client(req.client, P.Result(request_id=req.client_rid, token_ids=req.token_ids, text=text,
                                                  finish_reason=reason, usage=usage, timings=timings))
        self._forget(req)

    async def fail(self, req: Request, code: str, message: str, retry_after: float | None = None) -> None:
        await self._abort_on_workers(req)
        self.metrics.failed(code)
        await self.to_client(req.client, P.Error(request_id=req.client_rid, code=code,
                                                 message=message[:P.MAX_MESSAGE_LEN], retry_after=retry_after))
        self._forget(req)

    def _forget(self, req: Request) -> None:
        if req.phase is Phase.QUEUED and req in self.queue:
            self.queue.remove(req)
        req.end()
        self.requests.remove(req)

    async def _abort_on_workers(self, req: Request) -> None:
        for worker in [w for w in req.workers if w.alive]:
            await self.to_worker(worker, P.AbortRequest(request_id=req.rid))

    # ---- io -----------------------------------------------------------------------------------------
    def stats(self) -> P.Stats:
        loop, gc = self.stalls.loop, self.stalls.gc
        totals = P.RouterTotals(prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
                                migrations=self.migrations, local_prefills=self.disagg.local_choices,
                                remote_prefills=self.disagg.remote_choices, kv_links_opened=self.links.opened_count,
                                loop_stalls=loop.stalls, loop_stall_seconds=loop.stalled_seconds, gc_pauses=gc.count,
                                gc_seconds=gc.seconds)
        return P.Stats(uptime=time.monotonic() - self.started, requests_in_flight=len(self.requests),
                       queued_requests=len(self.queue), workers=[w.stats() for w in self.registry.workers.values()],
                       totals=totals, kv_links_opening=self.links.still_opening())

    async def to_client(self, identity: bytes, msg: P.Message) -> None:
        sink = self.local_clients.get(identity)
        if sink is not None:
            sink(msg)
        else:
            await self.frontend.send_multipart([identity, P.encode(msg)])

    async def to_worker(self, worker: WorkerInfo, msg: P.Message) -> None:
        await self.backend.send_multipart([worker.identity, P.encode(msg)])

    async def _broadcast(self, msg: P.Message) -> None:
        for worker in [w for w in self.registry.workers.values() if w.alive]:
            await self.to_worker(worker, msg)
