"""Which KV transport connects a prefill worker to a decode worker, decided from their hellos. Tensor-free: the
router and the launcher decide with it."""
from __future__ import annotations

from common.protocol import TRANSPORT_NAMES, CudaIpcDescriptor, NcclDescriptor, WorkerHello
from kvtransfer.errors import TransferError


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


def cuda_ipc_pair_problem(prefill: CudaIpcDescriptor | None, decode: CudaIpcDescriptor | None) -> str | None:
    """Why a prefill worker cannot write into a decode worker's pool by CUDA IPC (None: it can)."""
    if prefill is None or decode is None:
        return "a worker published no cuda_ipc descriptor (not on CUDA)"
    if decode.gpu not in prefill.visible:
        return (f"the decode worker's GPU ({decode.gpu}) is not visible to the prefill worker: "
                "give both workers one GPU (e.g. --gpus-per-worker 0.5), let workers see their node's GPUs "
                "(--gpu-visibility node) or use nccl")
    return None


def nccl_pair_problem(backend: str, gpu: str, decode: NcclDescriptor | None) -> str | None:
    """Why a prefill worker running `backend` on GPU `gpu` ("" on CPU) cannot open an nccl link to this decode
    worker (None: it can)."""
    if decode is None:
        return "a worker published no nccl descriptor"
    if backend != decode.backend:
        return f"the prefill worker runs {backend}, the decode worker {decode.backend}"
    if decode.backend == "nccl" and decode.gpu and decode.gpu == gpu:
        return "both workers are on one GPU, and NCCL cannot connect two ranks on one device: use cuda_ipc"
    return None


def pair_problem(name: str, prefill: WorkerHello, decode: WorkerHello) -> str | None:
    """Why transport `name` cannot connect these workers (None: it can, as far as their hellos tell)."""
    if name not in prefill.transports or name not in decode.transports:
        return f"not offered by both workers (prefill: {prefill.transports}, decode: {decode.transports})"
    if name == "cuda_ipc":
        return cuda_ipc_pair_problem(prefill.kv.cuda_ipc, decode.kv.cuda_ipc)
    if name == "nccl":
        if prefill.kv.nccl is None:
            return "a worker published no nccl descriptor"
        return nccl_pair_problem(prefill.kv.nccl.backend, prefill.kv.nccl.gpu, decode.kv.nccl)
    return None


def choose_transport(prefill: WorkerHello, decode: WorkerHello, forced: str = "auto") -> str:
    """Per pair: CUDA IPC on one node when the prefill worker can see the decode worker's GPU, NCCL
    between CUDA workers otherwise (across GPUs or nodes), host/TCP else. `forced` names one transport;
    raises TransferError, saying why, when it cannot connect these two."""
    if forced != "auto":
        problem = pair_problem(forced, prefill, decode)
        if problem:
            raise TransferError(f"kv transport {forced!r} cannot connect {prefill.worker_id} -> {decode.worker_id}: "
                                f"{problem}")
        return forced
    if prefill.node_id == decode.node_id and pair_problem("cuda_ipc", prefill, decode) is None:
        return "cuda_ipc"
    if pair_problem("nccl", prefill, decode) is None and decode.kv.nccl.backend == "nccl":
        return "nccl"  # gloo (CPU) runs only when asked for: host is faster there
    return "host"
