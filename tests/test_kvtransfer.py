"""KV transports on CPU: run grouping, descriptors (typed records, plain msgpack, no pickle), layout checks, transport
choice, and the nccl transport end to end on gloo (both ranks in this process, one link thread each)."""
from __future__ import annotations

import random
import sys
import threading
from concurrent.futures import Future
from types import SimpleNamespace

import msgpack
import msgspec
import pytest
import torch

from common import protocol as P
from common.engine.kv_pool import KVPool
from common.protocol import CudaIpcDescriptor, CudaIpcPool, KVDescriptors, KVLayout, NcclDescriptor, WorkerHello
from kvtransfer import segments as T
from kvtransfer.choice import available_transports, choose_transport
from kvtransfer.cuda_ipc import CudaIPCTransport
from kvtransfer.errors import TransferError
from kvtransfer.host import HostTransport
from kvtransfer.nccl import link as L
from kvtransfer.nccl.transport import NcclTransport
from kvtransfer.transport import Sent as T_Sent

LAYOUT = KVLayout(num_layers=3, block_size=4, num_kv_heads=2, head_dim=8, dtype="float32")
SENTINEL = -7.0


def filled_pool(num_blocks: int, seed: int) -> KVPool:
    pool = KVPool(LAYOUT, num_blocks, "cpu")
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(seed)))
    return pool


def blank_pool(num_blocks: int) -> KVPool:
    pool = KVPool(LAYOUT, num_blocks, "cpu")
    pool.kv.fill_(SENTINEL)
    return pool


def assert_landed(src: KVPool, dst: KVPool, src_ids: list[int], dst_ids: list[int]) -> None:
    """Every reserved block holds exactly its source block; every other block is untouched."""
    assert torch.equal(dst.kv[dst_ids], src.kv[src_ids])
    others = [i for i in range(dst.num_blocks) if i not in set(dst_ids)]
    assert bool((dst.kv[others] == SENTINEL).all())


def primitive(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and primitive(v) for k, v in value.items())
    if isinstance(value, list):
        return all(primitive(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, bytes))


def no_ext(code, data):
    raise AssertionError(f"msgpack extension type {code} in a descriptor")


# ---- run grouping --------------------------------------------------------------------------------------

def is_run(ids: list[int]) -> bool:
    return all(b == a + 1 for a, b in zip(ids, ids[1:]))


def test_joint_runs_split_where_either_side_jumps():
    src = [0, 1, 2, 3, 10, 11, 12]
    dst = [5, 6, 20, 21, 22, 23, 24]
    assert T.joint_runs(src, dst) == [(0, 2), (2, 2), (4, 3)]
    assert T.joint_runs([], []) == [] and T.joint_runs([4], [9]) == [(0, 1)]
    assert T.joint_runs([4, 3, 2], [0, 1, 2]) == [(0, 1), (1, 1), (2, 1)]  # descending is not a run
    assert T.joint_runs([5, 6, 7], [0, 1, 2]) == [(0, 3)]
    assert T.joint_runs([0, 2, 1, 3], [0, 1, 2, 3]) == [(0, 1), (1, 1), (2, 1), (3, 1)]  # span of a run, not one
    assert T.joint_runs([0, 1, 2], [5, 7, 8]) == [(0, 1), (1, 2)]
    assert T.joint_runs([0, 1, 2, 3], [5, 6, 9, 8], limit=3) == [(0, 2), (2, 1), (3, 1)]
    assert T.joint_runs([0, 1, 2, 3], [5, 6, 9, 8], limit=2) is None  # more runs than the limit
    assert T.joint_runs([0, 1, 2, 3], [5, 6, 7, 8], limit=1) == [(0, 4)]
    with pytest.raises(TransferError, match="3 source blocks for 2"):
        T.joint_runs([1, 2, 3], [1, 2])


@pytest.mark.parametrize("strategy", ["auto", "runs", "gather"])
def test_plan_segments_cover_the_transfer_in_order(strategy, monkeypatch):
    """Chunks (gather) hold at most CHUNK_BYTES; runs, whatever their length, are consecutive on both sides."""
    monkeypatch.setattr(T, "CHUNK_BYTES", 5 * LAYOUT.block_bytes)
    rng = random.Random(0)
    for n in (1, 2, 7, 40):
        src, dst = rng.sample(range(100), n), rng.sample(range(100), n)
        for a, b in ((src, dst), (list(range(n)), list(range(50, 50 + n)))):
            segments = T.plan_segments(a, b, LAYOUT.block_bytes, strategy)
            assert [off for off, _ in segments] == [sum(k for _, k in segments[:i]) for i in range(len(segments))]
            assert sum(k for _, k in segments) == n
            if strategy == "runs" or (strategy == "auto" and len(T.joint_runs(a, b)) <= 16):
                assert segments == T.joint_runs(a, b)
                assert all(is_run(a[o:o + k]) and is_run(b[o:o + k]) for o, k in segments)
            else:
                assert all(1 <= k <= 5 for _, k in segments)


