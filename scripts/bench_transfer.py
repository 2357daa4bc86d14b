"""Benchmark KV-cache transfer between a prefill process and a decode process (a few minutes on two GPUs).

    python -m scripts.bench_transfer [--prefill-ms 40 150 700] [--iters 10]

For each model's KV shape (Qwen3-0.6B, Qwen3-8B), block size and prompt length, the median time to move
one prompt's blocks from this process's pool into blocks of a peer process's pool, through the real
transports: cuda_ipc with the peer on the same GPU and on a second GPU, nccl with the peer on a second
GPU. The peers are spawned processes (no Ray). Figures are payload bytes per second, beside the device's
own copy rate (payload bytes per second of a 1 GiB copy_ on one GPU, and from GPU 0 to GPU 1).

Block ids are either consecutive on both sides (one run: plain copies or direct sends) or shuffled over
a pool twice the prompt's size; shuffled transfers are timed each way a transport can cut them: `runs`
(one copy or message per run of consecutive ids, no gather), for nccl `gather` (chunks of up to 64 MiB,
gathered and scattered), for cuda_ipc `kernel` (one block-copy kernel for every block). `auto` picks
runs for up to 16 runs, the other way beyond: these rows are what that threshold is chosen from. An nccl
time includes one pipe round trip to the peer (about the cost of the
`kv_handoff` record it stands for).

With --prefill-ms (one value, or one per --tokens), the last column is what the transfer adds to TTFT
relative to that prefill time.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import sys
import time

import torch

from common import protocol as P
from common.engine.kv_pool import KVPool
from common.protocol import KVDescriptors, KVLayout
from kvtransfer import cuda_ipc
from kvtransfer.cuda_ipc import CudaIPCTransport
from kvtransfer.nccl.transport import NcclTransport
from kvtransfer.segments import joint_runs, plan_segments
from scripts.bench_gpu import copy_bandwidth, cuda_kernels, device_summary, log, require_gpus
from scripts.model_prep import resolve_config

MODELS = ("qwen3-0.6b", "qwen3-8b")
TRANSPORTS = {"cuda_ipc": CudaIPCTransport, "nccl": NcclTransport}
STRATEGIES = {"cuda_ipc": cuda_ipc.STRATEGIES, "nccl": ("auto", "runs", "gather")}
SOURCE = "cuda:0"  # the prefill side: this process
# (label, transport, peer device); the 2-GPU ones are skipped on one GPU
CASES = (("cuda_ipc/1gpu", "cuda_ipc", "cuda:0"), ("cuda_ipc/2gpu", "cuda_ipc", "cuda:1"),
         ("nccl/2gpu", "nccl", "cuda:1"))
TIMEOUT = 300.0


def kv_layout(model: str, block_size: int) -> KVLayout:
    _, c = resolve_config(model)
    return KVLayout(num_layers=c["num_hidden_layers"], block_size=block_size, num_kv_heads=c["num_key_value_heads"],
                    head_dim=c["head_dim"], dtype="bfloat16")


# ---- the decode side ----------------------------------------------------------------------------------

def peer_main(kind: str, device: str, conn) -> None:
    """A decode-side process: ("setup", layout, num_blocks) -> a fresh pool and its descriptors;
    ("receive", kv_handoff record, payload frames) -> lands the blocks and answers "ok"; None -> exit."""
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    transport = pool = None
    while (msg := conn.recv()) is not None:
        try:
            if msg[0] == "setup":
                if transport is not None:
                    transport.close()
                transport = pool = None
                torch.cuda.empty_cache()
                layout, num_blocks = msg[1], msg[2]
                pool = KVPool(layout, num_blocks, device)
                transport = TRANSPORTS[kind](pool, "127.0.0.1", TIMEOUT)
                conn.send(KVDescriptors(**{kind: transport.descriptor()}))
            else:
                _, record, frames = msg
                pending = transport.receive(record, record.dst_block_ids, frames)
                if pending is not None:
                    pending.result(timeout=TIMEOUT)
                conn.send("ok")
        except Exception as e:
            conn.send(f"error: {type(e).__name__}: {e}")
    if transport is not None:
        transport.close()


class Peer:
    def __init__(self, kind: str, device: str):
        ctx = mp.get_context("spawn")
        self.kind = kind
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=peer_main, args=(kind, device, child), daemon=True)
        self.proc.start()

    def ask(self, *msg):
        self.conn.send(msg)
        if not self.conn.poll(TIMEOUT):
            raise RuntimeError(f"the {self.kind} peer did not answer in {TIMEOUT:.0f} s")
        reply = self.conn.recv()
        if isinstance(reply, str) and reply.startswith("error"):
            raise RuntimeError(f"{self.kind} peer: {reply}")
        return reply

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()


# ---- measurements -------------------------------------------------------------------------------------

def operations(kind: str, strategy: str, src_ids: list[int], dst_ids: list[int], block_bytes: int) -> int:
    """Copies, kernels or messages one handoff takes."""
    if kind == "nccl":
        return len(plan_segments(src_ids, dst_ids, block_bytes, strategy))
    runs = len(joint_runs(src_ids, dst_ids))
    return runs if strategy == "runs" or (strategy == "auto" and runs <= cuda_ipc.MAX_COPY_RUNS) else 1


def time_transfer(sender, peer: Peer, descriptors: KVDescriptors, src_ids: list[int], dst_ids: list[int],
                  iters: int, warmup: int) -> float:
    """Median ms of one handoff, from `send` until the blocks are in the peer's pool."""
    times = []
    for i in range(warmup + iters):
        request_id = f"bench-{i}"
        start = time.perf_counter()
        sent = sender.send(request_id, "d0", descriptors, src_ids, dst_ids)
        if sent.done is not None:  # streaming: the peer receives, then both sides are done
            record = P.KVHandoff(request_id=request_id, src_worker_id="p0", first_token=0, num_tokens=1,
                                 transport=sender.name, dst_block_ids=dst_ids, reply_to="", nccl=sent.nccl)
            peer.ask("receive", record, [bytes(f) for f in sent.payload])
            sent.done.result(timeout=TIMEOUT)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def profile_transfer(sender, peer: Peer, descriptor: KVDescriptors, src_ids: list[int], dst_ids: list[int]) -> None:
    """One more handoff under torch.profiler (CUDA activity): which copies and kernels it ran, and for how long."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        time_transfer(sender, peer, descriptor, src_ids, dst_ids, iters=1, warmup=0)
    for e in cuda_kernels(prof)[:5]:
        log(f"      {e.key[:70]:<72}{e.count:>5}x {e.self_device_time_total / 1e3:>9.3f} ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_transfer", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--tokens", nargs="+", type=int, default=[1024, 4096, 16384])
    p.add_argument("--block-sizes", nargs="+", type=int, default=[16, 256])
    p.add_argument("--ids", nargs="+", default=["contiguous", "shuffled"], choices=["contiguous", "shuffled"])
    p.add_argument("--strategies", nargs="+", default=["runs", "gather", "kernel"],
                   choices=["auto", "runs", "gather", "kernel"],
                   help="how shuffled transfers are cut, where the transport has that way (consecutive ids are "
                        "always one run)")
    p.add_argument("--transports", nargs="+", default=[c[0] for c in CASES], choices=[c[0] for c in CASES])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="after each row, the CUDA work of one handoff")
    p.add_argument("--prefill-ms", nargs="+", type=float, default=None,
                   help="prefill time of each prompt length (one value for all): adds a +TTFT column")
    args = p.parse_args(argv)
    require_gpus("bench_transfer", why=" (it measures GPU-to-GPU KV transfers, cuda_ipc and nccl; the host "
                 "transport is what a CPU cluster uses)")
    prefill_ms = args.prefill_ms
    if prefill_ms is not None and len(prefill_ms) not in (1, len(args.tokens)):
        p.error(f"--prefill-ms: give one value or one per --tokens ({len(args.tokens)})")
    gpus = torch.cuda.device_count()
    cases = [c for c in CASES if c[0] in args.transports and (gpus >= 2 or c[2] == SOURCE)]
    skipped = [c[0] for c in CASES if c[0] in args.transports and c not in cases]

    log(device_summary())
    copy_gbs = {SOURCE: copy_bandwidth(SOURCE, SOURCE)}
    line = f"device copy (payload bytes/s, 1 GiB): {copy_gbs[SOURCE]:.0f} GB/s on GPU 0"
    if gpus >= 2:
        copy_gbs["cuda:1"] = copy_bandwidth(SOURCE, "cuda:1")
        line += f", {copy_gbs['cuda:1']:.0f} GB/s GPU 0 -> GPU 1"
    log(line)
    if skipped:
        log(f"skipped (one GPU): {', '.join(skipped)}")

    header = (f"{'model':<11} {'block':>5} {'tokens':>6} {'MB':>7} {'transport':<16} {'ids':<10} {'plan':<6} "
              f"{'ops':>5} {'ms':>8} {'GB/s':>7} {'%copy':>6}")
    if prefill_ms is not None:
        header += f" {'+TTFT':>7}"
    log("\n" + header)
    peers = {label: Peer(kind, device) for label, kind, device in cases}
    rng = random.Random(0)
    try:
        for model in args.models:
            for block_size in args.block_sizes:
                layout = kv_layout(model, block_size)
                num_blocks = 2 * -(-max(args.tokens) // block_size) + 1
                src = KVPool(layout, num_blocks, SOURCE)
                src.kv.normal_()
                torch.cuda.synchronize()  # a transport's send expects its source blocks written
                for label, kind, device in cases:
                    peer = peers[label]
                    descriptor = peer.ask("setup", layout, num_blocks)
                    sender = TRANSPORTS[kind](src, "127.0.0.1", TIMEOUT)
                    for t, tokens in enumerate(args.tokens):
                        n = -(-tokens // block_size)
                        for ids in args.ids:
                            if ids == "contiguous":
                                plans = [("auto", list(range(n)), list(range(n, 2 * n)))]
                            else:
                                src_ids, dst_ids = rng.sample(range(num_blocks), n), rng.sample(range(num_blocks), n)
                                plans = [(s, src_ids, dst_ids) for s in args.strategies if s in STRATEGIES[kind]]
                            for strategy, src_ids, dst_ids in plans:
                                sender.strategy = strategy
                                ops = operations(kind, strategy, src_ids, dst_ids, layout.block_bytes)
                                ms = time_transfer(sender, peer, descriptor, src_ids, dst_ids, args.iters, args.warmup)
                                nbytes = n * layout.block_bytes
                                gbs = nbytes / ms / 1e6
                                row = (f"{model:<11} {block_size:>5} {tokens:>6} {nbytes / 1e6:>7.1f} {label:<16} "
                                       f"{ids:<10} {strategy:<6} {ops:>5} {ms:>8.3f} {gbs:>7.1f} "
                                       f"{100 * gbs / copy_gbs[device]:>5.0f}%")
                                if prefill_ms is not None:
                                    base = prefill_ms[t] if len(prefill_ms) > 1 else prefill_ms[0]
                                    row += f" {100 * ms / base:>6.1f}%"
                                log(row)
                                if args.profile:
                                    profile_transfer(sender, peer, descriptor, src_ids, dst_ids)
                    sender.close()
                del src
                if SOURCE.startswith("cuda"):
                    torch.cuda.empty_cache()
    finally:
        for peer in peers.values():
            peer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
