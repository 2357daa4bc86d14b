"""KV transports on CPU: run grouping, descriptors (msgpack, no pickle), layout checks, transport choice,
and the nccl transport end to end on gloo (both ranks in this process, one link thread each)."""
from __future__ import annotations

import random
import sys
import threading
from concurrent.futures import Future
from types import SimpleNamespace

import msgpack
import pytest
import torch

from common import protocol as P
from common.engine.kv_pool import KVLayout, KVPool
from common.sampling_params import SamplingParams
from common.engine.sequence import Sequence
from common.worker.runtime import WorkerConfig
from decode_worker.worker import DecodeWorker
from kvtransfer import descriptors as D
from kvtransfer import transport as T
from kvtransfer.choice import available_transports, choose_transport
from kvtransfer.cuda_ipc import CudaIPCTransport
from kvtransfer.descriptors import TransferError, pack_descriptors, unpack_descriptors
from kvtransfer.host import HostTransport
from kvtransfer.nccl import NcclTransport
from prefill_worker.worker import PrefillWorker

LAYOUT = KVLayout(num_layers=3, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float32)
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


# ---- descriptors ---------------------------------------------------------------------------------------

def test_nccl_descriptor_is_plain_msgpack():
    transport = NcclTransport(blank_pool(4), "127.0.0.1")
    try:
        blob = transport.descriptor()
        record = msgpack.unpackb(blob, raw=False, ext_hook=no_ext)
        assert primitive(record)
        assert record["backend"] == "gloo" and record["host"] == "127.0.0.1" and record["port"] > 0
        assert record["layout"] == {"num_layers": 3, "block_size": 4, "num_kv_heads": 2, "head_dim": 8,
                                    "dtype": "float32"}
        assert record["num_blocks"] == 4
        assert transport.descriptor() == blob  # one store, one descriptor
    finally:
        transport.close()


def test_descriptors_round_trip_through_the_hello_blob():
    blob = pack_descriptors({"host": b"", "nccl": b"\x81\xa1v\x01", "cuda_ipc": bytes(range(256))})
    assert primitive(msgpack.unpackb(blob, raw=False, ext_hook=no_ext))
    assert unpack_descriptors(blob) == {"nccl": b"\x81\xa1v\x01", "cuda_ipc": bytes(range(256))}
    assert unpack_descriptors(b"") == {}
    with pytest.raises(TransferError, match="not msgpack"):
        unpack_descriptors(b"\xc1")
    with pytest.raises(TransferError, match="expected a map"):
        unpack_descriptors(msgpack.packb([1, 2]))


def test_cuda_ipc_share_record_is_bytes_and_ints():
    """What export_tensor produces (a CUDA IPC handle) survives msgpack unchanged; the GPU tests map it."""
    share = {"shape": [10, 3, 2, 4, 2, 8], "stride": [384, 128, 64, 16, 8, 1], "offset": 0, "dtype": "bfloat16",
             "device": 0, "handle": b"\x02" + bytes(range(64)), "storage_bytes": 7680, "storage_offset_bytes": 0,
             "ref_counter_handle": b"/torch_123_456_0", "ref_counter_offset": 0, "event_handle": bytes(64),
             "event_sync_required": True}
    record = {"v": 1, "pid": 1, "gpu": "GPU-x", "visible": ["GPU-x"], "layout": T.layout_record(LAYOUT),
              "num_blocks": 10, "pool": share}
    blob = D.pack(record)
    assert D.unpack(blob, "cuda_ipc") == record and primitive(msgpack.unpackb(blob, raw=False, ext_hook=no_ext))
    with pytest.raises(TypeError):
        D.pack({"dtype": torch.float32})  # no pickle fallback


# ---- fail fast ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("block_size", 16), ("dtype", "bfloat16"), ("num_kv_heads", 8),
                                          ("num_layers", 28), ("head_dim", 128)])
def test_layout_mismatch_names_the_field(field, value):
    theirs = {**T.layout_record(LAYOUT), field: value}
    with pytest.raises(TransferError, match=f"KV layout mismatch with d0: {field} "):
        T.check_layout(LAYOUT, theirs, "d0")
    T.check_layout(LAYOUT, T.layout_record(LAYOUT), "d0")