def test_plan_segments_auto_gathers_when_runs_are_many():
    shuffled = random.Random(1).sample(range(200), 100)
    assert len(T.plan_segments(shuffled, list(range(100)), LAYOUT.block_bytes, "auto")) == 1  # one chunk
    assert len(T.plan_segments(shuffled, list(range(100)), LAYOUT.block_bytes, "runs")) > 16
    assert T.plan_segments(list(range(100)), list(range(100, 200)), LAYOUT.block_bytes, "auto") == [(0, 100)]
    with pytest.raises(ValueError, match="strategy"):
        T.plan_segments([1], [1], LAYOUT.block_bytes, "fastest")


def test_block_ids_give_views_for_runs_only():
    kv = torch.arange(10.0).reshape(10, 1)
    blocks = T.BlockIds(kv, [3, 4, 5, 9, 1, 2])
    assert blocks.run(0, 3).data_ptr() == kv[3].data_ptr() and blocks.run(0, 3).shape[0] == 3
    assert blocks.run(4, 2) is not None and blocks.run(2, 2) is None and blocks.run(3, 1) is not None
    assert blocks.gather(2, 3).flatten().tolist() == [5.0, 9.0, 1.0]
    assert blocks.index(3, 2).tolist() == [9, 1]


def test_a_block_bigger_than_a_chunk_is_a_segment_of_its_own(monkeypatch):
    monkeypatch.setattr(T, "CHUNK_BYTES", 10)
    assert T.plan_segments([0, 1, 2], [3, 4, 5], LAYOUT.block_bytes, "gather") == [(0, 1), (1, 1), (2, 1)]


# ---- descriptors: typed records of the wire schema, checked once a pair connects ---------------------

SHARE = CudaIpcPool(shape=[10, 3, 2, 4, 2, 8], stride=[384, 128, 64, 16, 8, 1], offset=0, dtype="bfloat16", device=0,
                    handle=b"\x02" + bytes(range(64)), storage_bytes=7680, storage_offset_bytes=0,
                    ref_counter_handle=b"/torch_123_456_0", ref_counter_offset=0, event_handle=bytes(64),
                    event_sync_required=True)


def hello(name: str, node: str, transports: list[str], **descriptors) -> WorkerHello:
    return WorkerHello(worker_id=name, role="decode", model_fingerprint="m", num_blocks=10, layout=LAYOUT,
                       max_model_len=64, vocab_size=100, transports=transports, node_id=node,
                       kv=KVDescriptors(**descriptors))


def through_the_wire(msg: P.Message) -> P.Message:
    """`msg` as its receiver decodes it; what travels is plain msgpack (no extension types, no pickle)."""
    frame = P.encode(msg)
    assert primitive(msgpack.unpackb(frame, raw=False, ext_hook=no_ext))
    return P.decode(frame)


def test_nccl_descriptor_is_a_typed_record():
    transport = NcclTransport(blank_pool(4), "127.0.0.1")
    try:
        d = transport.descriptor()
        assert isinstance(d, NcclDescriptor)
        assert d.backend == "gloo" and d.host == "127.0.0.1" and d.port > 0 and d.gpu == ""
        assert d.layout == LAYOUT and d.num_blocks == 4
        assert transport.descriptor() == d  # one store, one descriptor
        sent = hello("d0", "n1", ["host", "nccl"], nccl=d)
        assert through_the_wire(sent) == sent
    finally:
        transport.close()


def test_cuda_ipc_descriptor_is_bytes_and_ints():
    """What export_tensor produces (a CUDA IPC handle) survives the wire unchanged; the GPU tests map it."""
    d = CudaIpcDescriptor(pid=1, gpu="GPU-x", visible=["GPU-x"], layout=LAYOUT, num_blocks=10, pool=SHARE)
    sent = hello("d0", "n1", ["cuda_ipc"], cuda_ipc=d)
    assert through_the_wire(sent).kv.cuda_ipc == d
    with pytest.raises(TypeError):
        msgspec.msgpack.encode({"dtype": torch.float32})  # no pickle fallback


