"""Stop 24 on two GPUs: how long an nccl receive takes to resolve while the decode worker's main thread runs Python
(as it does launching a step), under the interpreter's default GIL switch interval (5 ms) and a shorter one; against
the main thread blocked on the receive. Consecutive and scattered block ids, 10 handoffs a case.
`python docs/gpu_runs/stop24_gil_gpu_probe.py` (stop24_gil_probe.py is the same question on a CPU, without NCCL)."""
from __future__ import annotations

import multiprocessing as mp
import random
import statistics
import sys
import time

import torch

from common import protocol as P
from common.engine.kv_pool import KVPool
from common.protocol import KVDescriptors
from kvtransfer import segments as S
from kvtransfer.nccl.transport import NcclTransport
from stop24_recv_probe import ids_for  # this folder: the script's own
from tests.test_kvtransfer_gpu import LAYOUT, NUM_BLOCKS, source_pool

CASES = [(main, interval, ids) for ids in ("run", "scattered") for main, interval in
         (("blocked", 0.005), ("python", 0.005), ("python", 0.0005))]
REPEAT = 10


def decode(conn) -> None:
    torch.cuda.set_device("cuda:1")
    S.CHUNK_BYTES = 5 * LAYOUT.block_bytes
    transport = NcclTransport(KVPool(LAYOUT, NUM_BLOCKS, "cuda:1"), "127.0.0.1", 60.0)
    conn.send(KVDescriptors(nccl=transport.descriptor()))
    while (msg := conn.recv()) is not None:
        case, request_id, dst, stream = msg
        record = P.KVHandoff(request_id=request_id, src_worker_id="p0", first_token=0, num_tokens=1, transport="nccl",
                             dst_block_ids=dst, reply_to="", nccl=stream)
        main, interval = case[:2] if case else ("blocked", 0.005)
        sys.setswitchinterval(interval)
        t = time.perf_counter()
        pending = transport.receive(record, dst, [])
        if main == "blocked":
            pending.result(timeout=20)
        else:
            while not pending.done():
                sum(range(1000))
        conn.send(time.perf_counter() - t)
    transport.close()


def main() -> None:
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=decode, args=(child,), daemon=True)
    proc.start()
    S.CHUNK_BYTES = 5 * LAYOUT.block_bytes
    descriptor = conn.recv()
    sender = NcclTransport(source_pool("cuda:0"), "127.0.0.1", 60.0)
    rng = random.Random(0)
    n = 0
    for case in [None, *CASES]:  # the first opens the link
        times = []
        for _ in range(REPEAT if case else 1):
            s, d = ids_for(case[2] if case else "run", rng)
            n += 1
            sent = sender.send(f"r{n}", "d0", descriptor, s, d)
            conn.send((case, f"r{n}", d, sent.nccl))
            times.append(conn.recv() * 1e3)
            sent.done.result(timeout=20)
        if case:
            print(f"{case[2]:9s} main {case[0]:7s} switch {case[1] * 1e3:.1f} ms: resolved after p50 "
                  f"{statistics.median(times):.2f} ms, max {max(times):.2f}", flush=True)
    conn.send(None)
    proc.join(30)
    sender.close()


if __name__ == "__main__":
    main()