def test_nccl_send_refuses_a_peer_with_another_layout_before_connecting():
    other = KVLayout(num_layers=3, block_size=8, num_kv_heads=2, head_dim=8, dtype=torch.float32)
    decode = NcclTransport(KVPool(other, 4, "cpu"))
    prefill = NcclTransport(filled_pool(4, 0))
    try:
        with pytest.raises(TransferError, match="block_size 4 here, 8 on d0"):
            prefill.send("r1", "d0", decode.descriptor(), [0], [1])
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
    from kvtransfer.nccl import _wait

    work = _Work(polls=5)
    _wait(_link("nccl", 10.0), work)
    assert work.checks == 6 and work.waited_done


def test_posted_segments_bound_only_those_holding_scratch_memory(monkeypatch):
    """Views of a pool stay posted (no host round trip between them); a third scratch segment waits for the
    oldest one, and a scatter runs right after its own receive completes."""
    from kvtransfer import nccl

    events: list[str] = []

    class Work:
        def __init__(self, name):
            self.name = name

        def wait(self):
            events.append(f"wait {self.name}")

    monkeypatch.setattr(nccl, "IN_FLIGHT", 2)
    posted = nccl._Posted(SimpleNamespace(backend="gloo", timeout=1.0))
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


def test_the_receiver_posts_what_needs_no_wait_when_nothing_earlier_is_left(monkeypatch):
    """Bytes start to move without waking the link thread, and both sides still post in handoff order: the
    caller posts leading views and one scratch receive; a second scratch segment, anything behind a transfer
    with operations left and a transfer not posted here (a sender's) are the link thread's."""
    import queue

    from kvtransfer import nccl

    posts: list[tuple[str, int]] = []

    class Work:
        def wait(self):
            pass

    def post(link, kind, t):
        posts.append((threading.current_thread().name, int(t[0])))
        return Work()

    monkeypatch.setattr(nccl, "_post", post)
    monkeypatch.setattr(nccl, "IN_FLIGHT", 2)
    link = object.__new__(nccl._Link)
    link.lock, link.unposted, link.error, link.group = threading.Lock(), 0, None, None
    link.backend, link.timeout, link.jobs = "gloo", 1.0, queue.SimpleQueue()

    def op(i, **kw):
        return nccl._Op("send", lambda: torch.tensor([i]), **kw)

    def transfer(*ops):
        return nccl._Transfer(link, list(ops), None, None)

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
    """Metadata naming another request than the bytes that arrive: the receive fails once they are in."""
    pair = Pair()
    try:
        sent = pair.send("r1", [1, 2], [4, 5])
        meta = D.unpack(sent.frames[0], "meta")
        forged = D.pack({**meta, "request_id": "r9"})
        with pytest.raises(TransferError, match="out of step"):
            pair.decode.receive("r9", "p0", [4, 5], [forged]).result(timeout=30)
        sent.done.result(timeout=30)
        assert pair.decode.receiving[meta["link"]].error is not None
    finally:
        pair.close()