def test_a_malformed_descriptor_is_refused_at_the_boundary():
    body = msgspec.to_builtins(hello("d0", "n1", ["nccl"], nccl=NcclDescriptor(
        backend="nccl", host="h", port=1, layout=LAYOUT, num_blocks=4)))
    body["kv"]["nccl"]["port"] = 70000
    with pytest.raises(P.ProtocolError, match="kv.nccl.port: expected an integer <= 65535"):
        P.decode(msgpack.packb({"v": 1, **body}))
    body["kv"]["nccl"]["port"] = 1
    body["kv"]["nccl"]["layout"]["dtype"] = "int8"
    with pytest.raises(P.ProtocolError, match="kv.nccl.layout.dtype: must be one of float32, bfloat16, float16"):
        P.decode(msgpack.packb({"v": 1, **body}))


# ---- fail fast ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("block_size", 16), ("dtype", "bfloat16"), ("num_kv_heads", 8),
                                          ("num_layers", 28), ("head_dim", 128)])
def test_layout_mismatch_names_the_field(field, value):
    theirs = msgspec.structs.replace(LAYOUT, **{field: value})
    transport = HostTransport(blank_pool(2))
    with pytest.raises(TransferError, match=f"KV layout mismatch with d0 \\(here vs there\\): {field} "):
        transport.check_peer_layout(theirs, "d0")
    transport.check_peer_layout(LAYOUT, "d0")


def test_nccl_send_refuses_a_peer_with_another_layout_before_connecting():
    other = msgspec.structs.replace(LAYOUT, block_size=8)
    decode = NcclTransport(KVPool(other, 4, "cpu"))
    prefill = NcclTransport(filled_pool(4, 0))
    try:
        with pytest.raises(TransferError, match="block_size 4 vs 8"):
            prefill.send("r1", "d0", KVDescriptors(nccl=decode.descriptor()), [0], [1])
        assert prefill.sending == {}
    finally:
        prefill.close()
        decode.close()


class _Work:
    """A posted operation that completes after `polls` checks (never, if None); `wait` says whether it had."""

    def __init__(self, polls: int | None):
        self.polls, self.checks, self.waited_done = polls, 0, None

    def is_completed(self) -> bool:
        self.checks += 1
        return self.polls is not None and self.checks > self.polls

    def wait(self) -> None:
        self.waited_done = self.polls is not None and self.checks > self.polls
        if not self.waited_done:
            raise TimeoutError("still running")


def _link(backend: str, timeout: float):
    from types import SimpleNamespace

    return SimpleNamespace(backend=backend, timeout=timeout)


def test_nccl_wait_polls_until_done_before_the_blocking_wait():
    """NCCL's blocking wait sleeps ~1 ms between its own checks (capping 64 MiB segments at ~90 GB/s):
    the link polls completion itself and calls wait only once the operation is done."""
    work = _Work(polls=5)
    L.wait(_link("nccl", 10.0), work)
    assert work.checks == 6 and work.waited_done


def test_posted_segments_bound_only_those_holding_scratch_memory(monkeypatch):
    """Views of a pool stay posted (no host round trip between them); a third scratch segment waits for the
    oldest one, and a scatter runs right after its own receive completes."""
    events: list[str] = []

    class Work:
        def __init__(self, name):
            self.name = name

        def wait(self):
            events.append(f"wait {self.name}")

    monkeypatch.setattr(L, "IN_FLIGHT", 2)
    posted = L.Posted(SimpleNamespace(backend="gloo", timeout=1.0))
    t = torch.empty(1)
    for name in ("header", "view0", "view1"):
        posted.add(Work(name), t)
    assert events == []
    posted.add(Work("scratch0"), t, scratch=True, then=lambda: events.append("scatter0"))
    assert events == []
    posted.add(Work("scratch1"), t, scratch=True, then=lambda: events.append("scatter1"))
    assert events == ["wait header", "wait view0", "wait view1", "wait scratch0", "scatter0"]
    posted.add(Work("view2"), t)
    posted.add(Work("scratch2"), t, scratch=True)
    assert events[-2:] == ["wait scratch1", "scatter1"]
    posted.drain()
    assert events[-2:] == ["wait view2", "wait scratch2"] and not posted.ops and posted.scratch == 0


