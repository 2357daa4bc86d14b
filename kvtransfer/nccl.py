"""NCCL: across GPUs and nodes, a two-rank process group per prefill-decode pair (gloo on CPU).

The decode worker runs a TCPStore and names it in its descriptor (host, port). On its first handoff to
a decode worker, a prefill worker opens a *link* to it: a process group of two ranks (0 = prefill,
1 = decode) under a fresh link name in that store; the decode worker joins when the first handoff
naming the link arrives. Each link has one thread per side that runs the link's transfers in order:
NCCL and gloo match point-to-point operations between two ranks in the order they are posted, and
both sides post them in `kv_handoff` record order (the data channel keeps that order).

A transfer is the blocks in destination order, cut into segments (`plan_segments`), then a small trailer
(sequence number, request id checksum, bytes, segment count). A segment whose ids are consecutive on a
side is sent from (received into) a view of that side's pool, however long; otherwise the sender gathers
a chunk of at most CHUNK_BYTES into a buffer and the receiver receives into one and scatters it into the
reserved blocks. Views are all posted at once (the NCCL stream runs them back to back); at most two
segments that hold a scratch buffer are in flight on each side, so a gather or scatter overlaps the next
message and scratch memory stays at two chunks. The thread that calls `receive` posts what needs no wait
itself, when the link has nothing earlier left to post; the link threads post the rest. The receiver
checks the trailer once everything has arrived: bytes of a link out of step could only have landed in
blocks reserved for this handoff, which then fails. (Traced on 2xH200: a header checked before posting
into the pool, and the receiving link thread's wake-up, held the bytes back ~0.4 ms a handoff.)

`send` and `receive` return at once with futures; the worker holds the request's blocks until they
resolve. A failed or timed-out operation breaks the link (its later transfers fail too, and the next
handoff opens a new link), so one lost peer costs the requests in flight to it, never a stuck worker.
"""
from __future__ import annotations

import ctypes
import logging
import os
import queue
import secrets
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from kvtransfer.cuda_ipc import gpu_uuid
from kvtransfer.choice import nccl_pair_problem
from kvtransfer.descriptors import TransferError, pack, unpack
from kvtransfer.transport import (
    BlockIds, Sent, Transport, check_block_ids, check_layout, layout_record, plan_segments,
)

log = logging.getLogger(__name__)

VERSION = 2  # 1: the trailer was a header, sent before the blocks
IN_FLIGHT = 2  # segments holding a scratch buffer (gather or scatter) posted at once, per side
_ENV_LOCK = threading.Lock()
PR_SET_TIMERSLACK = 29  # prctl option (linux/prctl.h)


def new_group(backend: str, store: dist.Store, rank: int, timeout: float) -> dist.ProcessGroup:
    """A two-rank process group on `store`, outside torch.distributed's default group (which tensor
    parallelism may own). NCCL gets blocking waits: `wait` returns when the bytes are there, and raises
    (aborting the communicator) on an error or after `timeout`, instead of the watchdog killing the process."""
    span = timedelta(seconds=timeout)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, 2, span)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = span
    with _ENV_LOCK:  # read once, by the constructor
        previous = os.environ.get("TORCH_NCCL_BLOCKING_WAIT")
        os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
        try:
            return dist.ProcessGroupNCCL(store, rank, 2, options)
        finally:
            if previous is None:
                os.environ.pop("TORCH_NCCL_BLOCKING_WAIT", None)
            else:
                os.environ["TORCH_NCCL_BLOCKING_WAIT"] = previous


