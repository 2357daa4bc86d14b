"""The nccl transport: links opened ahead (`open`, `join`) or on first use, each handoff's segments and trailer over
its peer's link."""
from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta

import torch
import torch.distributed as dist

from common.protocol import KVDescriptors, KVHandoff, NcclDescriptor, NcclStream
from kvtransfer.choice import nccl_pair_problem
from kvtransfer.cuda_ipc import gpu_uuid
from kvtransfer.errors import TransferError
from kvtransfer.nccl.link import Link, Op, Transfer, connect, trailer
from kvtransfer.segments import BlockIds, check_block_ids, plan_segments
from kvtransfer.transport import Sent, Transport

log = logging.getLogger(__name__)


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
        self.sending: dict[str, Link] = {}  # peer id -> link (prefill side)
        self.receiving: dict[str, Link] = {}  # link name -> link (decode side)
        self.retired: list[Link] = []  # replaced links, whose threads may still be finishing
        self._peers: dict[str, NcclDescriptor] = {}  # peer id -> the descriptor checked on first contact

    def descriptor(self) -> NcclDescriptor:
        if self.store is None:
            self.store = dist.TCPStore(self.host, 0, None, True, timedelta(seconds=self.timeout),
                                       wait_for_workers=False)
        return NcclDescriptor(backend=self.backend, host=self.host, port=self.store.port, gpu=self.gpu,
                              layout=self.pool.layout, num_blocks=self.pool.num_blocks)

    # ---- prefill side -------------------------------------------------------------------------------
    def send(self, request_id, peer_id, peer, src_block_ids, dst_block_ids):
        d = self._peer(peer_id, peer.nccl)
        check_block_ids(src_block_ids, self.pool.num_blocks, "source")
        check_block_ids(dst_block_ids, d.num_blocks, f"{peer_id}'s")
        if len(src_block_ids) != len(dst_block_ids):
            raise TransferError(f"{len(src_block_ids)} source blocks for {len(dst_block_ids)} destination blocks")
        link = self._link_to(peer_id, d)
        seq, link.next_seq = link.next_seq, link.next_seq + 1
        block_bytes = self.pool.layout.block_bytes
        segments = plan_segments(src_block_ids, dst_block_ids, block_bytes, self.strategy)
        # No wait on the compute stream: the caller saw the step that wrote these blocks finish, and overlap has
        # queued the next prefill there since (the send would start only after it).
        done = link.run(Transfer(link, self._send_ops(seq, request_id, src_block_ids, segments), None))
        stream = NcclStream(link=link.name, seq=seq, block_bytes=block_bytes, segments=[n for _, n in segments])
        return Sent(nccl=stream, done=done)

    def open(self, peer_id: str, peer: KVDescriptors) -> tuple[str, Future]:
        """The link, and one word sent over it: NCCL sets a communicator up on a link's first operation, which the
        pair's first handoff would otherwise wait for (docs/benchmarks.md, stop 30)."""
        link = self._link_to(peer_id, self._peer(peer_id, peer.nccl))
        word = Op("send", lambda: torch.zeros(1, dtype=torch.int64, device=self.device))
        return link.name, link.run(Transfer(link, [word], None))

    def _link_to(self, peer_id: str, d: NcclDescriptor) -> Link:
        """The link to the peer: the open one, or a new one (none yet, broken, or the peer moved)."""
        link = self.sending.get(peer_id)
        address = (d.host, d.port)
        if link is None or link.error is not None or link.address != address:
            if link is not None:
                self._retire(link)
            link = self.sending[peer_id] = Link(
                secrets.token_hex(8), 0, peer_id, lambda: connect(*address, self.timeout), self.backend,
                self.device, self.timeout, address)
        return link

    def _peer(self, peer_id: str, d: NcclDescriptor | None) -> NcclDescriptor:
        """The peer's descriptor, checked the first time this worker meets it (or when it changes)."""
        if self._peers.get(peer_id) == d and d is not None:
            return d
        if d is None:
            raise TransferError(f"{peer_id} published no nccl descriptor")
        self.check_peer_layout(d.layout, peer_id)
        problem = nccl_pair_problem(self.backend, self.gpu, d)
        if problem:
            raise TransferError(f"nccl to {peer_id}: {problem}")
        self._peers[peer_id] = d
        return d

    def _send_ops(self, seq: int, request_id: str, src: list[int], segments: list[tuple[int, int]]) -> list[Op]:
        """The blocks in destination order (views of the pool, or gathered), then the trailer."""
        kv = self.pool.kv
        blocks = BlockIds(kv, src)
        ops = []
        for off, n in segments:
            view = blocks.run(off, n)
            if view is not None:
                ops.append(Op("send", lambda view=view: view))
            else:
                ops.append(Op("send", lambda off=off, n=n: blocks.gather(off, n), scratch=True))
        total = sum(n for _, n in segments) * self.pool.layout.block_bytes
        ops.append(Op("send", lambda: torch.tensor(trailer(seq, request_id, total, len(segments)), dtype=torch.int64,
                                                   device=kv.device)))
        return ops

    # ---- decode side --------------------------------------------------------------------------------
    def receive(self, record, dst_block_ids, frames):
        stream, link = self._incoming(record, frames)
        problem = None
        if stream.block_bytes != self.pool.layout.block_bytes:
            problem = (f"blocks of {stream.block_bytes} bytes sent, {self.pool.layout.block_bytes} here "
                       "(KV layout mismatch)")
        elif sum(stream.segments) != len(dst_block_ids):
            problem = f"{sum(stream.segments)} blocks sent for {len(dst_block_ids)} reserved"
        elif dst_block_ids and not (0 <= min(dst_block_ids) and max(dst_block_ids) < self.pool.num_blocks):
            problem = "reserved block ids out of range"
        if problem:
            self._consume(link, record.request_id, stream)
            raise TransferError(problem)
        ops, check = self._recv_ops(record.request_id, stream, dst_block_ids)
        return link.run(Transfer(link, ops, check), post_here=True)

    def discard(self, record, frames):
        stream, link = self._incoming(record, frames)
        return self._consume(link, record.request_id, stream)

    def join(self, peer_id: str, link: str) -> Future:
        word = Op("recv", lambda: torch.empty(1, dtype=torch.int64, device=self.device))
        joined = self._link_from(peer_id, link)
        return joined.run(Transfer(joined, [word], None), post_here=True)

    def _link_from(self, peer_id: str, name: str) -> Link:
        """The link `name` from the peer, joined now if it is new."""
        if self.store is None:
            raise TransferError("this worker published no nccl descriptor, so no peer can reach it")
        link = self.receiving.get(name)
        if link is None:  # a new link from this peer: its older links are dead on the other side
            for old in [n for n, old in self.receiving.items() if old.peer_id == peer_id]:
                self._retire(self.receiving.pop(old))
            port = self.store.port
            link = self.receiving[name] = Link(name, 1, peer_id, lambda: connect(self.host, port, self.timeout),
                                               self.backend, self.device, self.timeout)
        return link

    def _incoming(self, record: KVHandoff, frames: list) -> tuple[NcclStream, Link]:
        if record.nccl is None:
            raise TransferError("an nccl handoff names the stream its bytes follow on; this one names none")
        if frames:
            raise TransferError(f"an nccl handoff carries no payload frames, got {len(frames)}")
        stream, peer_id = record.nccl, record.src_worker_id
        link = self._link_from(peer_id, stream.link)
        if stream.seq != link.next_seq and link.error is None:
            link.error = TransferError(f"handoffs from {peer_id} out of order: got {stream.seq}, "
                                       f"expected {link.next_seq}")
        link.next_seq = stream.seq + 1
        return stream, link

    def _consume(self, link: Link, request_id: str, stream: NcclStream) -> Future:
        """Receive a refused handoff's bytes into scratch memory, so the link stays aligned."""
        return link.run(Transfer(link, *self._recv_ops(request_id, stream, None)))

    def _recv_ops(self, request_id: str, stream: NcclStream,
                  dst: list[int] | None) -> tuple[list[Op], Callable[[], None]]:
        """The blocks in destination order (straight into the pool where a segment's ids are a run, else into
        a buffer scattered from), the trailer, and the check of the trailer once everything has arrived.
        Buffers are made as their operation is posted, on the link's stream."""
        kv = self.pool.kv
        block_bytes, counts = stream.block_bytes, stream.segments
        blocks = None if dst is None else BlockIds(kv, dst)
        made: dict[str, torch.Tensor] = {}

        def buffer(name: str, nbytes: int) -> torch.Tensor:
            if name not in made:
                made[name] = torch.empty(nbytes, dtype=torch.uint8, device=kv.device)
            return made[name]
        ops: list[Op] = []
        off = 0
        for n in counts:
            if blocks is None:  # refused: land it anywhere (one buffer: nothing reads it)
                ops.append(Op("recv", lambda n=n: buffer("sink", max(counts) * block_bytes)[:n * block_bytes]))
            elif (view := blocks.run(off, n)) is not None:
                ops.append(Op("recv", lambda view=view: view))
            else:
                ops.append(Op("recv", lambda n=n: torch.empty((n, *kv.shape[1:]), dtype=kv.dtype, device=kv.device),
                              scratch=True,
                              then=lambda data, off=off, n=n: kv.index_copy_(0, blocks.index(off, n), data)))
            off += n
        ops.append(Op("recv", lambda: buffer("trailer", 32).view(torch.int64)))

        def check() -> None:
            expected = trailer(stream.seq, request_id, sum(counts) * block_bytes, len(counts))
            received = made["trailer"].view(torch.int64).tolist()
            if received != expected:
                raise TransferError(f"KV link out of step: trailer {received}, expected {expected}")
        return ops, check

    # ---- both ---------------------------------------------------------------------------------------
    def _retire(self, link: Link) -> None:
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