def test_nccl_waits_only_where_no_later_wait_covers_an_operation(monkeypatch):
    """NCCL completes a link's operations in posting order: a transfer waits for a scratch operation before its
    scatter (and to free its buffer) and for the last one, not for the views between, whose tensors stay alive
    until a later wait. Each wait on a link thread gives the GIL to a worker's busy main thread (stop 25)."""
    events: list[str] = []

    class Work:
        def __init__(self, name):
            self.name = name

        def is_completed(self):
            return True

        def wait(self):
            events.append(f"wait {self.name}")

    monkeypatch.setattr(L, "IN_FLIGHT", 2)
    posted = L.Posted(SimpleNamespace(backend="nccl", timeout=1.0))
    views = [torch.empty(1) for _ in range(3)]
    for i, t in enumerate(views):
        posted.add(Work(f"view{i}"), t)
    posted.add(Work("scratch0"), torch.empty(1), scratch=True, then=lambda: events.append("scatter0"))
    posted.add(Work("scratch1"), torch.empty(1), scratch=True, then=lambda: events.append("scatter1"))
    assert events == ["wait scratch0", "scatter0"] and posted.covered == []
    posted.add(Work("view3"), views[0])
    posted.add(Work("gather"), torch.empty(1), scratch=True)  # a sender's gather: no `then`
    assert events[-2:] == ["wait scratch1", "scatter1"]
    posted.add(Work("trailer"), torch.empty(1))
    posted.drain()
    assert events[-1] == "wait trailer" and events.count("wait trailer") == 1
    assert not any(e.startswith(("wait view", "wait gather")) for e in events)
    assert not posted.ops and posted.scratch == 0 and posted.covered == []


def test_the_receiver_posts_what_needs_no_wait_when_nothing_earlier_is_left(monkeypatch):
    """Bytes start to move without waking the link thread, and both sides still post in handoff order: the
    caller posts leading views and one scratch receive; a second scratch segment, anything behind a transfer
    with operations left and a transfer not posted here (a sender's) are the link thread's."""
    import queue

    posts: list[tuple[str, int]] = []

    class Work:
        def wait(self):
            pass

    def post(link, kind, t):
        posts.append((threading.current_thread().name, int(t[0])))
        return Work()

    monkeypatch.setattr(L, "post", post)
    monkeypatch.setattr(L, "IN_FLIGHT", 2)
    link = object.__new__(L.Link)
    link.lock, link.unposted, link.error, link.group, link.stream = threading.Lock(), 0, None, None, None
    link.backend, link.timeout, link.jobs = "gloo", 1.0, queue.SimpleQueue()

    def op(i, **kw):
        return L.Op("send", lambda: torch.tensor([i]), **kw)

    def transfer(*ops):
        return L.Transfer(link, list(ops), None)

    def run_jobs():
        def loop():
            while not link.jobs.empty():
                job, future = link.jobs.get()
                job()
                future.set_result(None)
        thread = threading.Thread(target=loop, name="link")
        thread.start()
        thread.join()

    link.run(transfer(op(0)), post_here=True)  # the link is not open yet: all of it is the link thread's
    assert posts == [] and link.unposted == 1
    run_jobs()
    link.group = object()
    link.run(transfer(op(1), op(2), op(3, scratch=True), op(4, scratch=True), op(5)), post_here=True)
    link.run(transfer(op(6)), post_here=True)  # behind operations still to post
    assert posts[1:] == [("MainThread", 1), ("MainThread", 2), ("MainThread", 3)] and link.unposted == 2
    run_jobs()
    link.run(transfer(op(7)))  # a sender's
    link.run(transfer(op(8), op(9)), post_here=True)
    assert len(posts) == 7 and link.unposted == 2
    run_jobs()
    assert [i for _, i in posts] == list(range(10)) and link.unposted == 0
    assert [name for name, i in posts if i in (0, 4, 5, 6, 7, 8, 9)] == ["link"] * 7


def test_gloo_a_trailer_out_of_step_fails_the_handoff_and_breaks_the_link():
    """A record naming another request than the bytes that arrive: the receive fails once they are in."""
    pair = Pair()
    try:
        sent = pair.send("r1", [1, 2], [4, 5])
        with pytest.raises(TransferError, match="out of step"):
            pair.decode.receive(record("r9", sent, [4, 5]), [4, 5], []).result(timeout=30)
        sent.done.result(timeout=30)
        assert pair.decode.receiving[sent.nccl.link].error is not None
    finally:
        pair.close()


