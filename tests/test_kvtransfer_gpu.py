"""The CUDA transports between real processes: CUDA IPC on one GPU and across two, NCCL across two GPUs,
and whole GPU clusters moving KV with each.

Run on the GPU host: `python -m pytest tests/test_kvtransfer_gpu.py -v`. The decode side lives in a
process spawned here; the prefill side is this process. Random bf16 blocks go to shuffled block ids
and are compared bit for bit; every block not reserved must keep its sentinel value. Tests that need
two GPUs skip on one. NCCL cannot put two ranks on one GPU, so on one GPU it is only checked to fail
fast.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal

import pytest
import torch

from common import protocol as P
from common.engine.kv_pool import KVPool
from common.protocol import KVDescriptors, KVLayout
from kvtransfer import segments as T
from kvtransfer.cuda_ipc import CudaIPCTransport
from kvtransfer.errors import TransferError
from kvtransfer.nccl.transport import NcclTransport

pytestmark = pytest.mark.gpu

LAYOUT = KVLayout(num_layers=4, block_size=16, num_kv_heads=8, head_dim=128, dtype="bfloat16")  # 256 KiB blocks
NUM_BLOCKS = 96
SENTINEL = -3.0
TRANSPORTS = {"cuda_ipc": CudaIPCTransport, "nccl": NcclTransport}
REPLY_TIMEOUT = 120


def two_gpus():
    return pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")


# ---- the decode side, in its own process ----------------------------------------------------------------

def decode_peer(kind: str, device: str, conn) -> None:
    """Owns a KV pool of sentinels; publishes its descriptor, then lands (or drains) what it is told to
    and checks it against the expected blocks, restoring the sentinels after every check."""
    torch.cuda.set_device(device)
    pool = KVPool(LAYOUT, NUM_BLOCKS, device)
    pool.kv.fill_(SENTINEL)
    transport = TRANSPORTS[kind](pool, "127.0.0.1", 60.0)
    conn.send(KVDescriptors(**{kind: transport.descriptor()}))
    try:
        while (msg := conn.recv()) is not None:
            op, request_id, dst_ids, frames, stream, expected = msg
            record = P.KVHandoff(request_id=request_id, src_worker_id="p0", first_token=0, num_tokens=1,
                                 transport=kind, dst_block_ids=dst_ids, reply_to="", nccl=stream)
            try:
                busy = op == "receive-while-busy"
                if busy:
                    freed, total = busy_compute_stream()
                    assert not torch.cuda.current_stream().query(), "the set-up waited for its own queued work"
                if op.startswith("receive"):
                    pending = transport.receive(record, dst_ids, frames)
                else:
                    pending = transport.discard(record, frames)
                if pending is not None:
                    pending.result(timeout=60)
                landed_early = busy and not torch.cuda.current_stream().query()
                torch.cuda.synchronize()
                problem = check(pool, dst_ids, expected)
                if busy and not landed_early:
                    problem += " the blocks landed only after the compute stream's later work"
                if busy and int(total.sum()) != freed:
                    problem += f" the receive wrote memory a queued kernel read: sum {int(total.sum())}, not {freed}"
                pool.kv.fill_(SENTINEL)  # before answering: a cuda_ipc sender writes as soon as it hears back
                torch.cuda.synchronize()
                conn.send(("ok", problem))
            except Exception as e:
                conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        transport.close()


def busy_compute_stream() -> tuple[int, torch.Tensor]:
    """The decode worker's compute stream with a second of work queued and, after it, kernels reading buffers freed
    already (their memory is the allocator's to give out again on this stream): buffers of every size the receive
    allocates, all ones. Returns how many ones, and where those kernels write their sums. Everything those kernels
    need is allocated before the sleep (a read done once ahead): a device allocation then could wait for the GPU."""
    buffers = [torch.ones(n, dtype=torch.uint8, device="cuda") for n in (5 * LAYOUT.block_bytes, 32) for _ in range(4)]
    totals = torch.zeros(len(buffers), dtype=torch.int64, device="cuda")

    def read() -> None:
        for i, b in enumerate(buffers):
            torch.sum(b, dim=0, dtype=torch.int64, out=totals[i])
    read()
    totals.zero_()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU clock cycles
    read()
    freed = sum(b.numel() for b in buffers)
    buffers.clear()
    return freed, totals


def check(pool: KVPool, dst_ids: list[int], expected: torch.Tensor | None) -> str:
    """Empty when the reserved blocks hold exactly `expected` and every other block its sentinel."""
    kv = pool.kv.cpu()
    if expected is not None and not torch.equal(kv[dst_ids].view(torch.int16), expected.view(torch.int16)):
        wrong = [b for i, b in enumerate(dst_ids) if not torch.equal(kv[b], expected[i])]
        return f"blocks {wrong[:8]} do not hold what was sent"
    reserved = set(dst_ids) if expected is not None else set()
    touched = [b for b in range(pool.num_blocks) if b not in reserved and not bool((kv[b] == SENTINEL).all())]
    return f"blocks {touched[:8]} were written but not reserved" if touched else ""


def prefill_peer_expecting_refusal(descriptor: P.CudaIpcDescriptor, conn) -> None:
    """A prefill worker that sees only its own GPU tries to write into a pool on another one."""
    pool = KVPool(LAYOUT, NUM_BLOCKS, "cuda:0")
    try:
        CudaIPCTransport(pool).send("r1", "d0", KVDescriptors(cuda_ipc=descriptor), [0], [0])
        conn.send("sent without error")
    except TransferError as e:
        conn.send(str(e))


class Peer:
    """A spawned decode peer and the pipe to it."""

    def __init__(self, kind: str, device: str):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=decode_peer, args=(kind, device, child), daemon=True)
        self.proc.start()
        self.descriptor = self.recv()

    def recv(self):
        assert self.conn.poll(REPLY_TIMEOUT), "the decode peer did not answer"
        return self.conn.recv()

    def ask(self, op: str, request_id: str, dst_ids: list[int], sent, expected) -> str:
        self.conn.send((op, request_id, dst_ids, [bytes(f) for f in sent.payload], sent.nccl, expected))
        status, problem = self.recv()
        assert status == "ok", problem
        return problem

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()


def source_pool(device: str) -> KVPool:
    pool = KVPool(LAYOUT, NUM_BLOCKS, device)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(0)).to(pool.dtype))
    return pool


def cases() -> list[tuple[list[int], list[int]]]:
    rng = random.Random(0)
    return [
        (list(range(10, 50)), list(range(40, 80))),  # consecutive both sides
        (rng.sample(range(NUM_BLOCKS), 40), rng.sample(range(NUM_BLOCKS), 40)),  # shuffled both sides
        (list(range(0, 12)), rng.sample(range(NUM_BLOCKS), 12)),
        (rng.sample(range(NUM_BLOCKS), 12), list(range(70, 82))),
        ([3], [95]),
        (rng.sample(range(NUM_BLOCKS), 90), rng.sample(range(NUM_BLOCKS), 90)),
    ]


@pytest.fixture
def small_chunks(monkeypatch):
    """Segments of at most 5 blocks (the sender plans them), so chunking and the in-flight window are used."""
    monkeypatch.setattr(T, "CHUNK_BYTES", 5 * LAYOUT.block_bytes)


def run_handoffs(kind: str, src_device: str, dst_device: str) -> None:
    src = source_pool(src_device)
    peer = Peer(kind, dst_device)
    sender = TRANSPORTS[kind](src, "127.0.0.1", 60.0)
    try:
        n = 0
        for strategy in ("auto", "runs", "gather" if kind == "nccl" else "kernel"):
            sender.strategy = strategy
            for src_ids, dst_ids in cases():
                n += 1
                sent = sender.send(f"r{n}", "d0", peer.descriptor, src_ids, dst_ids)
                expected = src.kv[src_ids].cpu()
                problem = peer.ask("receive", f"r{n}", dst_ids, sent, expected)
                if sent.done is not None:
                    sent.done.result(timeout=60)
                assert problem == "", f"{kind} {strategy} {src_ids[:4]}... -> {dst_ids[:4]}...: {problem}"
                if kind == "cuda_ipc":  # a direct copy times itself: on the GPU, and the send's wait for it
                    assert 0 < sent.copy_gpu < 1 and 0 <= sent.waited < 1, (sent.copy_gpu, sent.waited)
        if kind == "nccl":  # a refused handoff is drained and the link stays aligned
            sent = sender.send("refused", "d0", peer.descriptor, [1, 2, 3], [4, 5, 6])
            assert peer.ask("discard", "refused", [], sent, None) == ""
            sent.done.result(timeout=60)
            sent = sender.send("after", "d0", peer.descriptor, [7, 9], [8, 10])
            assert peer.ask("receive", "after", [8, 10], sent, src.kv[[7, 9]].cpu()) == ""
            sent.done.result(timeout=60)
            assert len(sender.sending) == 1  # one link for the whole test
    finally:
        sender.close()
        peer.close()


# ---- CUDA IPC ---------------------------------------------------------------------------------------------

def test_cuda_ipc_between_two_processes_on_one_gpu(small_chunks):
    run_handoffs("cuda_ipc", "cuda:0", "cuda:0")


@two_gpus()
def test_cuda_ipc_between_two_processes_across_two_gpus(small_chunks):
    run_handoffs("cuda_ipc", "cuda:0", "cuda:1")


def test_cuda_ipc_with_big_chunks_on_one_gpu():
    run_handoffs("cuda_ipc", "cuda:0", "cuda:0")


def test_cuda_ipc_descriptor_maps_in_this_process_too():
    """A process cannot open its own IPC handle; a same-process peer (benchmarks) uses the tensor itself."""
    src, dst = source_pool("cuda:0"), KVPool(LAYOUT, NUM_BLOCKS, "cuda:0")
    dst.kv.fill_(SENTINEL)
    receiver, sender = CudaIPCTransport(dst), CudaIPCTransport(src)
    sender.send("r1", "d0", KVDescriptors(cuda_ipc=receiver.descriptor()), [5, 1, 2], [7, 8, 0])
    assert torch.equal(dst.kv[[7, 8, 0]], src.kv[[5, 1, 2]])
    assert sender.peer_pool("d0", receiver.descriptor()).data_ptr() == dst.kv.data_ptr()


def test_cuda_ipc_open_sets_the_pair_up_before_its_first_handoff():
    """open (the router's open_link as the workers meet) maps the peer's pool and loads the copy kernel, so the
    first handoff does neither; a pool it cannot use is refused there, before any request."""
    src, dst = source_pool("cuda:0"), KVPool(LAYOUT, NUM_BLOCKS, "cuda:0")
    receiver, sender = CudaIPCTransport(dst), CudaIPCTransport(src, strategy="kernel")
    peer = KVDescriptors(cuda_ipc=receiver.descriptor())
    assert sender.open("d0", peer) is None  # nothing for the decode side to join
    descriptor, kv, copy = sender.peers["d0"]
    assert kv.data_ptr() == dst.kv.data_ptr() and copy.device == dst.kv.device
    sender.send("r1", "d0", peer, [5, 1, 2], [7, 8, 0])
    assert sender.peers["d0"][2] is copy  # the handoff set nothing up
    assert torch.equal(dst.kv[[7, 8, 0]], src.kv[[5, 1, 2]])
    other = KVLayout(num_layers=4, block_size=32, num_kv_heads=8, head_dim=128, dtype="bfloat16")
    with pytest.raises(TransferError, match="KV layout mismatch with d1"):
        sender.open("d1", KVDescriptors(cuda_ipc=CudaIPCTransport(KVPool(other, 8, "cuda:0")).descriptor()))


@pytest.mark.parametrize("strategy", ["runs", "kernel"])
def test_cuda_ipc_does_not_wait_for_work_queued_after_the_blocks_were_written(strategy):
    """With overlap the engine launches the next prefill before it hands off the blocks of the one it just
    collected: the handoff must not queue behind that step (a GPU sleep on the compute stream stands for it)."""
    src, dst = source_pool("cuda:0"), KVPool(LAYOUT, NUM_BLOCKS, "cuda:0")
    receiver, sender = CudaIPCTransport(dst), CudaIPCTransport(src, strategy=strategy)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU clock cycles
    sender.send("r1", "d0", KVDescriptors(cuda_ipc=receiver.descriptor()), [5, 1, 2, 9], [7, 8, 0, 3])
    assert not torch.cuda.current_stream().query(), "send returned only after the compute stream's later work"
    torch.cuda.synchronize()
    assert torch.equal(dst.kv[[7, 8, 0, 3]], src.kv[[5, 1, 2, 9]])


def test_cuda_ipc_refuses_a_layout_mismatch():
    other = KVLayout(num_layers=4, block_size=32, num_kv_heads=8, head_dim=128, dtype="bfloat16")
    receiver, sender = CudaIPCTransport(KVPool(other, 8, "cuda:0")), CudaIPCTransport(source_pool("cuda:0"))
    with pytest.raises(TransferError, match=r"KV layout mismatch with d0 \(here vs there\): block_size 16 vs 32"):
        sender.send("r1", "d0", KVDescriptors(cuda_ipc=receiver.descriptor()), [0], [0])


@two_gpus()
def test_cuda_ipc_refuses_a_gpu_this_process_cannot_see():
    dst = KVPool(LAYOUT, NUM_BLOCKS, "cuda:1")
    descriptor = CudaIPCTransport(dst).descriptor()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0] if visible else "0"  # the child sees GPU 0 only
    try:
        proc = ctx.Process(target=prefill_peer_expecting_refusal, args=(descriptor, child), daemon=True)
        proc.start()
    finally:
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    assert conn.poll(REPLY_TIMEOUT)
    answer = conn.recv()
    proc.join(timeout=30)
    assert "which this process cannot see" in answer and "use nccl" in answer, answer


# ---- NCCL -------------------------------------------------------------------------------------------------

@two_gpus()
def test_nccl_between_two_processes_across_two_gpus(small_chunks):
    run_handoffs("nccl", "cuda:0", "cuda:1")


@two_gpus()
def test_nccl_with_big_chunks_across_two_gpus():
    run_handoffs("nccl", "cuda:0", "cuda:1")


@two_gpus()
def test_nccl_send_does_not_wait_for_work_queued_after_the_blocks_were_written():
    """As for cuda_ipc: the blocks arrive while the sender's compute stream still runs later work."""
    src = source_pool("cuda:0")
    peer = Peer("nccl", "cuda:1")
    sender = NcclTransport(src, "127.0.0.1", 60.0)
    try:
        for n, (src_ids, dst_ids) in enumerate([([1, 2], [3, 4]), ([5, 1, 2, 9], [7, 8, 0, 3])]):
            expected = src.kv[src_ids].cpu()
            if n:  # the first handoff opens the link
                torch.cuda._sleep(4_000_000_000)  # about two seconds of GPU clock cycles
            sent = sender.send(f"r{n}", "d0", peer.descriptor, src_ids, dst_ids)
            assert peer.ask("receive", f"r{n}", dst_ids, sent, expected) == ""
            sent.done.result(timeout=60)
        assert not torch.cuda.current_stream(0).query(), "the blocks moved only after the compute stream's later work"
    finally:
        torch.cuda.synchronize()
        sender.close()
        peer.close()


@two_gpus()
def test_nccl_receive_does_not_wait_for_the_decode_workers_queued_work(small_chunks):
    """The decode side posts its receive on the link's stream, with its buffers from there: the blocks land while
    its compute stream still runs earlier work, and that work's freed memory is not written under it. (Scattered
    ids through chunks of 5 blocks: the receive's scratch buffers are the size of the ones freed.)"""
    src = source_pool("cuda:0")
    peer = Peer("nccl", "cuda:1")
    sender = NcclTransport(src, "127.0.0.1", 60.0)
    try:
        rng = random.Random(1)
        for n in range(3):  # the first handoff opens the link; the next ones are posted by the receiving thread
            src_ids, dst_ids = rng.sample(range(NUM_BLOCKS), 23), rng.sample(range(NUM_BLOCKS), 23)
            sent = sender.send(f"r{n}", "d0", peer.descriptor, src_ids, dst_ids)
            op = "receive-while-busy" if n else "receive"
            assert peer.ask(op, f"r{n}", dst_ids, sent, src.kv[src_ids].cpu()) == ""
            sent.done.result(timeout=60)
    finally:
        sender.close()
        peer.close()


def test_nccl_refuses_two_ranks_on_one_gpu():
    """NCCL cannot pair two ranks on one device: refused before any link is opened (use cuda_ipc)."""
    receiver = NcclTransport(KVPool(LAYOUT, 8, "cuda:0"))
    sender = NcclTransport(source_pool("cuda:0"))
    try:
        with pytest.raises(TransferError, match="both workers are on one GPU.*use cuda_ipc"):
            sender.send("r1", "d0", KVDescriptors(nccl=receiver.descriptor()), [0], [0])
        assert sender.sending == {}
    finally:
        sender.close()
        receiver.close()


# ---- whole clusters ---------------------------------------------------------------------------------------

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,", "Hello, my name is"]
GREEDY = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
CLUSTERS = {  # name: (serve flags, GPUs needed, the transport the router must pick)
    "cuda_ipc-one-gpu": (["--kv-transport", "cuda_ipc", "--gpus-per-worker", "0.5"], 1, "cuda_ipc"),
    "auto-one-gpu": (["--gpus-per-worker", "0.5"], 1, "cuda_ipc"),
    "cuda_ipc-two-gpus": (["--kv-transport", "cuda_ipc", "--gpus-per-worker", "1", "--gpu-visibility", "node"], 2,
                          "cuda_ipc"),
    "auto-two-gpus-node-visibility": (["--gpus-per-worker", "1", "--gpu-visibility", "node"], 2, "cuda_ipc"),
    "auto-two-gpus": (["--gpus-per-worker", "1"], 2, "nccl"),  # each worker sees its own GPU only
    "nccl-two-gpus": (["--kv-transport", "nccl", "--gpus-per-worker", "1"], 2, "nccl"),
}


@pytest.fixture(scope="module")
def gpu_expected(tiny_qwen3_dir):
    """The offline engine on the GPU, one prompt at a time (the clusters get them one at a time too)."""
    from common.engine.llm import LLM
    from common.sampling_params import SamplingParams

    llm = LLM(str(tiny_qwen3_dir), device="cuda", num_kv_blocks=1024, gpu_memory_utilization=0.3, max_num_seqs=64,
              max_num_batched_tokens=1024)  # as the cluster harness's workers
    try:
        return [llm.generate([p], SamplingParams(**GREEDY), use_tqdm=False)[0].token_ids for p in PROMPTS]
    finally:
        llm.close()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("name", list(CLUSTERS))
def test_gpu_cluster_output_equals_offline_generate(name, tiny_qwen3_dir, gpu_expected, tmp_path, monkeypatch):
    from tests.cluster_harness import RunningCluster

    flags, gpus, transport = CLUSTERS[name]
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs")
    if gpus == 1:  # Ray could spread two half-GPU workers over two GPUs: show it one
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible.split(",")[0] if visible else "0")
    cluster = RunningCluster(tiny_qwen3_dir, "disagg", tmp_path / "serve.log", "--device", "cuda",
                             "--num-kv-blocks", "1024", "--gpu-memory-utilization", "0.3", *flags)
    try:
        with cluster.client(timeout=120) as c:
            got = [c.generate(p, **GREEDY).token_ids for p in PROMPTS]
        assert got == gpu_expected, cluster.log()
        assert f"p0 -> d0: {transport}" in cluster.log(), cluster.log()
        workers = cluster.wait_all_blocks_free()
        assert all(w.kv_blocks_free == w.kv_blocks_total for w in workers), workers
    finally:
        status = cluster.stop()
        for pid in cluster.orphans():
            os.kill(pid, signal.SIGKILL)
    assert status == 0, cluster.log()
