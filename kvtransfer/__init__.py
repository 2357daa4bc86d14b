"""KV-cache transfer between workers: one interface (`Transport`), several transports, and the choice
of one per prefill-decode pair."""
from __future__ import annotations

from common.kv_pool import KVPool
from kvtransfer import cuda_ipc, nccl
from kvtransfer.channel import DataChannel
from kvtransfer.cuda_ipc import CudaIPCTransport
from kvtransfer.host import HostTransport
from kvtransfer.nccl import NcclTransport
from kvtransfer.transport import Sent, TransferError, Transport, pack, unpack

TRANSPORTS: dict[str, type[Transport]] = {"cuda_ipc": CudaIPCTransport, "nccl": NcclTransport, "host": HostTransport}
_PAIR_PROBLEM = {"cuda_ipc": cuda_ipc.pair_problem, "nccl": nccl.pair_problem}


def available_transports(device: str, wanted: str = "auto") -> list[str]:
    """The transports a worker on `device` offers, best first. `wanted` (a --kv-transport value) adds one
    that is not offered by default (nccl on CPU, which runs on gloo), or fails fast if it cannot work here."""
    names = ["cuda_ipc", "nccl", "host"] if device == "cuda" else ["host"]
    if wanted == "auto" or wanted in names:
        return names
    if wanted not in TRANSPORTS:
        raise TransferError(f"unknown KV transport {wanted!r} (have: auto, {', '.join(TRANSPORTS)})")
    if wanted == "cuda_ipc":
        raise TransferError(f"the cuda_ipc KV transport needs CUDA workers; these run on {device}")
    return [*names, wanted]


def make_transport(name: str, pool: KVPool, host: str = "127.0.0.1", timeout: float = 60.0) -> Transport:
    if name not in TRANSPORTS:
        raise TransferError(f"unknown KV transport {name!r} (have: {', '.join(TRANSPORTS)})")
    return TRANSPORTS[name](pool, host, timeout)


def pack_descriptors(descriptors: dict[str, bytes]) -> bytes:
    """All of a worker's transport descriptors, as its hello's `kv_descriptor`: {name: bytes} in msgpack."""
    return pack({k: v for k, v in descriptors.items() if v})


def unpack_descriptors(blob: bytes) -> dict[str, bytes]:
    return unpack(blob, "kv_descriptor") if blob else {}


def peer_info(hello) -> dict:
    """What `choose_transport` needs from a worker's hello."""
    return {"worker_id": hello.worker_id, "transports": list(hello.transports), "node_id": hello.node_id,
            "kv_descriptor": hello.kv_descriptor}


def pair_problem(name: str, prefill: dict, decode: dict) -> str | None:
    """Why transport `name` cannot connect these workers (None: it can, as far as their hellos tell)."""
    if name not in prefill["transports"] or name not in decode["transports"]:
        return f"not offered by both workers (prefill: {prefill['transports']}, decode: {decode['transports']})"
    check = _PAIR_PROBLEM.get(name)
    if check is None or "kv_descriptor" not in prefill or "kv_descriptor" not in decode:
        return None
    try:
        mine, theirs = (unpack_descriptors(p["kv_descriptor"]).get(name, b"") for p in (prefill, decode))
        return check(unpack(mine, name) if mine else None, unpack(theirs, name) if theirs else None)
    except TransferError as e:
        return str(e)


def choose_transport(prefill: dict, decode: dict, forced: str = "auto") -> str:
    """Per pair: CUDA IPC on one node when the prefill worker can see the decode worker's GPU, NCCL
    between CUDA workers otherwise (across GPUs or nodes), host/TCP else. `forced` names one transport;
    raises TransferError, saying why, when it cannot connect these two.

    `prefill`/`decode` are `peer_info(hello)`: {"transports": [...], "node_id": str, "kv_descriptor": bytes}.
    """
    if forced != "auto":
        problem = pair_problem(forced, prefill, decode)
        if problem:
            names = f"{prefill.get('worker_id', 'prefill')} -> {decode.get('worker_id', 'decode')}"
            raise TransferError(f"kv transport {forced!r} cannot connect {names}: {problem}")
        return forced
    if prefill["node_id"] == decode["node_id"] and pair_problem("cuda_ipc", prefill, decode) is None:
        return "cuda_ipc"
    if pair_problem("nccl", prefill, decode) is None and _backend(prefill) == _backend(decode) == "nccl":
        return "nccl"
    return "host"


def _backend(peer: dict) -> str | None:
    """The backend of a worker's nccl transport (gloo on CPU: never chosen unless asked for)."""
    if "kv_descriptor" not in peer:
        return "nccl"  # no descriptors to tell: trust the transports list
    blob = unpack_descriptors(peer["kv_descriptor"]).get("nccl")
    return unpack(blob, "nccl").get("backend") if blob else None


__all__ = ["CudaIPCTransport", "DataChannel", "HostTransport", "NcclTransport", "Sent", "TransferError", "Transport",
           "TRANSPORTS", "available_transports", "make_transport", "pack_descriptors", "unpack_descriptors",
           "peer_info", "pair_problem", "choose_transport"]
