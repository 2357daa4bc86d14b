"""One side of an nccl link: a two-rank process group with one peer, the thread that runs the link's transfers in
order, and how a transfer's operations are posted (the package docstring says why this shape)."""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
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

from kvtransfer.errors import TransferError

log = logging.getLogger(__name__)

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


class Link:
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

    def run(self, transfer: Transfer, post_here: bool = False) -> Future:
        """Queue a transfer behind the link's earlier ones; a future that resolves when it has completed.
        With `post_here`, what can be posted at once is posted on the caller's thread, when nothing earlier
        is left to post (operations must be posted in the same order on both sides)."""
        with self.lock:
            rest = True
            if post_here and self.group is not None and self.error is None and self.unposted == 0:
                try:
                    with self.on_stream():
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

    def on_stream(self) -> contextlib.AbstractContextManager:
        """Where a transfer's operations are posted and its buffers allocated: the link's own stream (CUDA), so
        they wait for nothing the worker queued on its compute stream, and take no memory that stream may still be
        using. The blocks written are safe without that order: a reservation never takes a block a launched step
        may still write (`BlockManager.fenced`)."""
        return contextlib.nullcontext() if self.stream is None else torch.cuda.stream(self.stream)

    def submit(self, job: Callable[[], None]) -> Future:
        future: Future = Future()
        self.jobs.put((job, future))
        return future

    def close(self) -> None:
        """Stop after the jobs already queued."""
        self.jobs.put(None)

    def _run(self, connect: Callable[[], dist.Store]) -> None:
        fine_timer_slack()
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
                with self.on_stream():
                    job()
                if self.stream is not None:
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


def fine_timer_slack() -> None:
    """Let this thread's short sleeps (polling NCCL completion) end on time: Linux rounds a sleep up by the
    thread's timer slack, 50 us by default, which made each 20 us poll ~70 us. Elsewhere: as it is."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)  # nanoseconds
    except (OSError, AttributeError):
        pass


def connect(host: str, port: int, timeout: float) -> dist.TCPStore:
    return dist.TCPStore(host, port, None, False, timedelta(seconds=timeout))


def post(link: Link, op: str, t: torch.Tensor):
    """Post one send or recv of `t`'s bytes to the peer; returns the Work."""
    data = t.reshape(-1).view(torch.uint8)
    peer = 1 - link.rank
    return link.group.send([data], peer, 0) if op == "send" else link.group.recv([data], peer, 0)


def wait(link: Link, work) -> None:
    """Wait for one posted operation. NCCL's blocking `wait` polls in sleeps of milliseconds, which capped a
    transfer of 64 MiB segments at ~90 GB/s on a 390 GB/s link: poll finely here, then let `wait` return at
    once, or raise for an error or (past the deadline) a timeout. (Gloo's work completes only in `wait`.)"""
    if link.backend == "nccl":
        deadline = time.monotonic() + link.timeout
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(20e-6)
    work.wait()


@dataclass
class Op:
    """One send or receive of a transfer. `make` gives the tensor (a view of the pool, scratch memory, or a
    gather into scratch memory); `then(tensor)` runs once the operation has completed (a scatter)."""

    kind: str
    make: Callable[[], torch.Tensor]
    scratch: bool = False
    then: Callable[[torch.Tensor], object] | None = None


class Posted:
    """One side's posted operations of a transfer, in order. Views of a pool and small tensors stay posted
    until the end (the link stream runs them back to back, with no host round trip between); at most
    IN_FLIGHT that hold a scratch buffer are outstanding, the oldest waited for (and its `then`, a scatter,
    queued) before another is posted.

    NCCL completes one link's operations in the order they were posted, so there an operation without a `then`
    is not waited for when a later wait covers it; its tensor is kept until that wait. Each wait on a link thread
    hands the GIL to the worker's main thread, and gets it back only once that thread blocks or its switch
    interval ends (docs/benchmarks.md, stop 25)."""

    def __init__(self, link: Link):
        self.link = link
        self.ops: deque = deque()  # (work, tensor kept alive, holds scratch, then)
        self.scratch = 0
        self.covered: list[torch.Tensor] = []  # tensors of operations the next wait covers

    def can_post_without_waiting(self, op: Op) -> bool:
        return not op.scratch or self.scratch + 1 < IN_FLIGHT

    def post(self, op: Op) -> None:
        tensor = op.make()
        self.add(post(self.link, op.kind, tensor), tensor, op.scratch,
                 None if op.then is None else lambda: op.then(tensor))

    def add(self, work, tensor: torch.Tensor, scratch: bool = False, then: Callable[[], object] | None = None):
        self.ops.append((work, tensor, scratch, then))
        self.scratch += scratch
        while self.scratch >= IN_FLIGHT:  # the loop waits for a scratch operation, which covers the views before it
            self._retire_oldest(covered=not self.ops[0][2])

    def drain(self) -> None:
        while self.ops:
            self._retire_oldest(covered=len(self.ops) > 1)

    def _retire_oldest(self, covered: bool) -> None:
        work, tensor, scratch, then = self.ops.popleft()
        self.scratch -= scratch
        if covered and then is None and self.link.backend == "nccl":  # completes in order
            self.covered.append(tensor)
            return
        wait(self.link, work)
        self.covered.clear()
        if then is not None:
            if tensor.is_cuda:  # made on the caller's stream, maybe: keep it from reuse there until `then` has read it
                tensor.record_stream(torch.cuda.current_stream(tensor.device))
            then()


class Transfer:
    """One side of one transfer: its operations in posting order and the check once they have completed.

    The receiving worker's thread posts what it can at once (`post_now`: operations that need no wait for an
    earlier one), so bytes start to move as soon as its `kv_handoff` record is read, without waking the
    link thread; the link thread posts the rest, waits for completion and checks. The sender posts on its
    link thread: its record goes out only when `send` returns, and posting there delayed the record. Both
    post on the link's stream (`Link.on_stream`)."""

    def __init__(self, link: Link, ops: list[Op], check: Callable[[], None] | None):
        self.ops = deque(ops)
        self.posted = Posted(link)
        self.check = check

    def post_now(self) -> bool:
        """On the caller's thread: post the leading operations that need no wait; True when none is left."""
        while self.ops and self.posted.can_post_without_waiting(self.ops[0]):
            self.posted.post(self.ops.popleft())
        return not self.ops

    def post_rest(self) -> None:
        """On the link thread."""
        while self.ops:
            self.posted.post(self.ops.popleft())

    def finish(self) -> None:
        self.posted.drain()
        if self.check is not None:
            self.check()


def trailer(seq: int, request_id: str, total_bytes: int, segments: int) -> list[int]:
    """What closes a transfer: checked by the receiver as a list, so the check makes no torch call."""
    return [seq, zlib.crc32(request_id.encode()), total_bytes, segments]
