"""`pdcluster serve`'s cluster settings: how many workers of each role, where they go and what they get."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.config import ConfigError

ROLES = ("prefill", "decode", "colocated")


@dataclass
class ServeConfig:
    prefill_workers: int = field(default=1, metadata={"help": "prefill workers (disagg mode)"})
    decode_workers: int = field(default=1, metadata={"help": "decode workers (disagg mode)"})
    workers: int = field(default=1, metadata={"help": "engine replicas (colocated mode)"})
    gpus_per_worker: float = field(default=1.0, metadata={"help": "GPUs per worker (per TP rank); 0.5 puts two "
                                                                   "workers on one GPU"})
    ray_address: str | None = field(default=None, metadata={"help": "join this Ray cluster ('auto' for the "
                                                                     "local node's); default: start a local one"})
    prefill_gpu_memory_utilization: float | None = field(default=None, metadata={
        "help": "GPU memory share of each prefill worker (default: gpu_memory_utilization x gpus_per_worker)"})
    decode_gpu_memory_utilization: float | None = field(default=None, metadata={
        "help": "GPU memory share of each decode worker (default: gpu_memory_utilization x gpus_per_worker)"})
    startup_timeout: float = field(default=600.0, metadata={"help": "seconds to wait for every worker to load"})
    worker_restarts: int = field(default=3, metadata={"help": "times Ray restarts a worker process that died "
                                                                "(-1: always); it then rejoins the router"})
    handoff_timeout: float = field(default=60.0, metadata={"help": "seconds KV blocks stay held for a handoff "
                                                                   "before the request fails with `timeout`"})
    prefill_resource: str | None = field(default=None, metadata={
        "help": "Ray custom resource each prefill worker needs, NAME or NAME:AMOUNT (amount 1 by default), "
                "e.g. pd_prefill: places prefill workers on the nodes started with it (deploy/)"})
    decode_resource: str | None = field(default=None, metadata={
        "help": "Ray custom resource each decode worker needs, e.g. pd_decode"})
    worker_resource: str | None = field(default=None, metadata={
        "help": "Ray custom resource each colocated worker needs"})
    gpu_visibility: str = field(default="own", metadata={
        "help": "GPUs a worker process sees: 'own' (only its own, as Ray sets it: KV goes over NCCL across GPUs) "
                "or 'node' (its own first, then the rest of its node's: CUDA IPC reaches a decode worker on another "
                "GPU; faster for contiguous blocks, slower for scattered 16-token blocks, see docs/benchmarks.md)"})
    timeline_dir: str | None = field(default=None, metadata={
        "help": "write each worker's per-request events (received, launched, prefilled, KV sent and landed, "
                "finished) and its steps' times to DIR/<worker id>.jsonl; `python -m scripts.timeline DIR` says "
                "where the time went"})
    mps: bool = field(default=False, metadata={
        "help": "workers that share a GPU (--gpus-per-worker below 1) run as clients of a CUDA MPS server started "
                "for this run on this node, side by side instead of in turns, each within its --mps-shares"})
    mps_shares: str = field(default="decode=50", metadata={
        "help": "with --mps, the share of the SMs each role's workers may use, ROLE=PERCENT,... (others 100): a "
                "cap on decode keeps a prompt's kernels from holding the SMs its steps wait for. A capped worker "
                "checks its GEMMs first and refuses a share where cuBLAS gets them wrong (60-80 on an H200)"})

    def resources(self, role: str) -> dict[str, float]:
        """The custom resources one worker of `role` asks Ray for."""
        spec = {"prefill": self.prefill_resource, "decode": self.decode_resource,
                "colocated": self.worker_resource}[role]
        if not spec:
            return {}
        name, _, amount = spec.partition(":")
        try:
            value = float(amount) if amount else 1.0
        except ValueError:
            raise ConfigError(f"{role}_resource: {spec!r} is not NAME or NAME:AMOUNT") from None
        if not name or value <= 0:
            raise ConfigError(f"{role}_resource: {spec!r} is not NAME or NAME:AMOUNT with AMOUNT > 0")
        return {name: value}
