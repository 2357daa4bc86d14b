"""KV handoffs timed through the real transports (kvtransfer/), from `send` until the blocks are in the decode
side's pool, the `kv_handoff` record's trip included: `host` always, `cuda_ipc` with a GPU, `nccl` with two.

The pools have the engine's KV layout (one rank's, under tensor parallelism) and the block ids are scattered, as
they are in a pool that has served a while; each transport cuts them its own default way (`auto`). `host` and
`cuda_ipc` run both sides in this process, the record going through a real data channel (ZMQ over loopback TCP);
`nccl` needs a second process on a second GPU (scripts/bench_transfer.py's peer).
"""
from __future__ import annotations

import random
import statistics
from collections.abc import Callable

import torch
import zmq

from common import protocol as P
from common.engine.kv_pool import KVPool
from common.protocol import KVDescriptors, KVLayout
from kvtransfer.channel import DataChannel
from kvtransfer.endpoint import make_transport
from scripts.planner.points import HandoffPoint
from scripts.planner.measure.steps import device_now

TIMEOUT = 120.0


def handoff_sizes(tokens: tuple[int, ...], max_len: int) -> list[int]:
    """The grid's prompt sizes that the model holds; for a short model, shares of its length."""
    sizes = sorted({t for t in tokens if t <= max_len})
    return sizes if len(sizes) >= 2 else sorted({max(1, max_len // 8), max(1, max_len // 2), max_len})


def transports(device: torch.device) -> tuple[list[tuple[str, str]], list[str]]:
    """(transport, the decode side's device) to measure on this machine, and why the others are not."""
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    peer = "cuda:1" if gpus >= 2 else str(device)
    found, skipped = [("host", peer)], []
    if gpus:
        found.append(("cuda_ipc", peer))
    else:
        skipped.append("cuda_ipc: needs a GPU")
    if gpus >= 2:
        found.append(("nccl", "cuda:1"))
    else:
        skipped.append("nccl: needs 2 GPUs (one for each side)" + ("; on a CPU the host transport is used" if not
                                                                   gpus else ""))
    return found, skipped


def measure_handoffs(layout: KVLayout, device: torch.device, sizes: list[int], reps: int,
                     progress: Callable[[str], None], scale: float = 1.0
                     ) -> tuple[dict[str, list[HandoffPoint]], list[str]]:
    """Points per transport; `scale` multiplies the bytes moved into the bytes a point stands for (the whole
    model's KV, when one rank's shard was moved)."""
    found, skipped = transports(device)
    per_block = layout.block_bytes
    num_blocks = -(-max(sizes) * 5 // 4 // layout.block_size) + 1  # room to scatter the largest handoff
    src = KVPool(layout, num_blocks, device)
    src.kv.normal_()
    results: dict[str, list[HandoffPoint]] = {}
    rng = random.Random(0)
    try:
        for name, peer_device in found:
            timer = NcclTimer(src, layout, num_blocks) if name == "nccl" else LocalTimer(name, src, layout, num_blocks,
                                                                                        torch.device(peer_device))
            try:
                points = []
                for tokens in sizes:
                    n = -(-tokens // layout.block_size)
                    src_ids, dst_ids = rng.sample(range(num_blocks), n), rng.sample(range(num_blocks), n)
                    times = [timer.time(src_ids, dst_ids) for _ in range(reps + 1)][1:]  # the first is untimed
                    points.append(HandoffPoint(round(n * per_block * scale), statistics.median(times)))
                    progress(f"handoff {name:<8} {tokens:>6} tokens ({points[-1].num_bytes / 1e6:8.1f} MB): "
                             f"{points[-1].seconds * 1e3:9.3f} ms")
                results[name] = points
            finally:
                timer.close()
    finally:
        del src
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results, skipped


class LocalTimer:
    """Both sides in this process: a sender and a receiver transport, and one data channel to its own inbox."""

    def __init__(self, name: str, src: KVPool, layout: KVLayout, num_blocks: int, peer_device: torch.device):
        self.devices = [src.kv.device, peer_device]
        self.dst = KVPool(layout, num_blocks, peer_device)
        self.sender = make_transport(name, src, timeout=TIMEOUT)
        self.receiver = make_transport(name, self.dst, timeout=TIMEOUT)
        descriptor = self.receiver.descriptor()
        self.descriptors = KVDescriptors(**({name: descriptor} if descriptor is not None else {}))
        self.channel = DataChannel(zmq.Context.instance())
        self.count = 0

    def time(self, src_ids: list[int], dst_ids: list[int]) -> float:
        self.count += 1
        rid = f"profile-h{self.count}"
        start = device_now(self.devices[0])
        sent = self.sender.send(rid, "d0", self.descriptors, src_ids, dst_ids)
        record = P.KVHandoff(request_id=rid, src_worker_id="p0", first_token=0, num_tokens=1,
                             transport=self.sender.name, dst_block_ids=dst_ids, reply_to="", nccl=sent.nccl)
        self.channel.send(self.channel.address, record, sent.payload)
        msg, frames = self.channel.recv()
        pending = self.receiver.receive(msg, msg.dst_block_ids, frames)
        if pending is not None:
            pending.result(timeout=TIMEOUT)
        if sent.done is not None:
            sent.done.result(timeout=TIMEOUT)
        for d in self.devices:
            device_now(d)
        return device_now(self.devices[1]) - start

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()
        self.channel.close()
        del self.dst


class NcclTimer:
    """The decode side in a process of its own on the second GPU (NCCL connects no two ranks of one device)."""

    def __init__(self, src: KVPool, layout: KVLayout, num_blocks: int):
        from scripts.bench_transfer import Peer  # spawns a process: loaded only with two GPUs

        self.peer = Peer("nccl", "cuda:1")
        self.descriptors = self.peer.ask("setup", layout, num_blocks)
        self.sender = make_transport("nccl", src, timeout=TIMEOUT)

    def time(self, src_ids: list[int], dst_ids: list[int]) -> float:
        from scripts.bench_transfer import time_transfer

        return time_transfer(self.sender, self.peer, self.descriptors, src_ids, dst_ids, iters=1, warmup=0) / 1e3

    def close(self) -> None:
        self.sender.close()
        self.peer.close()
