"""The router: clients in front, workers behind, every request's life in between.

request -> router (`submit`) -> decode worker reserves blocks (`reserve`/`reserved`) -> prefill worker
(`prefill_task`) -> KV handoff -> decode worker -> `token_batch` -> router -> `delta`/`result` -> client.
In colocated mode one `generate_task` replaces the reserve/prefill pair.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import zmq
import zmq.asyncio

from common import auth
from common import protocol as P
from common.prompt import check_prompt, encode_prompt, load_tokenizer
from common.sampling_params import InvalidRequest, SamplingParams
from kvtransfer.choice import choose_transport
from kvtransfer.errors import TransferError
from router.detokenizer import IncrementalDetokenizer
from router.registry import WorkerInfo, WorkerRegistry

log = logging.getLogger(__name__)


@dataclass
class RouterConfig:
    model: str = field(metadata={"help": "checkpoint folder; the router uses its tokenizer and chat template"})
    bind: str = field(default=P.DEFAULT_ROUTER_ADDRESS, metadata={"help": "client endpoint (ZMQ ROUTER)"})
    worker_host: str = field(default="127.0.0.1", metadata={"help": "interface the worker endpoint binds"})
    mode: str = field(default="disagg", metadata={"help": "disagg or colocated"})
    kv_transport: str = field(default="auto", metadata={"help": "auto, host, cuda_ipc or nccl (gloo on cpu)"})
    max_queued_requests: int = field(default=4096, metadata={"help": "requests waiting for a worker before "
                                                                       "new ones get `overloaded`"})
    max_queued_tokens: int = field(default=1 << 20, metadata={"help": "prompt tokens waiting for a worker before "
                                                                       "new requests get `overloaded`"})
    max_worker_requests: int = field(default=1024, metadata={"help": "requests one worker holds at a time (queued "
                                                                      "or running); more wait at the router"})
    retry_after: float = field(default=1.0, metadata={"help": "seconds an `overloaded` or `unavailable` reply "
                                                              "asks the client to wait before retrying"})
    worker_timeout: float = field(default=5.0, metadata={"help": "seconds without a heartbeat before a "
                                                                  "worker counts as dead"})
    request_restarts: int = field(default=1, metadata={"help": "times a request is started over on other workers "
                                                                "when one dies before the client saw a token"})
    drain_timeout: float = field(default=120.0, metadata={"help": "seconds a worker being removed (`pdcluster "
                                                                   "scale`) gets to finish its requests; those "
                                                                   "left are then handled as if it died"})
    auth_token_file: str | None = field(default=None, metadata={
        "help": f"file holding the cluster's shared secret (or set {auth.TOKEN_ENV}); needed to bind a "
                "non-loopback address; clients and workers must hold it too"})


@dataclass(eq=False)
class Request:
    rid: str  # the router's id of this attempt: every worker message about it carries it
    client: bytes
    client_rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    stream: bool
    detok: IncrementalDetokenizer
    arrival: float = field(default_factory=time.monotonic)
    dispatched: float | None = None
    phase: str = "queued"  # queued -> reserving -> prefilling -> decoding (colocated: queued -> running)
    prefill: str | None = None
    decode: str | None = None
    token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    attempts: int = 0  # restarts after a worker died

    @property
    def delivered(self) -> bool:
        """Whether the client has seen part of the completion (then it cannot be started over)."""
        return self.stream and bool(self.token_ids)


class Scaler(Protocol):
    """Starts and stops worker processes for the router (the launcher, which owns Ray)."""

    async def add(self, role: str, count: int) -> list[str]:
        """Starts `count` workers of `role`; returns their ids once they have loaded (they then say hello)."""

    async def remove(self, worker_id: str) -> None:
        """Stops a worker the router has drained."""


class WaitQueue:
    """Requests waiting for a worker, oldest first, with their prompt tokens counted for admission control."""

    def __init__(self) -> None:
        self._items: deque[Request] = deque()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, req: Request) -> bool:
        return req in self._items

    def push(self, req: Request, front: bool = False) -> None:
        (self._items.appendleft if front else self._items.append)(req)
        self.tokens += len(req.prompt_ids)

    def peek(self) -> Request:
        return self._items[0]

    def pop(self) -> Request:
        req = self._items.popleft()
        self.tokens -= len(req.prompt_ids)
        return req

    def remove(self, req: Request) -> None:
        self._items.remove(req)
        self.tokens -= len(req.prompt_ids)


class Router:
    def __init__(self, config: RouterConfig):
        if config.mode not in ("disagg", "colocated"):
            raise ValueError(f"mode: must be disagg or colocated, got {config.mode!r}")
        for name in ("max_worker_requests", "worker_timeout"):  # zero would queue every request forever
            if not getattr(config, name) > 0:
                raise ValueError(f"{name}: must be positive, got {getattr(config, name)}")
        for name in ("max_queued_requests", "max_queued_tokens", "retry_after", "request_restarts"):
            if not getattr(config, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(config, name)}")
        # Before anything slow: serving another machine without a secret is refused outright.
        self.auth_token = auth.load_token(config.auth_token_file)
        auth.require_token_for([config.bind, config.worker_host], self.auth_token)
        keys = auth.keys_from_token(self.auth_token) if self.auth_token else None
        self.config = config
        self.tokenizer = load_tokenizer(config.model)
        self.ctx = zmq.asyncio.Context()
        self._authenticator = auth.start_authenticator(self.ctx, keys) if keys else None
        self.frontend = self._socket(config.bind, keys)
        self.backend = self.ctx.socket(zmq.ROUTER)
        self.backend.setsockopt(zmq.LINGER, 0)
        self.backend.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted worker reconnects under its old identity
        if keys:
            auth.secure_server(self.backend, keys)
        port = self.backend.bind_to_random_port(f"tcp://{config.worker_host}")
        self.worker_address = f"tcp://{config.worker_host}:{port}"
        self.registry = WorkerRegistry(config.max_worker_requests)
        self.requests: dict[str, Request] = {}
        self.by_client: dict[tuple[bytes, str], str] = {}
        self.queue = WaitQueue()
        self.started = time.monotonic()
        self._ids = itertools.count()
        self._prefix = os.urandom(3).hex()
        self.scaler: Scaler | None = None  # set by the launcher; without one, scale requests are refused
        self._scaling = asyncio.Lock()  # one scale request at a time
        self._scale_tasks: set[asyncio.Task] = set()
        self._pairs: set[tuple[str, str]] = set()  # prefill -> decode pairs whose transport was logged

    def _socket(self, address: str, keys: auth.CurveKeys | None) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 1000)  # time to deliver the errors sent while shutting down
        # A hard cap on what a peer can make us buffer; frames under it but over the protocol's limit
        # still get a `too_large` reply.
        sock.setsockopt(zmq.MAXMSGSIZE, 4 * P.MAX_FRAME_BYTES)
        if keys:
            auth.secure_server(sock, keys)
        sock.bind(address)
        return sock

    def _new_rid(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    # ---- loops --------------------------------------------------------------------------------------
    async def serve(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(c) for c in (self._client_loop(), self._worker_loop(), self._housekeeping())]
        await stop.wait()
        tasks += self._scale_tasks
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for req in list(self.requests.values()):  # every request still gets its terminal message
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
        while True:
            identity, *frames = await self.frontend.recv_multipart()
            try:
                if len(frames) != 1:
                    raise P.ProtocolError(P.BAD_REQUEST, f"a message must be one frame, got {len(frames)}")
                await self.on_client(identity, P.decode(frames[0], expect=P.CLIENT_TO_ROUTER))
            except P.ProtocolError as e:
                await self.to_client(identity, P.error_reply(e))
            except Exception:
                log.exception("router failed on a client message")
                await self.to_client(identity, P.Error(request_id="", code=P.INTERNAL, message="router error"))

    async def _worker_loop(self) -> None:
        while True:
            identity, *frames = await self.backend.recv_multipart()
            try:
                if len(frames) != 1:
                    raise P.ProtocolError(P.BAD_REQUEST, f"a message must be one frame, got {len(frames)}")
                await self.on_worker(identity, P.decode(frames[0], expect=P.WORKER_TO_ROUTER))
            except P.ProtocolError as e:
                log.warning("bad frame from worker %r: %s", identity, e)
            except Exception:
                log.exception("router failed on a worker message")

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
            rid = self.by_client.get((identity, msg.request_id))
            if rid is not None:
                await self.finish(self.requests[rid], "abort")
        elif isinstance(msg, P.Ping):
            await self.to_client(identity, P.Pong(nonce=msg.nonce))
        elif isinstance(msg, P.StatsRequest):
            await self.to_client(identity, self.stats())
        elif isinstance(msg, P.ScaleRequest):  # takes long: answered when done, other messages meanwhile
            task = asyncio.create_task(self._answer_scale(identity, msg))
            self._scale_tasks.add(task)
            task.add_done_callback(self._scale_tasks.discard)

    async def _answer_scale(self, identity: bytes, msg: P.ScaleRequest) -> None:
        try:
            ok, message, ids = await self.scale(msg.role, msg.delta)
        except Exception as e:
            log.exception("scaling %s by %+d failed", msg.role, msg.delta)
            ok, message, ids = False, f"scaling failed: {e}", []
        await self.to_client(identity, P.ScaleReply(nonce=msg.nonce, ok=ok, message=message[:P.MAX_MESSAGE_LEN],
                                                    workers=ids))

    # ---- scaling ------------------------------------------------------------------------------------
    async def scale(self, role: str, delta: int) -> tuple[bool, str, list[str]]:
        """Adds or removes `delta` workers of `role`: (ok, what happened, the ids added or removed)."""
        roles = ("colocated",) if self.config.mode == "colocated" else ("prefill", "decode")
        if role not in roles:
            return False, f"a {self.config.mode} cluster has no {role} workers (it has: {', '.join(roles)})", []
        if self.scaler is None:
            return False, "this router was not started by `pdcluster serve`: nothing can start workers", []
        async with self._scaling:
            return await (self._add(role, delta) if delta > 0 else self._remove(role, -delta))

    async def _add(self, role: str, count: int) -> tuple[bool, str, list[str]]:
        ids = await self.scaler.add(role, count)
        def joined() -> bool:
            return all(i in self.registry.workers and self.registry.workers[i].accepting for i in ids)
        if not await _wait_until(joined, self.config.drain_timeout):
            return False, f"started {', '.join(ids)}, but not all joined within {self.config.drain_timeout:g} s", ids
        log.info("scaled %s up by %d: %s", role, count, ", ".join(ids))
        return True, f"added {role} workers {', '.join(ids)}", ids

    async def _remove(self, role: str, count: int) -> tuple[bool, str, list[str]]:
        """Drain, then stop: the router stops assigning to the workers, waits until they hold nothing
        (bounded by `drain_timeout`), then the launcher stops them and they are forgotten."""
        try:
            victims = self.registry.pick_removal(role, count)
        except ValueError as e:
            return False, str(e), []
        started = time.monotonic()
        for worker in victims:
            worker.draining = True
        log.info("draining %s", ", ".join(w.worker_id for w in victims))
        drained = await _wait_until(lambda: all(w.idle_since(started) for w in victims), self.config.drain_timeout)
        for worker in victims:
            if worker.assigned:  # past the timeout: as if it died (moved if unseen, else aborted)
                await self.on_worker_lost(worker, f"was removed after the {self.config.drain_timeout:g} s drain timeout")
            await self.scaler.remove(worker.worker_id)
            self.registry.forget(worker.worker_id)
        ids = [w.worker_id for w in victims]
        log.info("scaled %s down by %d: %s", role, count, ", ".join(ids))
        late = "" if drained else f" (the drain timed out after {self.config.drain_timeout:g} s)"
        return True, f"removed {role} workers {', '.join(ids)}{late}", ids

    async def submit(self, identity: bytes, msg: P.Submit) -> None:
        """request -> router: validate, admit, tokenize, queue."""
        def refuse(code: str, message: str, retry_after: float | None = None):
            return self.to_client(identity, P.Error(request_id=msg.request_id, code=code, message=message,
                                                    retry_after=retry_after))

        if (identity, msg.request_id) in self.by_client:
            return await refuse(P.BAD_REQUEST, f"request_id {msg.request_id!r} is already in flight")
        limits = self.registry.limits()
        if limits is None or not self.registry.can_serve(self.config.mode):
            return await refuse(P.UNAVAILABLE, "no workers are ready", retry_after=self.config.retry_after)
        if len(self.queue) >= self.config.max_queued_requests:
            return await refuse(P.OVERLOADED, f"{len(self.queue)} requests are queued",
                                retry_after=self.config.retry_after)
        try:
            ids = list(msg.token_ids) if msg.token_ids is not None else encode_prompt(self.tokenizer, msg.prompt, msg.chat)
            self.check_prompt(ids, *limits)
        except InvalidRequest as e:
            return await refuse(P.BAD_REQUEST, str(e))
        if self.queue and self.queue.tokens + len(ids) > self.config.max_queued_tokens:
            return await refuse(P.OVERLOADED, f"{self.queue.tokens} prompt tokens are queued",
                                retry_after=self.config.retry_after)
        req = Request(self._new_rid(), identity, msg.request_id, ids, msg.sampling, msg.stream,
                      IncrementalDetokenizer(self.tokenizer))
        self.requests[req.rid] = req
        self.by_client[(identity, msg.request_id)] = req.rid
        self.queue.push(req)
        await self.dispatch()

    def check_prompt(self, ids: list[int], max_model_len: int, vocab_size: int) -> None:
        check_prompt(ids, max_model_len, vocab_size)
        if self.config.mode == "disagg":
            largest = max(w.load.kv_blocks_total for w in self.registry.of_role("decode"))
            if self._blocks_needed(ids) > largest:
                raise InvalidRequest("prompt", "needs more KV cache than any decode worker has")

    def _blocks_needed(self, ids: list[int]) -> int:
        block_size = next(iter(self.registry.workers.values())).hello.layout.block_size
        return -(-(len(ids) + 1) // block_size)

    # ---- dispatch -----------------------------------------------------------------------------------
    async def dispatch(self) -> None:
        """Hand queued requests to workers, oldest first, while some worker can take the oldest."""
        while self.queue:
            req = self.queue.peek()
            if self.config.mode == "colocated":
                worker = self.registry.pick_colocated()
                if worker is None:
                    return
                req.decode, req.phase = worker.worker_id, "running"
                worker.prefill_tokens += len(req.prompt_ids)
                worker.assigned.add(req.rid)
                await self.to_worker(worker, P.GenerateTask(request_id=req.rid, token_ids=req.prompt_ids,
                                                            sampling=req.sampling))
            else:
                need = self._blocks_needed(req.prompt_ids)
                decode, prefill = self.registry.pick_decode(need), self.registry.pick_prefill()
                if decode is None or prefill is None:
                    return
                req.decode, req.prefill, req.phase = decode.worker_id, prefill.worker_id, "reserving"
                decode.blocks_promised += need
                prefill.prefill_tokens += len(req.prompt_ids)
                decode.assigned.add(req.rid)
                prefill.assigned.add(req.rid)
                await self.to_worker(decode, P.Reserve(request_id=req.rid, token_ids=req.prompt_ids,
                                                       sampling=req.sampling, prefill_worker_id=prefill.worker_id))
            req.dispatched = time.monotonic()
            self.queue.pop()

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
        elif isinstance(msg, P.Heartbeat):
            if msg.worker_id != worker.worker_id:
                log.warning("worker %s sent a heartbeat for %s", worker.worker_id, msg.worker_id)
                return
            if not worker.alive:
                await self.on_worker_back(worker)
            self.registry.heartbeat(worker, msg)
            await self.dispatch()
        elif isinstance(msg, P.Reserved):
            await self.on_reserved(worker, msg)
        elif isinstance(msg, P.Error):
            await self.on_worker_error(worker, msg)
        elif isinstance(msg, P.Ping):
            await self.to_worker(worker, P.Pong(nonce=msg.nonce))

    async def on_hello(self, identity: bytes, msg: P.WorkerHello) -> None:
        old = self.registry.workers.get(msg.worker_id)
        if old is not None and old.alive:  # a restarted worker: what its old self held is gone
            await self.on_worker_lost(old, "restarted")
        try:
            self.registry.register(msg, identity)
            log.info("worker %s (%s) joined: %d KV blocks", msg.worker_id, msg.role, msg.num_blocks)
        except ValueError as e:
            log.error("refusing worker %s: %s", msg.worker_id, e)
            await self.backend.send_multipart([identity, P.encode(P.Shutdown(reason=str(e)[:4096]))])
            return
        await self.dispatch()

    async def on_reserved(self, worker: WorkerInfo, msg: P.Reserved) -> None:
        """decode reserved blocks -> send the prompt to the prefill worker."""
        req = self.requests.get(msg.request_id)
        if req is None or req.phase != "reserving" or req.decode != worker.worker_id:
            return  # aborted or restarted meanwhile: the abort_request that followed the reserve frees the blocks
        workers = self.registry.workers
        prefill, decode = workers[req.prefill], worker
        if not prefill.accepting:
            self._prefill_done(req)
            prefill = self.registry.pick_prefill()
            if prefill is None:
                return await self.fail(req, P.UNAVAILABLE, "no prefill worker is available",
                                       retry_after=self.config.retry_after)
            req.prefill = prefill.worker_id
            prefill.prefill_tokens += len(req.prompt_ids)
            prefill.assigned.add(req.rid)
        try:
            transport = choose_transport(prefill.hello, decode.hello, self.config.kv_transport)
        except TransferError as e:  # --kv-transport names one these two workers cannot use
            return await self.fail(req, P.UNAVAILABLE, str(e))
        if (prefill.worker_id, decode.worker_id) not in self._pairs:
            self._pairs.add((prefill.worker_id, decode.worker_id))
            log.info("KV transport %s -> %s: %s (nodes %s -> %s)", prefill.worker_id, decode.worker_id, transport,
                     prefill.hello.node_id[:12] or "?", decode.hello.node_id[:12] or "?")
        req.phase = "prefilling"
        await self.to_worker(prefill, P.PrefillTask(
            request_id=req.rid, token_ids=req.prompt_ids, sampling=req.sampling, decode_worker_id=decode.worker_id,
            decode_kv_address=decode.hello.kv_address, dst_block_ids=msg.block_ids, transport=transport,
            decode_kv=decode.hello.kv))

    async def on_worker_error(self, worker: WorkerInfo, msg: P.Error) -> None:
        req = self.requests.get(msg.request_id)
        if req is None or worker.worker_id not in (req.prefill, req.decode):
            if msg.request_id == "":
                log.warning("worker %s error: %s: %s", worker.worker_id, msg.code, msg.message)
            return
        if req.phase == "reserving" and msg.code == P.OVERLOADED:  # try again when blocks free up
            self._unassign(req)
            self._reset(req)
            self.queue.push(req, front=True)
            return
        await self.fail(req, msg.code, msg.message, msg.retry_after)

    async def on_tokens(self, worker: WorkerInfo, u: P.TokenUpdate) -> None:
        """decode batch -> tokens -> client."""
        req = self.requests.get(u.request_id)
        if req is None or req.decode != worker.worker_id:
            return
        now = time.monotonic()
        if not req.token_ids:
            self._prefill_done(req)
            req.phase = "decoding" if req.phase != "running" else req.phase
            req.cached_tokens = u.cached_tokens
        index = len(req.token_ids)
        req.token_ids.extend(u.token_ids)
        req.token_times.extend([now] * len(u.token_ids))
        if req.stream:
            text = req.detok.add(u.token_ids)
            await self.to_client(req.client, P.Delta(request_id=req.client_rid, token_ids=u.token_ids, text=text,
                                                     index=index))
        if u.finish_reason is not None:
            await self.finish(req, u.finish_reason, from_worker=True)

    async def on_worker_lost(self, worker: WorkerInfo, why: str) -> None:
        """A worker died (or restarted): start its requests over elsewhere where the client saw nothing of
        them yet, end the others with `aborted`. Either way the surviving side frees its blocks."""
        log.error("%s worker %s %s: %d requests affected", worker.role, worker.worker_id, why, len(worker.assigned))
        worker.alive = False
        for rid in list(worker.assigned):
            worker.assigned.discard(rid)
            worker.lost.add(rid)
            req = self.requests.get(rid)
            if req is None:
                continue
            if not req.delivered and req.attempts < self.config.request_restarts:
                await self.restart(req)
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
        await self._abort_on_workers(req.rid, self._workers_of(req))
        self._unassign(req)
        self.requests.pop(req.rid, None)
        req.rid, req.attempts = self._new_rid(), req.attempts + 1
        req.token_ids, req.token_times, req.cached_tokens = [], [], 0
        req.detok = IncrementalDetokenizer(self.tokenizer)
        self._reset(req)
        self.requests[req.rid] = req
        self.by_client[(req.client, req.client_rid)] = req.rid
        self.queue.push(req, front=True)

    # ---- endings ------------------------------------------------------------------------------------
    async def finish(self, req: Request, reason: str, from_worker: bool = False) -> None:
        """The request's last word to the client: a `result` with whatever it produced."""
        if not from_worker:
            await self._abort_on_workers(req.rid, self._workers_of(req))
        if req.stream:
            tail = req.detok.flush()
            if tail:
                await self.to_client(req.client, P.Delta(request_id=req.client_rid, token_ids=[], text=tail,
                                                         index=len(req.token_ids)))
            text = req.detok.text
        else:
            text = self.tokenizer.decode(req.token_ids, skip_special_tokens=True)
        now = time.monotonic()
        first = req.token_times[0] if req.token_times else None
        timings = P.Timings(queued=(req.dispatched or now) - req.arrival,
                            ttft=None if first is None else first - req.arrival, e2e=now - req.arrival,
                            itl=[b - a for a, b in zip(req.token_times, req.token_times[1:])])
        usage = P.Usage(prompt_tokens=len(req.prompt_ids), completion_tokens=len(req.token_ids),
                        cached_tokens=min(req.cached_tokens, len(req.prompt_ids)))
        await self.to_client(req.client, P.Result(request_id=req.client_rid, token_ids=req.token_ids, text=text,
                                                  finish_reason=reason, usage=usage, timings=timings))
        self._forget(req)

    async def fail(self, req: Request, code: str, message: str, retry_after: float | None = None) -> None:
        await self._abort_on_workers(req.rid, self._workers_of(req))
        await self.to_client(req.client, P.Error(request_id=req.client_rid, code=code, message=message[:4096],
                                                 retry_after=retry_after))
        self._forget(req)

    def _forget(self, req: Request) -> None:
        self._unassign(req)
        self.requests.pop(req.rid, None)
        self.by_client.pop((req.client, req.client_rid), None)
        if req.phase == "queued" and req in self.queue:
            self.queue.remove(req)

    def _prefill_done(self, req: Request) -> None:
        """The prompt left the prefill stage (its first token came, or the request ended there)."""
        if req.phase == "queued" or req.token_ids:
            return  # not dispatched, or already counted off
        worker = self.registry.workers.get(req.prefill or req.decode or "")
        if worker is not None:
            worker.prefill_tokens = max(0, worker.prefill_tokens - len(req.prompt_ids))
            if req.prefill is not None:
                worker.assigned.discard(req.rid)

    def _unassign(self, req: Request) -> None:
        self._prefill_done(req)
        for worker in self._workers_of(req):
            worker.assigned.discard(req.rid)

    def _reset(self, req: Request) -> None:
        req.phase, req.prefill, req.decode, req.dispatched = "queued", None, None, None

    def _workers_of(self, req: Request) -> list[WorkerInfo]:
        ids = {req.prefill, req.decode} if req.phase != "queued" else set()
        return [self.registry.workers[w] for w in ids if w in self.registry.workers]

    async def _abort_on_workers(self, rid: str, workers: list[WorkerInfo]) -> None:
        for worker in workers:
            if worker.alive:
                await self.to_worker(worker, P.AbortRequest(request_id=rid))

    # ---- io -----------------------------------------------------------------------------------------
    def stats(self) -> P.Stats:
        return P.Stats(uptime=time.monotonic() - self.started, requests_in_flight=len(self.requests),
                       queued_requests=len(self.queue), workers=[w.stats() for w in self.registry.workers.values()])

    async def to_client(self, identity: bytes, msg: P.Message) -> None:
        await self.frontend.send_multipart([identity, P.encode(msg)])

    async def to_worker(self, worker: WorkerInfo, msg: P.Message) -> None:
        await self.backend.send_multipart([worker.identity, P.encode(msg)])

    async def _broadcast(self, msg: P.Message) -> None:
        for worker in self.registry.workers.values():
            if worker.alive:
                await self.to_worker(worker, msg)


async def _wait_until(condition, timeout: float, interval: float = 0.1) -> bool:
    """Polls `condition` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True
