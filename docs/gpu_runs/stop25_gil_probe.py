"""Stop 25: how long a KV receive takes to resolve while the receiving process's main thread runs Python, against the
main thread blocked on it, on either device (stop 24's GPU-only probe, as run at stop 25, is in git at 1f48a66). `cuda`: nccl between two GPUs; `cpu`: gloo between
two processes (the same link code, except that gloo's `wait` blocks instead of polling). 23 blocks in segments of 5,
ids one run or scattered; the switch interval 5 ms (the default) or SWITCH seconds.
`python docs/gpu_runs/stop25_gil_probe.py cpu|cuda [REPEAT]`"""
from __future__ import annotations

import multiprocessing as mp
import os
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

SWITCH = float(os.environ.get("SWITCH", "0.0005"))
CASES = [(main, interval, ids) for ids in ("run", "scattered") for main, interval in
         (("blocked", 0.005), ("python", 0.005), ("python", SWITCH))]


def decode(conn, device: str) -> None:
    if device == "cuda":
        torch.cuda.set_device("cuda:1")
        device = "cuda:1"
    S.CHUNK_BYTES = 5 * LAYOUT.block_bytes
    transport = NcclTransport(KVPool(LAYOUT, NUM_BLOCKS, device), "127.0.0.1", 60.0)
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
            pending.result(timeout=60)
        else:
            while not pending.done():
                sum(range(1000))
        conn.send(time.perf_counter() - t)
    transport.close()


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=decode, args=(child, device), daemon=True)
    proc.start()
    S.CHUNK_BYTES = 5 * LAYOUT.block_bytes
    descriptor = conn.recv()
    sender = NcclTransport(source_pool("cuda:0" if device == "cuda" else "cpu"), "127.0.0.1", 60.0)
    rng = random.Random(0)
    n = 0
    for case in [None, *CASES]:  # the first opens the link
        times = []
        for _ in range(repeat if case else 1):
            s, d = ids_for(case[2] if case else "run", rng)
            n += 1
            sent = sender.send(f"r{n}", "d0", descriptor, s, d)
            conn.send((case, f"r{n}", d, sent.nccl))
            times.append(conn.recv() * 1e3)
            sent.done.result(timeout=60)
        if case:
            print(f"{case[2]:9s} main {case[0]:7s} switch {case[1] * 1e3:.1f} ms: resolved after p50 "
                  f"{statistics.median(times):.2f} ms, max {max(times):.2f}", flush=True)
    conn.send(None)
    proc.join(30)
    sender.close()


if __name__ == "__main__":
    main()
