"""Stop 24 on two GPUs: which part of an nccl receive waits for work queued on the decode side's compute stream.

The decode process queues about a second of GPU work (torch.cuda._sleep) on its compute stream, then receives a
handoff and times when the receive resolves; per case: the compute stream (the legacy default stream the engine
uses, or a stream of PyTorch's pool) and the block ids (one run: views of the pools only; scattered: scratch
buffers, their scatter and an index uploaded); and who posts what can be posted at once (the caller's thread, or all on the link thread).
`python docs/gpu_runs/stop24_recv_probe.py`."""
from __future__ import annotations

import multiprocessing as mp
import random
import time

import torch

from common import protocol as P
from common.engine.kv_pool import KVPool
from common.protocol import KVDescriptors
from kvtransfer import segments as S
from kvtransfer.nccl import link as L
from kvtransfer.nccl.transport import NcclTransport
from tests.test_kvtransfer_gpu import LAYOUT, NUM_BLOCKS, source_pool

CASES = [(stream, ids, poster) for stream in ("default", "pool") for ids in ("run", "scattered")
         for poster in ("caller", "link-thread")]


def ids_for(kind: str, rng: random.Random) -> tuple[list[int], list[int]]:
    if kind == "run":
        return list(range(10, 33)), list(range(40, 63))
    return rng.sample(range(NUM_BLOCKS), 23), rng.sample(range(NUM_BLOCKS), 23)


def decode(conn) -> None:
    torch.cuda.set_device("cuda:1")
    S.CHUNK_BYTES = 5 * LAYOUT.block_bytes
    pool = KVPool(LAYOUT, NUM_BLOCKS, "cuda:1")
    transport = NcclTransport(pool, "127.0.0.1", 60.0)
    conn.send(KVDescriptors(nccl=transport.descriptor()))
    side = torch.cuda.Stream()
    run = L.Link.run
    while (msg := conn.recv()) is not None:
        case, request_id, dst, stream = msg
        record = P.KVHandoff(request_id=request_id, src_worker_id="p0", first_token=0, num_tokens=1, transport="nccl",
                             dst_block_ids=dst, reply_to="", nccl=stream)
        L.Link.run = run if case is None or case[2] == "caller" else (lambda self, t, post_here=False: run(self, t))
        compute = torch.cuda.default_stream() if case is None or case[0] == "default" else side
        torch.cuda.synchronize()
        with torch.cuda.stream(compute):
            t0 = time.perf_counter()
            if case is not None:
                torch.cuda._sleep(2_000_000_000)
            t1 = time.perf_counter()
            pending = transport.receive(record, dst, [])
            t2 = time.perf_counter()
            pending.result(timeout=20)
            t3 = time.perf_counter()
            busy = not compute.query()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        conn.send(f"{case}: receive() {1e3 * (t2 - t1):.2f} ms, resolved {1e3 * (t3 - t1):.1f} ms after, compute stream "
                  f"{'still busy' if busy else 'done'}; its work done {1e3 * (t4 - t0):.0f} ms after queued")
    transport.close()


def main() -> None:
    print(f"torch {torch.__version__}, nccl {torch.cuda.nccl.version()}, peer access 0->1: "
          f"{torch.cuda.can_device_access_peer(0, 1)}", flush=True)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=decode, args=(child,), daemon=True)
    proc.start()
    S.CHUNK_BYTES = 5 * LAYOUT.block_bytes
    descriptor = conn.recv()
    src = source_pool("cuda:0")
    sender = NcclTransport(src, "127.0.0.1", 60.0)
    rng = random.Random(0)
    n = 0
    for case in [None, *CASES, *CASES]:  # the first opens the link
        for kind in ([case[1]] if case else ["scattered"]):
            s, d = ids_for(kind, rng)
            n += 1
            sent = sender.send(f"r{n}", "d0", descriptor, s, d)
            conn.send((case, f"r{n}", d, sent.nccl))
            print(conn.recv(), flush=True)
            sent.done.result(timeout=20)
    conn.send(None)
    proc.join(30)
    sender.close()


if __name__ == "__main__":
    main()