def test_a_scatter_keeps_its_scratch_buffer_from_reuse_until_its_stream_has_read_it(monkeypatch):
    """A receive buffer may be made on the decode worker's thread (its compute stream) and scattered on the link
    stream; freed right after the scatter is queued, the allocator could hand it to the compute stream first."""
    events: list[str] = []

    class Work:
        def wait(self):
            events.append("wait")

    class CudaBuffer:
        is_cuda, device = True, "cuda:0"

        def record_stream(self, stream):
            events.append(f"record {stream}")

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "link-stream")
    posted = L.Posted(SimpleNamespace(backend="gloo", timeout=1.0))
    posted.add(Work(), CudaBuffer(), scratch=True, then=lambda: events.append("scatter"))
    posted.drain()
    assert events == ["wait", "record link-stream", "scatter"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_link_threads_poll_with_a_fine_timer_slack():
    """A 20 us poll must not sleep 70 us: the link thread drops its timer slack to 1 us; others keep theirs."""
    import ctypes

    def slack() -> int:  # PR_GET_TIMERSLACK: this thread's, in ns
        return ctypes.CDLL(None).prctl(30, 0, 0, 0, 0)

    seen: list[int] = []

    def link_thread():
        L.fine_timer_slack()
        seen.append(slack())

    before = slack()
    thread = threading.Thread(target=link_thread)
    thread.start()
    thread.join()
    assert seen == [1000] and slack() == before != 1000


def test_nccl_wait_gives_up_polling_at_the_deadline_and_lets_wait_raise():
    import time

    work = _Work(polls=None)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        L.wait(_link("nccl", 0.05), work)
    assert 0.05 <= time.monotonic() - start < 5 and work.checks > 1


def test_gloo_wait_does_not_poll():
    """Gloo's send/recv work completes only inside wait: polling it would spin until the deadline."""
    work = _Work(polls=None)
    with pytest.raises(TimeoutError):
        L.wait(_link("gloo", 10.0), work)
    assert work.checks == 0


def test_sends_refuse_bad_block_ids():
    decode, prefill = NcclTransport(blank_pool(4)), NcclTransport(filled_pool(4, 0))
    peer = KVDescriptors(nccl=decode.descriptor())
    try:
        with pytest.raises(TransferError, match=r"d0's block ids out of range \[0, 4\): \[4\]"):
            prefill.send("r1", "d0", peer, [0, 1], [3, 4])
        with pytest.raises(TransferError, match="source block ids"):
            prefill.send("r1", "d0", peer, [9], [3])
        with pytest.raises(TransferError, match="2 source blocks for 1"):
            prefill.send("r1", "d0", peer, [0, 1], [3])
        with pytest.raises(TransferError, match="published no nccl descriptor"):
            prefill.send("r1", "d0", KVDescriptors(), [0], [3])
    finally:
        prefill.close()
        decode.close()


def test_cuda_ipc_needs_a_cuda_pool():
    with pytest.raises(TransferError, match="cuda_ipc KV transport needs a CUDA KV pool; this one is on cpu"):
        CudaIPCTransport(blank_pool(2))


def test_cuda_ipc_open_answers_what_fails_as_a_transfer_error():
    """open_link runs cuda_ipc's setup on the prefill worker's loop: a failure there (a kernel that does not compile)
    must come back as the link's answer, not end the worker. (The setup itself: test_kvtransfer_gpu.py.)"""
    transport = object.__new__(CudaIPCTransport)  # no CUDA pool here: only `open`'s own handling is under test

    def fails(peer_id, descriptor):
        raise RuntimeError("PTX assembly failed")
    transport.peer_pool = fails
    with pytest.raises(TransferError, match="cannot set up cuda_ipc to d0: RuntimeError: PTX assembly failed"):
        transport.open("d0", KVDescriptors())

    def refuses(peer_id, descriptor):
        raise TransferError("d0 published no cuda_ipc descriptor")
    transport.peer_pool = refuses
    with pytest.raises(TransferError, match="^d0 published no cuda_ipc descriptor$"):
        transport.open("d0", KVDescriptors())


def test_available_transports():
    assert available_transports("cpu") == ["host"]
    assert available_transports("cpu", "host") == ["host"]
    assert available_transports("cpu", "nccl") == ["host", "nccl"]
    assert available_transports("cuda") == ["cuda_ipc", "nccl", "host"]
    with pytest.raises(TransferError, match="cuda_ipc KV transport needs CUDA workers; these run on cpu"):
        available_transports("cpu", "cuda_ipc")
    with pytest.raises(TransferError, match="unknown KV transport 'rdma'"):
        available_transports("cuda", "rdma")


def peer(name: str, node: str, transports: list[str], **descriptors) -> WorkerHello:
    return hello(name, node, transports, **descriptors)


def ipc(gpu: str, visible: list[str]) -> CudaIpcDescriptor:
    return CudaIpcDescriptor(pid=1, gpu=gpu, visible=visible, layout=LAYOUT, num_blocks=10, pool=SHARE)


def nccl(backend: str, gpu: str = "") -> NcclDescriptor:
    return NcclDescriptor(backend=backend, host="10.0.0.1", port=29500, gpu=gpu, layout=LAYOUT, num_blocks=10)


def test_choose_transport_from_placement():
    both = ["cuda_ipc", "nccl", "host"]
    # one GPU shared by both workers: CUDA IPC (NCCL could not pair them)
    p = peer("p0", "n1", both, cuda_ipc=ipc("G0", ["G0"]), nccl=nccl("nccl", "G0"))
    d = peer("d0", "n1", both, cuda_ipc=ipc("G0", ["G0"]), nccl=nccl("nccl", "G0"))
    assert choose_transport(p, d) == "cuda_ipc"
    with pytest.raises(TransferError, match="kv transport 'nccl' cannot connect p0 -> d0: both workers are on one GPU"):
        choose_transport(p, d, "nccl")
    assert choose_transport(p, d, "host") == "host"
    # one node, each worker sees only its own GPU (Ray's default): NCCL
    p = peer("p0", "n1", both, cuda_ipc=ipc("G0", ["G0"]), nccl=nccl("nccl", "G0"))
    d = peer("d0", "n1", both, cuda_ipc=ipc("G1", ["G1"]), nccl=nccl("nccl", "G1"))
    assert choose_transport(p, d) == "nccl"
    with pytest.raises(TransferError, match="GPU \\(G1\\) is not visible to the prefill worker"):
        choose_transport(p, d, "cuda_ipc")
    # one node, both see every GPU: CUDA IPC
    p = peer("p0", "n1", both, cuda_ipc=ipc("G0", ["G0", "G1"]), nccl=nccl("nccl", "G0"))
    d = peer("d0", "n1", both, cuda_ipc=ipc("G1", ["G0", "G1"]), nccl=nccl("nccl", "G1"))
    assert choose_transport(p, d) == "cuda_ipc"
    # two nodes: NCCL
    d = peer("d0", "n2", both, cuda_ipc=ipc("G9", ["G9"]), nccl=nccl("nccl", "G9"))
    assert choose_transport(p, d) == "nccl"


def test_choose_transport_on_cpu():
    p, d = peer("p0", "n1", ["host"]), peer("d0", "n1", ["host"])
    assert choose_transport(p, d) == "host"
    with pytest.raises(TransferError, match="'cuda_ipc' cannot connect p0 -> d0: not offered by both"):
        choose_transport(p, d, "cuda_ipc")
    # nccl on CPU runs on gloo: used when asked for, never chosen by itself
    p = peer("p0", "n1", ["host", "nccl"], nccl=nccl("gloo"))
    d = peer("d0", "n2", ["host", "nccl"], nccl=nccl("gloo"))
    assert choose_transport(p, d) == "host"
    assert choose_transport(p, d, "nccl") == "nccl"
    d = peer("d0", "n2", ["nccl"], nccl=nccl("nccl", "G1"))
    with pytest.raises(TransferError, match="prefill worker runs gloo, the decode worker nccl"):
        choose_transport(p, d, "nccl")


def test_a_transport_offered_without_its_descriptor_is_never_chosen():
    both = ["cuda_ipc", "nccl", "host"]
    p, d = peer("p0", "n1", both), peer("d0", "n1", both)  # e.g. a worker that could not start them
    assert choose_transport(p, d) == "host"
    with pytest.raises(TransferError, match="'cuda_ipc' cannot connect p0 -> d0: a worker published no cuda_ipc"):
        choose_transport(p, d, "cuda_ipc")
    with pytest.raises(TransferError, match="'nccl' cannot connect p0 -> d0: a worker published no nccl"):
        choose_transport(p, d, "nccl")


# ---- the nccl transport end to end, on gloo -----------------------------------------------------------

def record(request_id: str, sent: T_Sent, dst_ids: list[int]) -> P.KVHandoff:
    """The kv_handoff a prefill worker sends after `sent`, as the decode worker reads it."""
    return P.KVHandoff(request_id=request_id, src_worker_id="p0", first_token=1, num_tokens=len(dst_ids) * 4,
                       transport="nccl", dst_block_ids=dst_ids, reply_to="tcp://127.0.0.1:1", nccl=sent.nccl)


class Pair:
    """A prefill-side and a decode-side nccl transport in this process; a handoff runs both halves."""

    def __init__(self, src_blocks: int = 64, dst_blocks: int = 64, strategy: str = "auto", timeout: float = 20.0):
        self.src, self.dst = filled_pool(src_blocks, 0), blank_pool(dst_blocks)
        self.prefill = NcclTransport(self.src, timeout=timeout, strategy=strategy)
        self.decode = NcclTransport(self.dst, timeout=timeout)
        self.peer = KVDescriptors(nccl=self.decode.descriptor())

    def send(self, request_id: str, src_ids: list[int], dst_ids: list[int]) -> T_Sent:
        return self.prefill.send(request_id, "d0", self.peer, src_ids, dst_ids)

    def handoff(self, request_id: str, src_ids: list[int], dst_ids: list[int]) -> None:
        sent = self.send(request_id, src_ids, dst_ids)
        received = self.decode.receive(record(request_id, sent, dst_ids), dst_ids, sent.payload)
        assert isinstance(received, Future) and isinstance(sent.done, Future)
        received.result(timeout=30)
        sent.done.result(timeout=30)

    def close(self) -> None:
        self.prefill.close()
        self.decode.close()


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 3 blocks, so a transfer has several segments and the two-in-flight window turns over."""
    monkeypatch.setattr(T, "CHUNK_BYTES", 3 * LAYOUT.block_bytes)


@pytest.mark.parametrize("strategy", ["auto", "runs", "gather"])
def test_gloo_blocks_land_exactly_in_the_reserved_ids(strategy, small_chunks):
    rng = random.Random(7)
    pair = Pair(strategy=strategy)
    try:
        cases = [
            (list(range(10, 20)), list(range(30, 40))),  # one run each side: straight from pool to pool
            (rng.sample(range(64), 11), rng.sample(range(64), 11)),  # shuffled both sides: gather + scatter
            (list(range(0, 8)), rng.sample(range(64), 8)),  # consecutive source, scattered destination
            (rng.sample(range(64), 8), list(range(50, 58))),  # gathered source, consecutive destination
            ([5], [63]),
        ]
        for i, (src_ids, dst_ids) in enumerate(cases):
            pair.dst.kv.fill_(SENTINEL)
            pair.handoff(f"req-{i}", src_ids, dst_ids)
            assert_landed(pair.src, pair.dst, src_ids, dst_ids)
        assert len(pair.prefill.sending) == 1 and len(pair.decode.receiving) == 1  # one link, reused
    finally:
        pair.close()


def test_gloo_handoffs_in_a_row_and_a_refused_one_between(small_chunks):
    """Sends are posted before any receive, like a busy prefill worker; a refused handoff is drained
    so the next one still lands where it should."""
    rng = random.Random(3)
    pair = Pair()
    try:
        jobs = [(f"r{i}", rng.sample(range(64), 5), ids) for i, ids in enumerate([[0, 1, 2, 3, 4], [9, 7, 8, 20, 21],
                                                                                  [40, 41, 42, 43, 44]])]
        sent = [pair.send(rid, s, d) for rid, s, d in jobs]
        first = pair.decode.receive(record("r0", sent[0], jobs[0][2]), jobs[0][2], [])
        drained = pair.decode.discard(record("r1", sent[1], jobs[1][2]), [])  # e.g. aborted while it was prefilling
        third = pair.decode.receive(record("r2", sent[2], jobs[2][2]), jobs[2][2], [])
        for future in (first, drained, third, *(s.done for s in sent)):
            future.result(timeout=30)
        assert_landed(pair.src, pair.dst, jobs[0][1] + jobs[2][1], jobs[0][2] + jobs[2][2])
    finally:
        pair.close()


def test_gloo_receive_refuses_a_mismatched_reservation_and_stays_aligned():
    pair = Pair()
    try:
        sent = pair.send("r1", [1, 2, 3], [4, 5, 6])
        with pytest.raises(TransferError, match="3 blocks sent for 2 reserved"):
            pair.decode.receive(record("r1", sent, [4, 5, 6]), [4, 5], [])
        sent.done.result(timeout=30)  # the sender finished: the bytes were drained
        pair.handoff("r3", [7, 8], [10, 11])
        assert_landed(pair.src, pair.dst, [7, 8], [10, 11])
    finally:
        pair.close()


def test_a_handoff_without_its_stream_is_refused():
    pair = Pair()
    try:
        sent = pair.send("r1", [1], [2])
        without = msgspec.structs.replace(record("r1", sent, [2]), nccl=None)
        with pytest.raises(TransferError, match="names none"):
            pair.decode.receive(without, [2], [])
        with pytest.raises(TransferError, match="no payload frames, got 2"):
            pair.decode.receive(record("r1", sent, [2]), [2], [b"", b""])
        assert pair.decode.receiving == {}
    finally:
        pair.close()


def test_gloo_a_link_opened_ahead_carries_the_first_handoff():
    """`open` and `join` set the link up before any handoff (its first operation, where NCCL makes its
    communicator); the handoffs after it go over that link, and a transport without links opens none."""
    pair = Pair()
    try:
        name, sent_word = pair.prefill.open("d0", pair.peer)
        joined = pair.decode.join("p0", name)
        sent_word.result(timeout=30)
        joined.result(timeout=30)
        assert pair.prefill.sending["d0"].name == name and list(pair.decode.receiving) == [name]
        pair.handoff("r1", [3, 4, 9], [5, 6, 60])
        pair.handoff("r2", [1], [2])
        assert_landed(pair.src, pair.dst, [3, 4, 9, 1], [5, 6, 60, 2])
        assert pair.prefill.sending["d0"].name == name and list(pair.decode.receiving) == [name]
        assert HostTransport(blank_pool(4)).open("d0", pair.peer) is None
        with pytest.raises(TransferError, match="opens no links"):
            HostTransport(blank_pool(4)).join("p0", name)
    finally:
        pair.close()


def test_gloo_a_silent_peer_fails_the_transfer_and_the_next_send_opens_a_new_link():
    """No request waits forever: the decode side never joins, the send fails after the timeout."""
    pair = Pair(timeout=1.0)
    try:
        sent = pair.send("r1", [1], [2])
        with pytest.raises(TransferError):
            sent.done.result(timeout=30)
        old = pair.prefill.sending["d0"].name
        pair.handoff("r2", [3, 4], [5, 6])
        assert pair.prefill.sending["d0"].name != old
        assert_landed(pair.src, pair.dst, [3, 4], [5, 6])
    finally:
        pair.close()


def test_gloo_a_restarted_decode_peer_gets_a_new_link_and_its_blocks_land_in_its_new_pool() -> None:
    """A restarted peer is a new peer: a decode worker back under its id publishes a new descriptor, and the link to
    its old self is stale. The next send opens a new link to the new descriptor at once; it neither waits on the
    dead link until its timeout nor fails the request."""
    pair = Pair(timeout=3.0)
    restarted = None
    try:
        pair.handoff("r1", [1, 2], [3, 4])
        old = pair.prefill.sending["d0"].name
        pair.decode.close()  # d0 restarts: a new process, a new pool, a new port
        restarted = NcclTransport(blank_pool(64), timeout=3.0)
        sent = pair.prefill.send("r2", "d0", KVDescriptors(nccl=restarted.descriptor()), [5, 6], [7, 8])
        restarted.receive(record("r2", sent, [7, 8]), [7, 8], sent.payload).result(timeout=30)
        sent.done.result(timeout=30)
        assert pair.prefill.sending["d0"].name != old
        assert_landed(pair.src, restarted.pool, [5, 6], [7, 8])
    finally:
        pair.prefill.close()
        if restarted is not None:
            restarted.close()


def test_gloo_out_of_order_metadata_breaks_the_link():
    pair = Pair(timeout=2.0)
    try:
        pair.send("r1", [1], [2])  # its record is lost on the way
        second = pair.send("r2", [3], [4])
        failed = pair.decode.receive(record("r2", second, [4]), [4], [])  # r1's record never arrived
        with pytest.raises(TransferError, match="out of order: got 1, expected 0"):
            failed.result(timeout=30)
    finally:
        pair.close()


def test_host_transport_round_trip():
    src, dst = filled_pool(8, 1), blank_pool(8)
    sent = HostTransport(src).send("r1", "d0", KVDescriptors(), [6, 1, 2], [0, 7, 3])
    assert sent.done is None and sent.nccl is None and len(sent.payload) == 1
    assert HostTransport(dst).receive(None, [0, 7, 3], sent.payload) is None
    assert_landed(src, dst, [6, 1, 2], [0, 7, 3])
