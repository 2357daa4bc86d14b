"""What the GPU-to-GPU link of this host gives each way a KV transfer can use it (two GPUs, about a minute).

    python -m scripts.probe_links [--mb 512] [--nccl-env 'NCCL_MIN_P2P_NCHANNELS=16' ...]

Prints the topology, then payload GB/s of moving `--mb` MB from GPU 0 to GPU 1:
- `copy_`, one process seeing both GPUs (the link's ceiling for a plain copy);
- CUDA IPC between two processes: the sender pushes into the peer's IPC-mapped buffer, directly or
  through a staging buffer on the peer's GPU; or the receiver pulls from the sender's mapped buffer;
- NCCL between two processes (one GPU each, as Ray gives them): one send/recv, 64 MiB segments two in
  flight (the nccl transport's pattern), and a two-rank broadcast; once per `--nccl-env` setting
  (`default` is NCCL's own choice).
NCCL's own report of the channels and transport it chose is written to `--nccl-log` for the default run.
The one-process copies run first and turn on peer access both ways, so the IPC rows show the link with
it on (as `kvtransfer.cuda_ipc` does before mapping a peer's pool).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
from datetime import timedelta

import torch

from scripts.bench_gpu import copy_bandwidth, device_summary, log, median_seconds, require_gpus

SEGMENT = 64 << 20
BOTH = (0, 1)


# ---- CUDA IPC -------------------------------------------------------------------------------------

def ipc_peer(nbytes: int, conn) -> None:
    """GPU 1's process: exports a buffer, imports the sender's, and pulls from it on request."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    torch.cuda.set_device(1)
    buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    conn.send(reduce_tensor(buf)[1])
    args = conn.recv()
    src = rebuild_cuda_tensor(*args)  # the sender's buffer on GPU 0, mapped here
    while (msg := conn.recv()) is not None:
        if msg == "pull":
            seconds = median_seconds(lambda: buf.copy_(src, non_blocking=True), (src.device.index, 1))
            conn.send(seconds)
        elif msg == "checksum":
            torch.cuda.synchronize(1)
            conn.send(float(buf[:1 << 20].float().sum()))


def probe_ipc(nbytes: int) -> list[tuple[str, float]]:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=ipc_peer, args=(nbytes, child), daemon=True)
    proc.start()
    rows = []
    try:
        src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda:0")
        args = conn.recv()
        dst = rebuild_cuda_tensor(*args)  # the peer's buffer on GPU 1, mapped here
        conn.send(reduce_tensor(src)[1])
        log(f"ipc: peer buffer mapped on {dst.device}; can_device_access_peer(0, 1) = "
            f"{torch.cuda.can_device_access_peer(0, 1)}")
        rows.append(("ipc push: dst.copy_(src), current stream of GPU 0",
                     median_seconds(lambda: dst.copy_(src, non_blocking=True), BOTH)))
        s1 = torch.cuda.Stream(1)

        def push_on_dst_stream():
            with torch.cuda.stream(s1):
                dst.copy_(src, non_blocking=True)
        rows.append(("ipc push: dst.copy_(src) on a GPU 1 stream", median_seconds(push_on_dst_stream, BOTH)))
        stage = torch.empty(SEGMENT, dtype=torch.uint8, device="cuda:1")

        def push_staged():
            for off in range(0, nbytes, SEGMENT):
                n = min(SEGMENT, nbytes - off)
                stage[:n].copy_(src[off:off + n], non_blocking=True)
                dst[off:off + n].copy_(stage[:n], non_blocking=True)
        rows.append(("ipc push, staged on GPU 1 (64 MiB)", median_seconds(push_staged, BOTH)))
        conn.send("checksum")
        ok = abs(conn.recv() - float(src[:1 << 20].float().sum())) < 1
        rows.append((f"  (peer sees the pushed bytes: {ok})", float("nan")))
        conn.send("pull")
        rows.append(("ipc pull: the peer copies from the sender's mapped buffer", conn.recv()))
    finally:
        conn.send(None)
        proc.join(30)
    return rows