def test_a_scatter_keeps_its_scratch_buffer_from_reuse_until_its_stream_has_read_it(monkeypatch):
    """A receive buffer may be made on the decode worker's thread (its compute stream) and scattered on the link
    stream; freed right after the scatter is queued, the allocator could hand it to the compute stream first."""
    from kvtransfer import nccl

    events: list[str] = []

    class Work:
        def wait(self):
            events.append("wait")

    class CudaBuffer:
        is_cuda, device = True, "cuda:0"

        def record_stream(self, stream):
            events.append(f"record {stream}")

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "link-stream")
    posted = nccl._Posted(SimpleNamespace(backend="gloo", timeout=1.0))
    posted.add(Work(), CudaBuffer(), scratch=True, then=lambda: events.append("scatter"))
    posted.drain()
    assert events == ["wait", "record link-stream", "scatter"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_link_threads_poll_with_a_fine_timer_slack():
    """A 20 us poll must not sleep 70 us: the link thread drops its timer slack to 1 us; others keep theirs."""
    import ctypes

    from kvtransfer import nccl

    def slack() -> int:  # PR_GET_TIMERSLACK: this thread's, in ns
        return ctypes.CDLL(None).prctl(30, 0, 0, 0, 0)

    seen: list[int] = []

    def link_thread():
        nccl._fine_timer_slack()
        seen.append(slack())

    before = slack()
    thread = threading.Thread(target=link_thread)
    thread.start()
    thread.join()
    assert seen == [1000] and slack() == before != 1000


def test_nccl_wait_gives_up_polling_at_the_deadline_and_lets_wait_raise():
    import time

    from kvtransfer.nccl import _wait

    work = _Work(polls=None)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        _wait(_link("nccl", 0.05), work)
    assert 0.05 <= time.monotonic() - start < 5 and work.checks > 1


def test_gloo_wait_does_not_poll():
    """Gloo's send/recv work completes only inside wait: polling it would spin until the deadline."""
    from kvtransfer.nccl import _wait

    work = _Work(polls=None)
    with pytest.raises(TimeoutError):
        _wait(_link("gloo", 10.0), work)
    assert work.checks == 0


def test_sends_refuse_bad_block_ids():
    decode, prefill = NcclTransport(blank_pool(4)), NcclTransport(filled_pool(4, 0))
    try:
        with pytest.raises(TransferError, match=r"d0's block ids out of range \[0, 4\): \[4\]"):
            prefill.send("r1", "d0", decode.descriptor(), [0, 1], [3, 4])
        with pytest.raises(TransferError, match="source block ids"):
            prefill.send("r1", "d0", decode.descriptor(), [9], [3])
        with pytest.raises(TransferError, match="2 source blocks for 1"):
            prefill.send("r1", "d0", decode.descriptor(), [0, 1], [3])
        with pytest.raises(TransferError, match="published no nccl descriptor"):
            prefill.send("r1", "d0", b"", [0], [3])
    finally:
        prefill.close()
        decode.close()


def test_cuda_ipc_needs_a_cuda_pool():
    with pytest.raises(TransferError, match="cuda_ipc KV transport needs a CUDA KV pool; this one is on cpu"):
        CudaIPCTransport(blank_pool(2))


def test_available_transports():
    assert available_transports("cpu") == ["host"]
    assert available_transports("cpu", "host") == ["host"]
    assert available_transports("cpu", "nccl") == ["host", "nccl"]
    assert available_transports("cuda") == ["cuda_ipc", "nccl", "host"]
    with pytest.raises(TransferError, match="cuda_ipc KV transport needs CUDA workers; these run on cpu"):
        available_transports("cpu", "cuda_ipc")
    with pytest.raises(TransferError, match="unknown KV transport 'rdma'"):
        available_transports("cuda", "rdma")


def peer(name: str, node: str, transports: list[str], **descriptors: dict) -> dict:
    blob = pack_descriptors({k: D.pack(v) for k, v in descriptors.items()})
    return {"worker_id": name, "transports": transports, "node_id": node, "kv_descriptor": blob}


def ipc(gpu: str, visible: list[str]) -> dict:
    return {"v": 1, "gpu": gpu, "visible": visible}


def nccl(backend: str, gpu: str = "") -> dict:
    return {"v": 1, "backend": backend, "gpu": gpu}


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


def test_choose_transport_without_descriptors_trusts_the_lists():
    both = {"transports": ["cuda_ipc", "nccl", "host"], "node_id": "n1"}
    assert choose_transport(both, both) == "cuda_ipc"
    assert choose_transport(both, {**both, "node_id": "n2"}) == "nccl"
    assert choose_transport({"transports": ["host"], "node_id": ""}, both) == "host"


# ---- the nccl transport end to end, on gloo -----------------------------------------------------------

class Pair:
    """A prefill-side and a decode-side nccl transport in this process; a handoff runs both halves."""

    def __init__(self, src_blocks: int = 64, dst_blocks: int = 64, strategy: str = "auto", timeout: float = 20.0):
        self.src, self.dst = filled_pool(src_blocks, 0), blank_pool(dst_blocks)
        self.prefill = NcclTransport(self.src, timeout=timeout, strategy=strategy)
        self.decode = NcclTransport(self.dst, timeout=timeout)
        self.descriptor = self.decode.descriptor()

    def send(self, request_id: str, src_ids: list[int], dst_ids: list[int]) -> T.Sent:
        return self.prefill.send(request_id, "d0", self.descriptor, src_ids, dst_ids)

    def handoff(self, request_id: str, src_ids: list[int], dst_ids: list[int]) -> None:
        sent = self.send(request_id, src_ids, dst_ids)
        received = self.decode.receive(request_id, "p0", dst_ids, sent.frames)
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
        first = pair.decode.receive("r0", "p0", jobs[0][2], sent[0].frames)
        drained = pair.decode.discard("r1", "p0", sent[1].frames)  # e.g. aborted while it was prefilling
        third = pair.decode.receive("r2", "p0", jobs[2][2], sent[2].frames)
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
            pair.decode.receive("r1", "p0", [4, 5], sent.frames)
        sent.done.result(timeout=30)  # the sender finished: the bytes were drained
        with pytest.raises(TransferError, match="names request 'r1', the handoff 'r2'"):
            pair.decode.receive("r2", "p0", [4, 5, 6], sent.frames)
        pair.handoff("r3", [7, 8], [10, 11])
        assert_landed(pair.src, pair.dst, [7, 8], [10, 11])
    finally:
        pair.close()


def test_malformed_metadata_is_refused():
    pair = Pair()
    try:
        for meta, problem in [(b"\xc1", "not msgpack"), (D.pack({"v": 1}), "missing link, seq"),
                              (D.pack({"v": 1, "link": "x", "seq": -1, "request_id": "r1", "block_bytes": 8,
                                       "segments": [1]}), "malformed"),
                              (D.pack({"v": 1, "link": "x", "seq": 0, "request_id": "r1", "block_bytes": 8,
                                       "segments": [1]}), "version 1, this worker speaks 2")]:
            with pytest.raises(TransferError, match=problem):
                pair.decode.receive("r1", "p0", [1], [meta])
        with pytest.raises(TransferError, match="1 metadata frame, got 2"):
            pair.decode.receive("r1", "p0", [1], [b"", b""])
        assert pair.decode.receiving == {}
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


def test_gloo_out_of_order_metadata_breaks_the_link():
    pair = Pair(timeout=2.0)
    try:
        pair.send("r1", [1], [2])  # its record is lost on the way
        second = pair.send("r2", [3], [4])
        failed = pair.decode.receive("r2", "p0", [4], second.frames)  # r1's record never arrived
        with pytest.raises(TransferError, match="out of order: got 1, expected 0"):
            failed.result(timeout=30)
    finally:
        pair.close()


def test_host_transport_round_trip():
    src, dst = filled_pool(8, 1), blank_pool(8)
    sent = HostTransport(src).send("r1", "d0", b"", [6, 1, 2], [0, 7, 3])
    assert sent.done is None and len(sent.frames) == 1
    assert HostTransport(dst).receive("r1", "p0", [0, 7, 3], sent.frames) is None
    assert_landed(src, dst, [6, 1, 2], [0, 7, 3])


# ---- the workers hold blocks while a streaming transport still uses them --------------------------------

class StubEngine:
    """The parts of LLMEngine the handoff code touches; records what it was asked to do."""

    def __init__(self):
        self.reserved: dict[str, Sequence] = {}
        self.aborted: list[str] = []
        self.admitted: list[str] = []

    def reserve(self, request_id: str, block_ids: list[int]) -> None:
        seq = Sequence(request_id, [1] * (len(block_ids) * LAYOUT.block_size - 1), SamplingParams())
        seq.block_table = block_ids
        self.reserved[request_id] = seq

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.reserved.pop(request_id, None)

    def admit_prefilled(self, request_id: str, first_token: int) -> Sequence:
        self.admitted.append(request_id)
        seq = self.reserved.pop(request_id)
        seq.token_ids.append(first_token)
        return seq


class StubTransport:
    """A streaming transport: receive and send return futures the test resolves."""

    name = "stream"

    def __init__(self):
        self.pending: Future = Future()
        self.discarded: list[str] = []

    def receive(self, request_id, peer_id, dst_block_ids, frames):
        return self.pending

    def discard(self, request_id, peer_id, frames):
        self.discarded.append(request_id)


WIRE_LAYOUT = P.KVLayout(block_size=LAYOUT.block_size, num_layers=LAYOUT.num_layers, num_kv_heads=LAYOUT.num_kv_heads,
                         head_dim=LAYOUT.head_dim, dtype="float32")


def stub_worker(cls):
    """A worker of role `cls` without an engine, sockets or thread: its handlers, and what they send."""
    w = object.__new__(cls)
    w.config = WorkerConfig(worker_id="w0", router_address="")
    w.engine = StubEngine()
    w.transports = {"stream": StubTransport()}
    w.layout = WIRE_LAYOUT
    w.leases, w.transfers, w._abort_after_transfer = {}, {}, set()
    w.handoffs, w.tasks = {}, {}
    w.to_router, w.to_peers = [], []
    w.send = w.to_router.append
    w.channel = type("Channel", (), {"send": lambda _, address, msg, payload=None: w.to_peers.append(msg)})()
    return w


def handoff(request_id: str, block_ids: list[int]) -> P.KVHandoff:
    return P.KVHandoff(request_id=request_id, src_worker_id="p0", first_token=42,
                       num_tokens=len(block_ids) * LAYOUT.block_size - 1, transport="stream", layout=WIRE_LAYOUT,
                       dst_block_ids=block_ids, reply_to="tcp://127.0.0.1:1")


def test_decode_admits_only_after_the_kv_has_landed():
    w = stub_worker(DecodeWorker)
    w.engine.reserve("r1", [4, 5])
    w.receive(handoff("r1", [4, 5]), [])
    assert "r1" in w.transfers and w.engine.admitted == [] and w.to_peers == []
    w._poll_transfers()
    assert w.engine.admitted == []  # not yet
    w.transports["stream"].pending.set_result(None)
    w._poll_transfers()
    assert w.engine.admitted == ["r1"] and w.transfers == {}
    assert [(m.request_id, m.ok) for m in w.to_peers] == [("r1", True)]
    assert isinstance(w.to_router[-1], P.TokenBatch) and w.to_router[-1].updates[0].token_ids == [42]


def test_decode_keeps_blocks_of_an_aborted_request_until_its_transfer_ends():
    """Freed blocks could be reserved by the next request while bytes still land in them."""
    w = stub_worker(DecodeWorker)
    w.engine.reserve("r1", [4, 5])
    w.receive(handoff("r1", [4, 5]), [])
    w.abort("r1")  # the client gave up, or the lease ran out
    assert w.engine.aborted == [] and "r1" in w.engine.reserved
    w.transports["stream"].pending.set_result(None)
    w._poll_transfers()
    assert w.engine.aborted == ["r1"] and w.engine.admitted == []
    assert [(m.request_id, m.ok, m.message) for m in w.to_peers] == [("r1", False, "aborted")]


def test_decode_fails_the_request_when_its_transfer_fails():
    w = stub_worker(DecodeWorker)
    w.engine.reserve("r1", [4, 5])
    w.receive(handoff("r1", [4, 5]), [])
    w.transports["stream"].pending.set_exception(TransferError("link broke"))
    w._poll_transfers()
    assert w.engine.aborted == ["r1"] and w.engine.admitted == []
    assert w.to_peers[0].ok is False and "link broke" in w.to_peers[0].message
    assert isinstance(w.to_router[-1], P.Error) and w.to_router[-1].code == P.ABORTED


def test_decode_drains_a_refused_handoff():
    w = stub_worker(DecodeWorker)
    w.receive(handoff("gone", [4, 5]), [])  # no reservation: aborted before its KV came
    assert w.transports["stream"].discarded == ["gone"] and w.transfers == {}
    assert w.to_peers[0].ok is False and "no reservation" in w.to_peers[0].message


def test_prefill_keeps_blocks_until_its_send_ends():
    w = stub_worker(PrefillWorker)
    sending: Future = Future()
    w.transfers["r1"] = sending
    w.on_data(P.HandoffAck(request_id="r1", ok=True), [])  # acknowledged before the send future resolved
    assert w.engine.aborted == []
    sending.set_result(None)
    w._poll_transfers()
    assert w.engine.aborted == ["r1"]
    failing: Future = Future()
    w.transfers["r2"] = failing
    failing.set_exception(TransferError("peer gone"))
    w._poll_transfers()
    assert w.engine.aborted == ["r1", "r2"]
    assert isinstance(w.to_router[-1], P.Error) and "peer gone" in w.to_router[-1].message
