"""KV-cache transfer between workers: one interface (`Transport`), several transports."""
from __future__ import annotations

from common.kv_pool import KVPool
from kvtransfer.channel import DataChannel
from kvtransfer.host import HostTransport
from kvtransfer.transport import TransferError, Transport

TRANSPORTS: dict[str, type[Transport]] = {"host": HostTransport}


def available_transports(device: str) -> list[str]:
    names = ["host"]
    if device == "cuda":
        names[:0] = [n for n in ("cuda_ipc", "nccl") if n in TRANSPORTS]
    return names


def make_transport(name: str, pool: KVPool) -> Transport:
    if name not in TRANSPORTS:
        raise TransferError(f"unknown KV transport {name!r} (have: {', '.join(TRANSPORTS)})")
    return TRANSPORTS[name](pool)


def choose_transport(prefill: dict, decode: dict, forced: str = "auto") -> str:
    """Per pair: CUDA IPC on one node, NCCL across GPUs of different nodes, host/TCP otherwise.

    `prefill`/`decode` are {"transports": [...], "node_id": str}. `forced` names one transport.
    """
    common = [t for t in prefill["transports"] if t in decode["transports"]]
    if forced != "auto":
        if forced not in common:
            raise TransferError(f"kv transport {forced!r} is not available to both workers (they share {common})")
        return forced
    same_node = prefill["node_id"] == decode["node_id"]
    for name in (("cuda_ipc", "nccl") if same_node else ("nccl",)):
        if name in common:
            return name
    return "host"


__all__ = ["DataChannel", "HostTransport", "TransferError", "Transport", "TRANSPORTS", "available_transports",
           "make_transport", "choose_transport"]