class _Link:
    """One side of a two-rank process group with one peer, and the thread that runs its transfers in order."""

    def __init__(self, name: str, rank: int, peer_id: str, connect: Callable[[], dist.Store], backend: str,
                 device: torch.device, timeout: float, address: tuple = ()):
        self.name, self.rank, self.peer_id, self.address = name, rank, peer_id, address
        self.backend, self.device, self.timeout = backend, device, timeout
        self.next_seq = 0
        self.error: BaseException | None = None
        self.group: dist.ProcessGroup | None = None
        self.stream: torch.cuda.Stream | None = None
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()  # posting: the caller's thread or this link's
        self.unposted = 0  # queued transfers that the link thread still has operations of to post
        self.thread = threading.Thread(target=self._run, args=(connect,), name=f"kv-link-{name}", daemon=True)
        self.thread.start()

    def run(self, transfer: _Transfer, post_here: bool = False) -> Future:
        """Queue a transfer behind the link's earlier ones; a future that resolves when it has completed.
        With `post_here`, what can be posted at once is posted on the caller's thread, when nothing earlier
        is left to post (operations must be posted in the same order on both sides)."""
        with self.lock:
            rest = True
            if post_here and self.group is not None and self.error is None and self.unposted == 0:
                try:
                    rest = not transfer.post_now()
                except Exception as e:  # the two sides may no longer agree on what comes next
                    self.error, rest = e, False
            self.unposted += rest

        def job() -> None:
            if rest:
                try:
                    transfer.post_rest()
                finally:
                    with self.lock:
                        self.unposted -= 1
            transfer.finish()
        return self.submit(job)

    def submit(self, job: Callable[[], None]) -> Future:
        future: Future = Future()
        self.jobs.put((job, future))
        return future

    def close(self) -> None:
        """Stop after the jobs already queued."""
        self.jobs.put(None)

    def _run(self, connect: Callable[[], dist.Store]) -> None:
        _fine_timer_slack()
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
                self.stream = torch.cuda.Stream(self.device)
            store = dist.PrefixStore(f"pdcluster/kv/{self.name}/", connect())
            self.group = new_group(self.backend, store, self.rank, self.timeout)
            log.info("KV link %s to %s is open (%s, rank %d)", self.name, self.peer_id, self.backend, self.rank)
        except Exception as e:
            log.warning("KV link %s to %s did not open: %s", self.name, self.peer_id, e)
            self.error = e
        while (item := self.jobs.get()) is not None:
            job, future = item
            if self.error is not None:
                future.set_exception(TransferError(f"KV link {self.name} to {self.peer_id} is broken: {self.error}"))
                continue
            try:
                if self.stream is None:
                    job()
                else:
                    with torch.cuda.stream(self.stream):
                        job()
                    self.stream.synchronize()
                future.set_result(None)
            except Exception as e:  # the two sides may no longer agree on what comes next: stop here
                self.error = e
                future.set_exception(e if isinstance(e, TransferError) else
                                     TransferError(f"KV link {self.name} to {self.peer_id}: {type(e).__name__}: {e}"))
        if self.backend == "nccl" and self.group is not None:
            try:  # release the communicator now rather than in a destructor
                self.group.shutdown()
            except Exception:
                pass
        self.group = None


