"""A worker's transports, made by name."""
from __future__ import annotations

from common.engine.kv_pool import KVPool
from kvtransfer.cuda_ipc import CudaIPCTransport
from kvtransfer.descriptors import TransferError
from kvtransfer.host import HostTransport
from kvtransfer.nccl import NcclTransport
from kvtransfer.transport import Transport

TRANSPORTS: dict[str, type[Transport]] = {"cuda_ipc": CudaIPCTransport, "nccl": NcclTransport, "host": HostTransport}


def make_transport(name: str, pool: KVPool, host: str = "127.0.0.1", timeout: float = 60.0) -> Transport:
    if name not in TRANSPORTS:
        raise TransferError(f"unknown KV transport {name!r} (have: {', '.join(TRANSPORTS)})")
    return TRANSPORTS[name](pool, host, timeout)
