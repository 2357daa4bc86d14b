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

import zmq
import zmq.asyncio

from common import protocol as P
from common.llm import encode_prompt, load_tokenizer
from common.sampling_params import InvalidRequest, SamplingParams
from kvtransfer import TransferError, choose_transport, peer_info
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
    worker_timeout: float = field(default=10.0, metadata={"help": "seconds without a heartbeat before a "
                                                                   "worker counts as dead"})


@dataclass
class Request:
    rid: str  # the router's id: every worker message about this request carries it
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


class Router:
    def __init__(self, config: RouterConfig):
        if config.mode not in ("disagg", "colocated"):
            raise ValueError(f"mode: must be disagg or colocated, got {config.mode!r}")
        self.config = config
        self.tokenizer = load_tokenizer(config.model)
        self.ctx = zmq.asyncio.Context()
        self.frontend = self._socket(config.bind)
        self.backend = self.ctx.socket(zmq.ROUTER)
        self.backend.setsockopt(zmq.LINGER, 0)
        port = self.backend.bind_to_random_port(f"tcp://{config.worker_host}")
        self.worker_address = f"tcp://{config.worker_host}:{port}"
        self.registry = WorkerRegistry()
        self.requests: dict[str, Request] = {}
        self.by_client: dict[tuple[bytes, str], str] = {}
        self.queue: deque[str] = deque()
        self.started = time.monotonic()
        self._ids = itertools.count()
        self._prefix = os.urandom(3).hex()

    def _socket(self, address: str) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # A hard cap on what a peer can make us buffer; frames under it but over the protocol's limit
        # still get a `too_large` reply.
        sock.setsockopt(zmq.MAXMSGSIZE, 4 * P.MAX_FRAME_BYTES)
        sock.bind(address)
        return sock

    # ---- loops --------------------------------------------------------------------------------------
    async def serve(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(c) for c in (self._client_loop(), self._worker_loop(), self._housekeeping())]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._broadcast(P.Shutdown(reason="router stopping"))

    def close(self) -> None:
        self.frontend.close()
        self.backend.close()
        self.ctx.term()

    async def _client_loop(self) -> None:
        while True:
            identity, *frames = await self.frontend.recv_multipart()
            try:
                if len(frames) != 1:
                    raise P.ProtocolError(P.BAD_REQUEST, f"a message must be one frame, got {len(frames)}")
                await self.on_client(identity, P.decode(frames[0], expect=P.CLIENT_TO_ROUTER))
            except P.ProtocolError as e:
                await self.to_client(identity, e.to_error())
            except Exception:
                log.exception("router failed on a client message")
                await self.to_client(identity, P.Error(request_id="", code=P.INTERNAL, message="router error"))

    async def _worker_loop(self) -> None:
        while True:
            identity, frame = await self.backend.recv_multipart()
            try:
                await self.on_worker(identity, P.decode(frame, expect=P.WORKER_TO_ROUTER))
            except P.ProtocolError as e:
                log.warning("bad frame from worker %r: %s", identity, e)
            except Exception:
                log.exception("router failed on a worker message")

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.worker_timeout / 4))
            for worker in self.registry.expire(self.config.worker_timeout):
                log.error("worker %s stopped answering", worker.worker_id)
                await self.on_worker_lost(worker)
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

    async def submit(self, identity: bytes, msg: P.Submit) -> None:
        """request -> router: validate, tokenize, queue."""
        def refuse(code: str, message: str, retry_after: float | None = None):
            return self.to_client(identity, P.Error(request_id=msg.request_id, code=code, message=message,
                                                    retry_after=retry_after))

        if (identity, msg.request_id) in self.by_client:
            return await refuse(P.BAD_REQUEST, f"request_id {msg.request_id!r} is already in flight")
        limits = self.registry.limits()
        if limits is None or not self.registry.can_serve(self.config.mode):
            return await refuse(P.UNAVAILABLE, "no workers are ready", retry_after=1.0)
        if len(self.queue) >= self.config.max_queued_requests:
            return await refuse(P.OVERLOADED, f"{len(self.queue)} requests are queued", retry_after=1.0)
        try:
            ids = list(msg.token_ids) if msg.token_ids is not None else encode_prompt(self.tokenizer, msg.prompt, msg.chat)
            self.check_prompt(ids, *limits)
        except InvalidRequest as e:
            return await refuse(P.BAD_REQUEST, str(e))
        rid = f"{self._prefix}-{next(self._ids)}"
        req = Request(rid, identity, msg.request_id, ids, msg.sampling, msg.stream, IncrementalDetokenizer(self.tokenizer))
        self.requests[rid] = req
        self.by_client[(identity, msg.request_id)] = rid
        self.queue.append(rid)
        await self.dispatch()

    def check_prompt(self, ids: list[int], max_model_len: int, vocab_size: int) -> None:
        if not ids:
            raise InvalidRequest("prompt", "is empty")
        if len(ids) > max_model_len:
            raise InvalidRequest("prompt", f"has {len(ids)} tokens, more than max_model_len={max_model_len}")
        if max(ids) >= vocab_size:
            raise InvalidRequest("token_ids", f"every token id must be below the vocabulary size {vocab_size}")
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
            req = self.requests[self.queue[0]]
            if self.config.mode == "colocated":
                worker = self.registry.pick_colocated()
                if worker is None:
                    return
                req.decode, req.phase = worker.worker_id, "running"
                worker.prefill_tokens += len(req.prompt_ids)
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
                await self.to_worker(decode, P.Reserve(request_id=req.rid, token_ids=req.prompt_ids,
                                                       sampling=req.sampling, prefill_worker_id=prefill.worker_id))
            req.dispatched = time.monotonic()
            self.queue.popleft()

    # ---- workers ------------------------------------------------------------------------------------
    async def on_worker(self, identity: bytes, msg: P.Message) -> None:
        if isinstance(msg, P.TokenBatch):
            for update in msg.updates:
                await self.on_tokens(update)
        elif isinstance(msg, P.Heartbeat):
            if self.registry.heartbeat(msg) is not None:
                await self.dispatch()
        elif isinstance(msg, P.Reserved):
            await self.on_reserved(msg)
        elif isinstance(msg, P.Error):
            await self.on_worker_error(msg)
        elif isinstance(msg, P.WorkerHello):
            try:
                self.registry.register(msg, identity)
                log.info("worker %s (%s) joined: %d KV blocks", msg.worker_id, msg.role, msg.num_blocks)
            except ValueError as e:
                log.error("refusing worker %s: %s", msg.worker_id, e)
                await self.backend.send_multipart([identity, P.encode(P.Shutdown(reason=str(e)[:4096]))])
                return
            await self.dispatch()

    async def on_reserved(self, msg: P.Reserved) -> None:
        """decode reserved blocks -> send the prompt to the prefill worker."""
        req = self.requests.get(msg.request_id)
        if req is None or req.phase != "reserving":
            return  # aborted meanwhile: the abort_request that followed the reserve frees the blocks
        workers = self.registry.workers
        prefill, decode = workers[req.prefill], workers[req.decode]
        if not prefill.accepting:
            prefill = self.registry.pick_prefill()
            if prefill is None:
                return await self.fail(req, P.UNAVAILABLE, "no prefill worker is available")
            req.prefill = prefill.worker_id
        try:
            transport = choose_transport(peer_info(prefill.hello), peer_info(decode.hello), self.config.kv_transport)
        except TransferError as e:  # --kv-transport names one these two workers cannot use
            return await self.fail(req, P.UNAVAILABLE, str(e))
        req.phase = "prefilling"
        await self.to_worker(prefill, P.PrefillTask(
            request_id=req.rid, token_ids=req.prompt_ids, sampling=req.sampling, decode_worker_id=decode.worker_id,
            decode_kv_address=decode.hello.kv_address, dst_block_ids=msg.block_ids, transport=transport,
            decode_kv_descriptor=decode.hello.kv_descriptor))

    async def on_worker_error(self, msg: P.Error) -> None:
        req = self.requests.get(msg.request_id)
        if req is None:
            if msg.request_id == "":
                log.warning("worker error: %s: %s", msg.code, msg.message)
            return
        if req.phase == "reserving" and msg.code == P.OVERLOADED:  # try again when blocks free up
            self._undo_dispatch(req)
            self.queue.appendleft(req.rid)
            return
        await self.fail(req, msg.code, msg.message)

    async def on_tokens(self, u: P.TokenUpdate) -> None:
        """decode batch -> tokens -> client."""
        req = self.requests.get(u.request_id)
        if req is None:
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

    async def on_worker_lost(self, worker: WorkerInfo) -> None:
        for req in [r for r in self.requests.values() if worker.worker_id in (r.prefill, r.decode)]:
            if worker.worker_id == req.prefill and req.phase in ("reserving", "prefilling"):
                # Nothing the client saw is lost: give the reservation back and start over elsewhere.
                await self._abort_on_workers(req.rid, [self.registry.workers[req.decode]])
                self._undo_dispatch(req)
                self.queue.appendleft(req.rid)
            else:
                await self.fail(req, P.UNAVAILABLE, f"worker {worker.worker_id} died")

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

    async def fail(self, req: Request, code: str, message: str) -> None:
        await self._abort_on_workers(req.rid, self._workers_of(req))
        await self.to_client(req.client, P.Error(request_id=req.client_rid, code=code, message=message[:4096]))
        self._forget(req)

    def _forget(self, req: Request) -> None:
        self._prefill_done(req)
        self.requests.pop(req.rid, None)
        self.by_client.pop((req.client, req.client_rid), None)
        if req.phase == "queued" and req.rid in self.queue:
            self.queue.remove(req.rid)

    def _prefill_done(self, req: Request) -> None:
        worker = self.registry.workers.get(req.prefill or req.decode or "")
        if worker is not None and not req.token_ids and req.phase != "queued":
            worker.prefill_tokens = max(0, worker.prefill_tokens - len(req.prompt_ids))

    def _undo_dispatch(self, req: Request) -> None:
        self._prefill_done(req)
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
