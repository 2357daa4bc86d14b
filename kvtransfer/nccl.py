"""NCCL: across GPUs and nodes, a two-rank process group per prefill-decode pair (gloo on CPU).

The decode worker runs a TCPStore and names it in its descriptor (host, port). On its first handoff to
a decode worker, a prefill worker opens a *link* to it: a process group of two ranks (0 = prefill,
1 = decode) under a fresh link name in that store; the decode worker joins when the first handoff
naming the link arrives. Each link has one thread per side that runs the link's transfers in order:
NCCL and gloo match point-to-point operations between two ranks in the order they are posted, and
both sides post them in `kv_handoff` record order (the data channel keeps that order).

A transfer is a small header (sequence number, request id checksum, bytes, segment count) followed by
the blocks in destination order, cut into segments of at most CHUNK_BYTES (`plan_segments`). A side
whose ids are consecutive within a segment sends (or receives) straight from (into) its pool;
otherwise the sender gathers the segment into a buffer and the receiver receives into one and
scatters it into the reserved blocks. Segments that are views of a pool are all posted at once (the
link stream runs them back to back); at most two that hold a scratch buffer are in flight on each side,
so a gather or scatter overlaps the next message and scratch memory stays at two segments. The sender
posts the header and the blocks together; the receiver checks the header before it posts any receive
into its pool (posting them with the header measured no faster: within the run-to-run spread).

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
from datetime import timedelta

import torch
import torch.distributed as dist

from kvtransfer.cuda_ipc import gpu_uuid
from kvtransfer.transport import (
    BlockIds, Sent, TransferError, Transport, check_block_ids, check_layout, layout_record, pack, plan_segments,
    unpack,
)

log = logging.getLogger(__name__)

VERSION = 1
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


def pair_problem(prefill: dict | None, decode: dict | None) -> str | None:
    """Why these workers cannot pair over this transport (None: they can); arguments are their
    unpacked nccl descriptors."""
    if not prefill or not decode:
        return "a worker published no nccl descriptor"
    if prefill.get("backend") != decode.get("backend"):
        return f"the prefill worker runs {prefill.get('backend')}, the decode worker {decode.get('backend')}"
    if decode.get("backend") == "nccl" and decode.get("gpu") and decode.get("gpu") == prefill.get("gpu"):
        return "both workers are on one GPU, and NCCL cannot connect two ranks on one device: use cuda_ipc"
    return None


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
        self.thread = threading.Thread(target=self._run, args=(connect,), name=f"kv-link-{name}", daemon=True)
        self.thread.start()

    def submit(self, job: Callable[[_Link], None]) -> Future:
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
                    job(self)
                else:
                    with torch.cuda.stream(self.stream):
                        job(self)
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
        ready = self._mark()
        done = link.submit(lambda l: self._send_blocks(l, ready, seq, request_id, src_block_ids, segments))
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
            problem = pair_problem({"backend": self.backend, "gpu": self.gpu}, peer)
            if problem:
                raise TransferError(f"nccl to {peer_id}: {problem}")
            self._peers[descriptor] = peer
        return peer

    def _send_blocks(self, link: _Link, ready, seq: int, request_id: str, src: list[int],
                     segments: list[tuple[int, int]]) -> None:
        kv = self.pool.kv
        if ready is not None:
            torch.cuda.current_stream().wait_event(ready)
        total = sum(n for _, n in segments) * self.pool.layout.block_bytes
        header = _header(seq, request_id, total, len(segments), kv.device)
        posted = _Posted(link)
        posted.add(_post(link, "send", header), header)
        blocks = BlockIds(kv, src)
        for off, n in segments:
            view = blocks.run(off, n)
            data = view if view is not None else blocks.gather(off, n)
            posted.add(_post(link, "send", data), data, scratch=view is None)
        posted.drain()

    # ---- decode side --------------------------------------------------------------------------------
    def receive(self, request_id, peer_id, dst_block_ids, frames):
        meta, link = self._incoming(request_id, peer_id, frames)
        problem = None
        if meta["block_bytes"] != self.pool.layout.block_bytes:
            problem = (f"blocks of {meta['block_bytes']} bytes sent, {self.pool.layout.block_bytes} here "
                       "(KV layout mismatch)")
        elif sum(meta["segments"]) != len(dst_block_ids):
            problem = f"{sum(meta['segments'])} blocks sent for {len(dst_block_ids)} reserved"
        elif any(not 0 <= i < self.pool.num_blocks for i in dst_block_ids):
            problem = "reserved block ids out of range"
        if problem:
            self._consume(link, meta)
            raise TransferError(problem)
        ready = self._mark()
        return link.submit(lambda l: self._recv_blocks(l, ready, meta, dst_block_ids))

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
        return link.submit(lambda l: self._recv_blocks(l, None, meta, None))

    def _recv_blocks(self, link: _Link, ready, meta: dict, dst: list[int] | None) -> None:
        kv = self.pool.kv
        if ready is not None:
            torch.cuda.current_stream().wait_event(ready)
        block_bytes, counts = meta["block_bytes"], meta["segments"]
        header = torch.empty(4, dtype=torch.int64, device=kv.device)
        _wait(link, _post(link, "recv", header))
        expected = _header(meta["seq"], meta["request_id"], sum(counts) * block_bytes, len(counts), "cpu")
        if not torch.equal(header.cpu(), expected):
            raise TransferError(f"KV link {link.name} out of step: header {header.tolist()}, "
                                f"expected {expected.tolist()}")
        blocks = None if dst is None else BlockIds(kv, dst)
        sink = None
        posted = _Posted(link)
        off = 0
        for n in counts:
            if blocks is None:  # refused: land it anywhere (one buffer: nothing reads it)
                if sink is None:
                    sink = torch.empty(max(counts) * block_bytes, dtype=torch.uint8, device=kv.device)
                posted.add(_post(link, "recv", sink[:n * block_bytes]), sink)
            elif (view := blocks.run(off, n)) is not None:
                posted.add(_post(link, "recv", view), view)
            else:
                data = torch.empty((n, *kv.shape[1:]), dtype=kv.dtype, device=kv.device)
                index = blocks.index(off, n)
                posted.add(_post(link, "recv", data), data, scratch=True,
                           then=lambda index=index, data=data: kv.index_copy_(0, index, data))
            off += n
        posted.drain()

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


class _Posted:
    """One side's posted operations of a transfer, in order. Views of a pool and small tensors stay posted
    until the end (the link stream runs them back to back, with no host round trip between); at most
    IN_FLIGHT that hold a scratch buffer are outstanding, the oldest waited for (and its `then`, a scatter,
    queued) before another is posted."""

    def __init__(self, link: _Link):
        self.link = link
        self.ops: deque = deque()  # (work, tensor kept alive, holds scratch, then)
        self.scratch = 0

    def add(self, work, tensor: torch.Tensor, scratch: bool = False, then: Callable[[], object] | None = None):
        self.ops.append((work, tensor, scratch, then))
        self.scratch += scratch
        while self.scratch >= IN_FLIGHT:
            self._finish_oldest()

    def drain(self) -> None:
        while self.ops:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        work, _, scratch, then = self.ops.popleft()
        _wait(self.link, work)
        self.scratch -= scratch
        if then is not None:
            then()


def _header(seq: int, request_id: str, total_bytes: int, segments: int, device) -> torch.Tensor:
    return torch.tensor([seq, zlib.crc32(request_id.encode()), total_bytes, segments], dtype=torch.int64, device=device)
