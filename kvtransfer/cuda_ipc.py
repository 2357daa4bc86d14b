"""CUDA IPC: on one node, the prefill worker copies its blocks straight into the decode worker's pool.

The decode worker exports its KV pool once: the CUDA IPC handle of the pool's memory, in its typed descriptor
(docs/protocol.md; bytes and ints, no pickle). A prefill worker maps each peer's pool once and, for each
handoff, copies its blocks into the reserved block ids on a side stream: one copy per run of ids
consecutive on both sides, or one block-copy kernel when the runs are many (`copy`), then waits for
the copy before `send` returns. The `kv_handoff` record goes out only after that, so the decode worker
never reads incomplete KV and has nothing to do on receive but acknowledge.

The peer's pool must be on a GPU this process can see: two workers sharing one GPU, or workers that
see every GPU of the node (`pdcluster serve --gpu-visibility node`; by default Ray shows each actor only
its own GPUs, and pairs across GPUs use `nccl`).
"""
from __future__ import annotations

import os
import time
import weakref
from contextlib import nullcontext

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from common.engine.device import TORCH_DTYPES
from common.protocol import CudaIpcDescriptor, CudaIpcPool
from kvtransfer.errors import TransferError
from kvtransfer.segments import check_block_ids, joint_runs
from kvtransfer.transport import Sent, Transport

MAX_COPY_RUNS = 16  # more runs than this go through the block-copy kernel
STRATEGIES = ("auto", "runs", "kernel")
# A same-process peer (tests, benchmarks): a process cannot open its own IPC handle, so it uses the tensor.
_EXPORTED: weakref.WeakValueDictionary[bytes, torch.Tensor] = weakref.WeakValueDictionary()


def gpu_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def visible_gpus() -> list[str]:
    return [gpu_uuid(i) for i in range(torch.cuda.device_count())]


def export_tensor(t: torch.Tensor) -> CudaIpcPool:
    """Everything another process needs to map `t`'s memory: IPC handles as bytes, the rest ints."""
    _, args = reduce_tensor(t)
    (_, size, stride, offset, _, dtype, device, handle, storage_bytes, storage_offset_bytes, _,
     ref_counter_handle, ref_counter_offset, event_handle, event_sync_required) = args
    return CudaIpcPool(shape=list(size), stride=list(stride), offset=offset, dtype=str(dtype).removeprefix("torch."),
                       device=device, handle=handle, storage_bytes=storage_bytes,
                       storage_offset_bytes=storage_offset_bytes, ref_counter_handle=ref_counter_handle,
                       ref_counter_offset=ref_counter_offset, event_handle=event_handle,
                       event_sync_required=event_sync_required)


def import_tensor(share: CudaIpcPool, device_index: int) -> torch.Tensor:
    """Map an exported tensor; `device_index` is this process's index of the GPU it lives on."""
    return rebuild_cuda_tensor(
        torch.Tensor, torch.Size(share.shape), tuple(share.stride), share.offset, torch.UntypedStorage,
        TORCH_DTYPES[share.dtype], device_index, share.handle, share.storage_bytes, share.storage_offset_bytes,
        False, share.ref_counter_handle, share.ref_counter_offset, share.event_handle, share.event_sync_required)


def enable_peer_access(a: int, b: int) -> None:
    """Let GPUs a and b of this process reach each other's memory, before a peer's pool is mapped. torch turns
    peer access on lazily, one direction per first copy between two devices; a copy engine on GPU a writing
    into IPC-mapped memory on GPU b without it is staged through the host (measured: 36 GB/s instead of
    ~390 GB/s between two H200s)."""
    if a == b or not torch.cuda.can_device_access_peer(a, b):
        return
    for dst, src in ((a, b), (b, a)):
        torch.empty(1, device=f"cuda:{dst}").copy_(torch.empty(1, device=f"cuda:{src}"))