class NcclTransport(Transport):
    name = "nccl"

    def __init__(self, pool, host="127.0.0.1", timeout=60.0, strategy: str = "auto"):
        super().__init__(pool, host, timeout)
        if not dist.is_available():
            raise TransferError("the nccl KV transport needs torch.distributed, which this torch build lacks")
        self.device = pool.kv.device
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.backend == "nccl" and not dist.is_nccl_available():
            raise TransferError("the nccl KV transport needs a torch build with NCCL")
        self.gpu = ""
        if self.device.type == "cuda":
            self.gpu = gpu_uuid(self.device.index)
        self.strategy = strategy
        self.store: dist.TCPStore | None = None  # where prefill workers meet this one (decode side)
        self.sending: dict[str, _Link] = {}  # peer id -> link (prefill side)
        self.receiving: dict[str, _Link] = {}  # link name -> link (decode side)
        self.retired: list[_Link] = []  # replaced links, whose threads may still be finishing
        self._peers: dict[bytes, dict] = {}

    def descriptor(self) -> bytes:
        if self.store is None:
            self.store = dist.TCPStore(self.host, 0, None, True, timedelta(seconds=self.timeout),
                                       wait_for_workers=False)
        return pack({"v": VERSION, "backend": self.backend, "host": self.host, "port": self.store.port, "gpu": self.gpu,
                     "layout": layout_record(self.pool.layout), "num_blocks": self.pool.num_blocks})

    # ---- prefill side -------------------------------------------------------------------------------
    def send(self, request_id, peer_id, peer_descriptor, src_block_ids, dst_block_ids):
        peer = self._peer(peer_id, peer_descriptor)
        check_block_ids(src_block_ids, self.pool.num_blocks, "source")
        check_block_ids(dst_block_ids, peer["num_blocks"], f"{peer_id}'s")
        if len(src_block_ids) != len(dst_block_ids):
            raise TransferError(f"{len(src_block_ids)} source blocks for {len(dst_block_ids)} destination blocks")
        link = self.sending.get(peer_id)
        address = (peer["host"], peer["port"])
        if link is None or link.error is not None or link.address != address:
            if link is not None:
                self._retire(link)
            link = self.sending[peer_id] = _Link(
                secrets.token_hex(8), 0, peer_id, lambda: _connect(*address, self.timeout), self.backend,
                self.device, self.timeout, address)
        seq, link.next_seq = link.next_seq, link.next_seq + 1
        block_bytes = self.pool.layout.block_bytes
        segments = plan_segments(src_block_ids, dst_block_ids, block_bytes, self.strategy)
        # No wait on the compute stream: the caller saw the step that wrote these blocks finish, and overlap has
        # queued the next prefill there since (the send would start only after it).
        done = link.run(_Transfer(link, self._send_ops(seq, request_id, src_block_ids, segments), None, None))
        meta = pack({"v": VERSION, "link": link.name, "seq": seq, "request_id": request_id,
                     "block_bytes": block_bytes, "segments": [n for _, n in segments]})
        return Sent([meta], done)

    def _peer(self, peer_id: str, descriptor: bytes) -> dict:
        peer = self._peers.get(descriptor)
        if peer is None:
            if not descriptor:
                raise TransferError(f"{peer_id} published no nccl descriptor")
            peer = unpack(descriptor, f"nccl descriptor of {peer_id}",
                          ("v", "backend", "host", "port", "gpu", "layout", "num_blocks"))
            if peer["v"] != VERSION:
                raise TransferError(f"nccl descriptor of {peer_id}: version {peer['v']!r}, "
                                    f"this worker speaks {VERSION}")
            check_layout(self.pool.layout, peer["layout"], peer_id)
            problem = nccl_pair_problem({"backend": self.backend, "gpu": self.gpu}, peer)
            if problem:
                raise TransferError(f"nccl to {peer_id}: {problem}")
            self._peers[descriptor] = peer
        return peer

    def _send_ops(self, seq: int, request_id: str, src: list[int], segments: list[tuple[int, int]]) -> list[_Op]:
        """The blocks in destination order (views of the pool, or gathered), then the trailer."""
        kv = self.pool.kv
        blocks = BlockIds(kv, src)
        ops = []
        for off, n in segments:
            view = blocks.run(off, n)
            if view is not None:
                ops.append(_Op("send", lambda view=view: view))
            else:
                ops.append(_Op("send", lambda off=off, n=n: blocks.gather(off, n), scratch=True))
        total = sum(n for _, n in segments) * self.pool.layout.block_bytes
        ops.append(_Op("send", lambda: _trailer(seq, request_id, total, len(segments), kv.device)))
        return ops

    # ---- decode side --------------------------------------------------------------------------------
    def receive(self, request_id, peer_id, dst_block_ids, frames):
        meta, link = self._incoming(request_id, peer_id, frames)
        problem = None
        if meta["block_bytes"] != self.pool.layout.block_bytes:
            problem = (f"blocks of {meta['block_bytes']} bytes sent, {self.pool.layout.block_bytes} here "
                       "(KV layout mismatch)")
        elif sum(meta["segments"]) != len(dst_block_ids):
            problem = f"{sum(meta['segments'])} blocks sent for {len(dst_block_ids)} reserved"
        elif dst_block_ids and not (0 <= min(dst_block_ids) and max(dst_block_ids) < self.pool.num_blocks):
            problem = "reserved block ids out of range"
        if problem:
            self._consume(link, meta)
            raise TransferError(problem)
        return link.run(_Transfer(link, *self._recv_ops(meta, dst_block_ids), self._mark()), post_here=True)

    def discard(self, request_id, peer_id, frames):
        meta, link = self._incoming(request_id, peer_id, frames)
        return self._consume(link, meta)

    def _incoming(self, request_id: str, peer_id: str, frames: list) -> tuple[dict, _Link]:
        if len(frames) != 1:
            raise TransferError(f"an nccl handoff carries 1 metadata frame, got {len(frames)}")
        meta = unpack(frames[0], "nccl handoff metadata", ("v", "link", "seq", "request_id", "block_bytes", "segments"))
        counts = meta["segments"]
        if not (type(meta["link"]) is str and type(meta["seq"]) is int and meta["seq"] >= 0
                and type(meta["block_bytes"]) is int and meta["block_bytes"] > 0 and type(counts) is list and counts
                and all(type(n) is int and n > 0 for n in counts)):
            raise TransferError("nccl handoff metadata: malformed link, seq, block_bytes or segments")
        if meta["v"] != VERSION:
            raise TransferError(f"nccl handoff metadata: version {meta['v']!r}, this worker speaks {VERSION}")
        if meta["request_id"] != request_id:
            raise TransferError(f"nccl metadata names request {meta['request_id']!r}, the handoff {request_id!r}")
        if self.store is None:
            raise TransferError("this worker published no nccl descriptor, so no peer can reach it")
        link = self.receiving.get(meta["link"])
        if link is None:  # a new link from this peer: its older links are dead on the other side
            for name in [n for n, old in self.receiving.items() if old.peer_id == peer_id]:
                self._retire(self.receiving.pop(name))
            port = self.store.port
            link = self.receiving[meta["link"]] = _Link(
                meta["link"], 1, peer_id, lambda: _connect(self.host, port, self.timeout), self.backend,
                self.device, self.timeout)
        if meta["seq"] != link.next_seq and link.error is None:
            link.error = TransferError(f"handoffs from {peer_id} out of order: got {meta['seq']}, "
                                       f"expected {link.next_seq}")
        link.next_seq = meta["seq"] + 1
        return meta, link

    def _consume(self, link: _Link, meta: dict) -> Future:
        """Receive a refused handoff's bytes into scratch memory, so the link stays aligned."""
        return link.run(_Transfer(link, *self._recv_ops(meta, None), None))

    def _recv_ops(self, meta: dict, dst: list[int] | None) -> tuple[list[_Op], Callable[[], None]]:
        """The blocks in destination order (straight into the pool where a segment's ids are a run, else into
        a buffer scattered from), the trailer, and the check of the trailer once everything has arrived."""
        kv = self.pool.kv
        block_bytes, counts = meta["block_bytes"], meta["segments"]
        blocks = None if dst is None else BlockIds(kv, dst)
        # refused: land it anywhere (one buffer: nothing reads it)
        sink = torch.empty(max(counts) * block_bytes, dtype=torch.uint8, device=kv.device) if dst is None else None
        ops: list[_Op] = []
        off = 0
        for n in counts:
            if blocks is None:
                ops.append(_Op("recv", lambda sink=sink, n=n: sink[:n * block_bytes]))
            elif (view := blocks.run(off, n)) is not None:
                ops.append(_Op("recv", lambda view=view: view))
            else:
                ops.append(_Op("recv", lambda n=n: torch.empty((n, *kv.shape[1:]), dtype=kv.dtype, device=kv.device),
                               scratch=True,
                               then=lambda data, off=off, n=n: kv.index_copy_(0, blocks.index(off, n), data)))
            off += n
        trailer = torch.empty(4, dtype=torch.int64, device=kv.device)
        ops.append(_Op("recv", lambda: trailer))

        def check() -> None:
            expected = _trailer(meta["seq"], meta["request_id"], sum(counts) * block_bytes, len(counts), "cpu")
            if not torch.equal(trailer.cpu(), expected):
                raise TransferError(f"KV link out of step: trailer {trailer.tolist()}, expected {expected.tolist()}")
        return ops, check

    # ---- both ---------------------------------------------------------------------------------------
    def _mark(self) -> torch.cuda.Event | None:
        """An event after the work queued so far on the compute stream (CUDA), for the link's stream to wait on."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _retire(self, link: _Link) -> None:
        link.close()
        self.retired = [old for old in self.retired if old.thread.is_alive()] + [link]

    def close(self) -> None:
        links = [*self.sending.values(), *self.receiving.values()]
        for link in links:
            link.close()
        for link in links + self.retired:  # a process group torn down while the interpreter exits aborts it
            link.thread.join(5.0 if link in links else 0.5)
        self.sending.clear()
        self.receiving.clear()
        self.store = None


def _fine_timer_slack() -> None:
    """Let this thread's short sleeps (polling NCCL completion) end on time: Linux rounds a sleep up by the
    thread's timer slack, 50 us by default, which made each 20 us poll ~70 us. Elsewhere: as it is."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)  # nanoseconds
    except (OSError, AttributeError):
        pass


