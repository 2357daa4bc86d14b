"""A worker's side of the KV data plane: its inbox (the data channel), its transports, and the descriptors of its
pool that it publishes in its hello."""
from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

import zmq

from common.engine.kv_pool import KVPool
from common.protocol import KVDescriptors
from kvtransfer.channel import DataChannel
from kvtransfer.choice import available_transports
from kvtransfer.errors import TransferError
from kvtransfer.transport import Transport

log = logging.getLogger(__name__)

# name -> (module, class): a transport's module loads only where it is made (cuda_ipc never on a CPU worker).
TRANSPORTS = {"cuda_ipc": ("kvtransfer.cuda_ipc", "CudaIPCTransport"), "nccl": ("kvtransfer.nccl.transport",
              "NcclTransport"), "host": ("kvtransfer.host", "HostTransport")}


def make_transport(name: str, pool: KVPool, host: str = "127.0.0.1", timeout: float = 60.0) -> Transport:
    if name not in TRANSPORTS:
        raise TransferError(f"unknown KV transport {name!r} (have: {', '.join(TRANSPORTS)})")
    module, cls = TRANSPORTS[name]
    return getattr(importlib.import_module(module), cls)(pool, host, timeout)


class KVEndpoint:
    """`names`: the transports asked for by name (each must work: fail fast), or empty for every one this
    device offers (those that cannot start here are left out, with a warning)."""

    def __init__(self, ctx: zmq.Context, pool: KVPool, device: str, names: list[str], host: str, timeout: float,
                 secure: Callable[[zmq.Socket, bool], None] | None = None):
        self.channel = DataChannel(ctx, host, secure)
        self.transports: dict[str, Transport] = {}
        for name in names or available_transports(device):
            try:
                self.transports[name] = make_transport(name, pool, host, timeout)
            except TransferError as e:
                if names:
                    self.close()
                    raise
                log.warning("KV transport %s is not available: %s", name, e)

    @property
    def address(self) -> str:
        return self.channel.address

    def descriptors(self) -> KVDescriptors:
        return KVDescriptors(**{name: d for name, t in self.transports.items() if (d := t.descriptor()) is not None})

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()
        self.channel.close()