# ---- NCCL -----------------------------------------------------------------------------------------

def nccl_rank(rank: int, port: int, nbytes: int, env: dict, conn) -> None:
    import torch.distributed as dist

    os.environ.update(env)
    torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60))
    group = dist.ProcessGroupNCCL(store, rank, 2, dist.ProcessGroupNCCL.Options())
    buf = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{rank}")
    if rank == 0:
        buf.random_(0, 255)
    peer = 1 - rank

    def one():
        (group.send if rank == 0 else group.recv)([buf], peer, 0).wait()

    def segments():
        pending = []
        for off in range(0, nbytes, SEGMENT):
            part = buf[off:off + SEGMENT]
            pending.append((group.send if rank == 0 else group.recv)([part], peer, 0))
            if len(pending) >= 2:
                pending.pop(0).wait()
        for w in pending:
            w.wait()

    opts = dist.BroadcastOptions()
    opts.rootRank = 0

    def broadcast():
        group.broadcast([buf], opts).wait()

    results = {}
    for name, fn in (("send/recv, one message", one), ("send/recv, 64 MiB segments", segments),
                     ("broadcast, two ranks", broadcast)):
        results[name] = median_seconds(fn, (rank,))
    conn.send(results)
    group.shutdown()


def probe_nccl(nbytes: int, env: dict, log_file: str | None) -> list[tuple[str, float]]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if log_file:
        env = {**env, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P,GRAPH,TUNING", "NCCL_DEBUG_FILE": log_file}
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=nccl_rank, args=(r, port, nbytes, env, pipes[r][1]), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    out = []
    for conn, _ in pipes:
        if not conn.poll(240):
            raise RuntimeError("an NCCL rank did not report in 240 s")
        out.append(conn.recv())
    for p in procs:
        p.join(30)
    # the sender's clock: it returns once its bytes are handed over; the receiver's once they landed
    return [(name, max(out[0][name], out[1][name])) for name in out[0]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="probe_links", description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--nccl-env", nargs="*", default=["default"],
                    help="NCCL settings to try, each 'default' or 'K=V,K=V'")
    ap.add_argument("--nccl-log", default=None, help="file for NCCL_DEBUG=INFO of the default run")
    ap.add_argument("--skip-ipc", action="store_true")
    args = ap.parse_args(argv)
    require_gpus("probe_links", 2)
    nbytes = args.mb << 20
    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True)
    log(topo.stdout or topo.stderr)
    log(f"{device_summary()}; {args.mb} MB per transfer")
    # seconds of one copy, from its payload rate
    rows = [(f"copy_ {name} (one process)", nbytes / (copy_bandwidth(src, dst, nbytes) * 1e9))
            for name, src, dst in (("within GPU 0", "cuda:0", "cuda:0"), ("GPU 0 -> GPU 1", "cuda:0", "cuda:1"),
                                   ("GPU 1 -> GPU 0", "cuda:1", "cuda:0"))]
    torch.cuda.empty_cache()
    if not args.skip_ipc:
        try:
            rows += probe_ipc(nbytes)
        except Exception as e:
            log(f"ipc probe failed: {type(e).__name__}: {e}")
    for setting in args.nccl_env:
        env = {} if setting == "default" else dict(kv.split("=", 1) for kv in setting.split(","))
        try:
            found = probe_nccl(nbytes, env, args.nccl_log if setting == "default" else None)
        except Exception as e:
            log(f"nccl probe ({setting}) failed: {type(e).__name__}: {e}")
            continue
        rows += [(f"nccl [{setting}] {name}", t) for name, t in found]
    log(f"\n{'path':<64}{'ms':>9}{'GB/s':>9}")
    for name, t in rows:
        log(f"{name:<64}{t * 1e3:>9.3f}{nbytes / t / 1e9:>9.1f}" if t == t else name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