class CudaIPCTransport(Transport):
    name = "cuda_ipc"

    def __init__(self, pool, host="127.0.0.1", timeout=60.0, strategy: str = "auto"):
        super().__init__(pool, host, timeout)
        if pool.kv.device.type != "cuda":
            raise TransferError(f"the cuda_ipc KV transport needs a CUDA KV pool; this one is on "
                                f"{pool.kv.device.type} (use host, or nccl, which runs on gloo on CPU)")
        if strategy not in STRATEGIES:
            raise ValueError(f"cuda_ipc strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        self.strategy = strategy
        # peer id -> (its descriptor, its mapped pool, the block-copy kernel into it)
        self.peers: dict[str, tuple[CudaIpcDescriptor, torch.Tensor, object]] = {}
        self.streams: dict[torch.device, tuple[torch.cuda.Stream, torch.cuda.Event, torch.cuda.Event]] = {}
        self._ids = torch.empty(0, dtype=torch.int64)  # pinned block ids, read by the kernel in place
        self._descriptor: CudaIpcDescriptor | None = None

    def descriptor(self) -> CudaIpcDescriptor:
        if self._descriptor is None:
            kv = self.pool.kv
            share = export_tensor(kv)
            _EXPORTED[share.handle] = kv
            self._descriptor = CudaIpcDescriptor(pid=os.getpid(), gpu=gpu_uuid(kv.device.index),
                                                 visible=visible_gpus(), layout=self.pool.layout,
                                                 num_blocks=self.pool.num_blocks, pool=share)
        return self._descriptor

    # ---- prefill side -------------------------------------------------------------------------------
    def open(self, peer_id, peer):
        """The peer's pool mapped and the copy kernel loaded (compiled, on a cold cache) now, as the router has the
        pair meet: left to the first handoff, they were its request's time to first token. Nothing for the peer
        to join. What fails here is answered (`link_opened` with the reason), not raised through the worker's loop;
        the first handoff tries again."""
        try:
            self.peer_pool(peer_id, peer.cuda_ipc)
        except TransferError:
            raise
        except Exception as e:  # a kernel that does not compile, a CUDA error: this pair's handoffs fail the same
            raise TransferError(f"cannot set up cuda_ipc to {peer_id}: {type(e).__name__}: {e}") from e
        return None

    def send(self, request_id, peer_id, peer, src_block_ids, dst_block_ids):
        dst_kv = self.peer_pool(peer_id, peer.cuda_ipc)
        check_block_ids(src_block_ids, self.pool.num_blocks, "source")
        check_block_ids(dst_block_ids, dst_kv.shape[0], f"{peer_id}'s")
        if len(src_block_ids) != len(dst_block_ids):
            raise TransferError(f"{len(src_block_ids)} source blocks for {len(dst_block_ids)} destination blocks")
        waited, copy_gpu = self.copy(src_block_ids, dst_block_ids, dst_kv, peer_id)
        return Sent(waited=waited, copy_gpu=copy_gpu)

    def peer_pool(self, peer_id: str, d: CudaIpcDescriptor | None) -> torch.Tensor:
        """The peer's KV pool, mapped into this process on first use (and again if its descriptor changes)."""
        cached = self.peers.get(peer_id)
        if cached is not None and cached[0] == d:
            return cached[1]
        if d is None:
            raise TransferError(f"{peer_id} published no cuda_ipc descriptor")
        self.check_peer_layout(d.layout, peer_id)
        visible = visible_gpus()
        if d.gpu not in visible:
            raise TransferError(
                f"{peer_id}'s KV pool is on GPU {d.gpu}, which this process cannot see (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): put both workers on one GPU, start them with "
                f"--gpu-visibility node or use nccl")
        kv = _EXPORTED.get(d.pool.handle) if d.pid == os.getpid() else None
        enable_peer_access(self.pool.kv.device.index, visible.index(d.gpu))
        if kv is None:
            try:
                kv = import_tensor(d.pool, visible.index(d.gpu))
            except Exception as e:
                raise TransferError(f"cannot map {peer_id}'s KV pool by CUDA IPC: {e}") from e
        expected = (d.num_blocks, *self.pool.kv.shape[1:])
        if tuple(kv.shape) != expected or kv.dtype != self.pool.kv.dtype:
            raise TransferError(f"{peer_id}'s KV pool is {tuple(kv.shape)} {kv.dtype}, expected {expected} "
                                f"{self.pool.kv.dtype}")
        from kvtransfer.block_copy import BlockCopy  # triton: loaded once a GPU pool pair exists

        self.peers[peer_id] = (d, kv, BlockCopy(self.pool.kv, kv))
        return kv

    def copy(self, src_block_ids: list[int], dst_block_ids: list[int], dst_kv: torch.Tensor,
             peer_id: str) -> tuple[float, float]:
        """src blocks of this pool -> dst blocks of `dst_kv`, on a side stream; returns when the copy is done, with
        the seconds it waited for the copy and the copy's GPU time (a send that took long says which it was).

        Few runs of ids consecutive on both sides: one copy_ per run (copy engines, no SMs). Many: one
        block-copy kernel for all of them, on the destination's GPU, reading this pool over the link when
        the peer is on another GPU (one copy engine transfer per run took ~26 us a block there).

        The copy waits for nothing queued on this process's streams: the caller has seen the work that wrote
        the source blocks finish (the engine collected the step that prefilled them). Waiting on the compute
        stream would queue a handoff behind the next prefill, which overlap scheduling has already launched.
        Host time is part of every handoff (a torch call took 10-30 us on the GPU host's H100), hence the
        cached streams, events and kernel views, and block ids the kernel reads from pinned memory in place."""
        src_kv = self.pool.kv
        runs = None if self.strategy == "kernel" else joint_runs(
            src_block_ids, dst_block_ids, None if self.strategy == "runs" else MAX_COPY_RUNS)
        if runs is not None:
            stream, start, done = self._stream(src_kv.device)  # a cross-device copy_ runs on the source's stream
            remote, _, _ = self._stream(dst_kv.device)  # ... and orders the destination's current stream after it
            with torch.cuda.stream(stream), torch.cuda.stream(remote) if remote is not stream else nullcontext():
                start.record(stream)
                for off, n in runs:
                    s, d = src_block_ids[off], dst_block_ids[off]
                    dst_kv[d:d + n].copy_(src_kv[s:s + n], non_blocking=True)
        else:  # on the destination's GPU (see block_copy)
            stream, start, done = self._stream(dst_kv.device)
            with torch.cuda.stream(stream):
                start.record(stream)
                self.peers[peer_id][2](*self._pinned_ids(src_block_ids, dst_block_ids))
        done.record(stream)  # an event: stream.synchronize() took 20-80 us longer a handoff (H100, A/B)
        began = time.monotonic()
        done.synchronize()
        return time.monotonic() - began, start.elapsed_time(done) / 1e3

    def _stream(self, device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Event, torch.cuda.Event]:
        """The side stream on `device`, and the events each copy on it records at its start and end."""
        if device not in self.streams:
            self.streams[device] = (torch.cuda.Stream(device), torch.cuda.Event(enable_timing=True),
                                    torch.cuda.Event(enable_timing=True))
        return self.streams[device]

    def _pinned_ids(self, src: list[int], dst: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Both id lists in one pinned buffer the kernel reads over the bus, kept between handoffs: free again
        when `copy` returns, as each handoff waits for its kernel."""
        n = len(src)
        if self._ids.numel() < 2 * n:
            self._ids = torch.empty(max(2 * n, 2048), dtype=torch.int64, pin_memory=True)
        ids = self._ids.numpy()
        ids[:n], ids[n:2 * n] = src, dst
        return self._ids[:n], self._ids[n:2 * n]

    # ---- decode side: the prefill worker already wrote the blocks -----------------------------------
    def receive(self, record, dst_block_ids, frames):
        if frames:
            raise TransferError(f"cuda_ipc handoffs carry no payload frames, got {len(frames)}")
        return None

    def close(self) -> None:
        self.peers.clear()
