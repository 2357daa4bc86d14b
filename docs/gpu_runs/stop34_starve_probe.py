"""Stop 34 (issue 21's knee): does a long prefill step starve a KV send over NCCL? Two processes, one GPU each, a
two-rank ProcessGroupNCCL as kvtransfer/nccl/link.py builds it (normal or high-priority NCCL stream). Rank 0 queues a
long run of big GEMMs on its compute stream (a long prompt's step), then posts a 4 MiB send from another stream
(a short prompt's KV); rank 1 has its receive posted. Prints how long the send took to complete against how long
the GEMMs ran, per stream priority.

    python docs/gpu_runs/stop34_starve_probe.py
"""
import os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def group(store, rank, high):
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = high
    options._timeout = timedelta(seconds=60)
    return dist.ProcessGroupNCCL(store, rank, 2, options)


def main(rank, port):
    torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    buf = torch.ones(4 << 20, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    for i, high in enumerate((False, True, False, True)):
        pg = group(dist.PrefixStore(f"g{i}", store), rank, high)
        for _ in range(3):  # the communicator up and warm
            (pg.send if rank == 0 else pg.recv)([buf], 1 - rank, 0).wait()
        torch.cuda.synchronize()
        store.set(f"ready{i}-{rank}", "1"); store.wait([f"ready{i}-{1 - rank}"])
        if rank == 1:
            w = pg.recv([buf], 0, 0)
            w.wait()
            torch.cuda.synchronize()
        else:
            for _ in range(3):
                a @ a
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True); end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(200):
                a @ a
            end.record()
            time.sleep(0.005)  # the step is under way
            t0 = time.perf_counter()
            with torch.cuda.stream(side):
                w = pg.send([buf], 1, 0)
            while not w.is_completed():
                time.sleep(20e-6)
            sent = time.perf_counter() - t0
            end.synchronize()
            print(f"{torch.cuda.get_device_name()}: NCCL stream {'high' if high else 'normal'} priority: 4 MiB send "
                  f"completed {sent * 1e3:.1f} ms after posting, under a run of GEMMs of {start.elapsed_time(end):.1f} ms",
                  flush=True)
        store.set(f"done{i}-{rank}", "1"); store.wait([f"done{i}-{1 - rank}"])
        pg.shutdown()


if __name__ == "__main__":
    mp.spawn(main, args=(29555,), nprocs=2)