def _connect(host: str, port: int, timeout: float) -> dist.TCPStore:
    return dist.TCPStore(host, port, None, False, timedelta(seconds=timeout))


def _post(link: _Link, op: str, t: torch.Tensor):
    """Post one send or recv of `t`'s bytes to the peer; returns the Work."""
    data = t.reshape(-1).view(torch.uint8)
    peer = 1 - link.rank
    return link.group.send([data], peer, 0) if op == "send" else link.group.recv([data], peer, 0)


def _wait(link: _Link, work) -> None:
    """Wait for one posted operation. NCCL's blocking `wait` polls in sleeps of milliseconds, which capped a
    transfer of 64 MiB segments at ~90 GB/s on a 390 GB/s link: poll finely here, then let `wait` return at
    once, or raise for an error or (past the deadline) a timeout. (Gloo's work completes only in `wait`.)"""
    if link.backend == "nccl":
        deadline = time.monotonic() + link.timeout
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(20e-6)
    work.wait()


@dataclass
class _Op:
    """One send or receive of a transfer. `make` gives the tensor (a view of the pool, scratch memory, or a
    gather into scratch memory); `then(tensor)` runs once the operation has completed (a scatter)."""

    kind: str
    make: Callable[[], torch.Tensor]
    scratch: bool = False
    then: Callable[[torch.Tensor], object] | None = None


