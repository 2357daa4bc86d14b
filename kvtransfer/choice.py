"""Which KV transport connects a prefill worker to a decode worker, decided from their hellos. Tensor-free: the
router and the launcher decide with it."""
from __future__ import annotations

from kvtransfer.descriptors import TransferError, unpack, unpack_descriptors


TRANSPORT_NAMES = ("cuda_ipc", "nccl", "host")


def cuda_ipc_pair_problem(prefill: dict | None, decode: dict | None) -> str | None:
    """Why a prefill worker cannot write into a decode worker's pool by CUDA IPC (None: it can).
    Arguments are the workers' unpacked cuda_ipc descriptors."""
    if not prefill or not decode:
        return "a worker published no cuda_ipc descriptor (not on CUDA)"
    if decode.get("gpu") not in prefill.get("visible", []):
        return (f"the decode worker's GPU ({decode.get('gpu')}) is not visible to the prefill worker: "
                "give both workers one GPU (e.g. --gpus-per-worker 0.5), let workers see their node's GPUs "
                "(--gpu-visibility node) or use nccl")
    return None


def nccl_pair_problem(prefill: dict | None, decode: dict | None) -> str | None:
    """Why these workers cannot pair over this transport (None: they can); arguments are their
    unpacked nccl descriptors."""
    if not prefill or not decode:
        return "a worker published no nccl descriptor"
    if prefill.get("backend") != decode.get("backend"):
        return f"the prefill worker runs {prefill.get('backend')}, the decode worker {decode.get('backend')}"
    if decode.get("backend") == "nccl" and decode.get("gpu") and decode.get("gpu") == prefill.get("gpu"):
        return "both workers are on one GPU, and NCCL cannot connect two ranks on one device: use cuda_ipc"
    return None


_PAIR_PROBLEM = {"cuda_ipc": cuda_ipc_pair_problem, "nccl": nccl_pair_problem}


def available_transports(device: str, wanted: str = "auto") -> list[str]:
    """The transports a worker on `device` offers, best first. `wanted` (a --kv-transport value) adds one
    that is not offered by default (nccl on CPU, which runs on gloo), or fails fast if it cannot work here."""
    names = ["cuda_ipc", "nccl", "host"] if device == "cuda" else ["host"]
    if wanted == "auto" or wanted in names:
        return names
    if wanted not in TRANSPORT_NAMES:
        raise TransferError(f"unknown KV transport {wanted!r} (have: auto, {', '.join(TRANSPORT_NAMES)})")
    if wanted == "cuda_ipc":
        raise TransferError(f"the cuda_ipc KV transport needs CUDA workers; these run on {device}")
    return [*names, wanted]


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