class _Posted:
    """One side's posted operations of a transfer, in order. Views of a pool and small tensors stay posted
    until the end (the link stream runs them back to back, with no host round trip between); at most
    IN_FLIGHT that hold a scratch buffer are outstanding, the oldest waited for (and its `then`, a scatter,
    queued) before another is posted."""

    def __init__(self, link: _Link):
        self.link = link
        self.ops: deque = deque()  # (work, tensor kept alive, holds scratch, then)
        self.scratch = 0

    def can_post_without_waiting(self, op: _Op) -> bool:
        return not op.scratch or self.scratch + 1 < IN_FLIGHT

    def post(self, op: _Op) -> None:
        tensor = op.make()
        self.add(_post(self.link, op.kind, tensor), tensor, op.scratch,
                 None if op.then is None else lambda: op.then(tensor))

    def add(self, work, tensor: torch.Tensor, scratch: bool = False, then: Callable[[], object] | None = None):
        self.ops.append((work, tensor, scratch, then))
        self.scratch += scratch
        while self.scratch >= IN_FLIGHT:
            self._finish_oldest()

    def drain(self) -> None:
        while self.ops:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        work, tensor, scratch, then = self.ops.popleft()
        _wait(self.link, work)
        self.scratch -= scratch
        if then is not None:
            if tensor.is_cuda:  # made on the caller's stream, maybe: keep it from reuse there until `then` has read it
                tensor.record_stream(torch.cuda.current_stream(tensor.device))
            then()


class _Transfer:
    """One side of one transfer: its operations in posting order and the check once they have completed.

    The receiving worker's thread posts what it can at once (`post_now`: operations that need no wait for an
    earlier one), so bytes start to move as soon as its `kv_handoff` record is read, without waking the
    link thread; the link thread posts the rest, waits for completion and checks. The sender posts on its
    link thread: its record goes out only when `send` returns, and posting there delayed the record."""

    def __init__(self, link: _Link, ops: list[_Op], check: Callable[[], None] | None,
                 ready: torch.cuda.Event | None):
        self.ops = deque(ops)
        self.posted = _Posted(link)
        self.check = check
        self.ready = ready  # the compute stream's work before the handoff, for the link stream to wait on

    def post_now(self) -> bool:
        """On the caller's thread (its current stream orders the operations after the compute stream's
        work): post the leading operations that need no wait; True when none is left."""
        while self.ops and self.posted.can_post_without_waiting(self.ops[0]):
            self.posted.post(self.ops.popleft())
        return not self.ops

    def post_rest(self) -> None:
        """On the link thread."""
        if self.ready is not None and self.ops:
            torch.cuda.current_stream().wait_event(self.ready)
        while self.ops:
            self.posted.post(self.ops.popleft())

    def finish(self) -> None:
        self.posted.drain()
        if self.check is not None:
            self.check()


def _trailer(seq: int, request_id: str, total_bytes: int, segments: int, device) -> torch.Tensor:
    return torch.tensor([seq, zlib.crc32(request_id.encode()), total_bytes, segments], dtype=torch.int64, device=device)
