"""The Ray actor around one worker, as `pdcluster serve` places it (router/launcher.py): it shows the worker its GPUs,
builds it, says when it is ready and how long each part of its start took, and runs it until it stops."""
from __future__ import annotations

import logging
import os
import sys
import time

from common.config import ConfigError, EngineConfig
from common.startup import Startup
from common.worker.config import WorkerConfig

log = logging.getLogger(__name__)

WILDCARDS = ("0.0.0.0", "*", "::", "[::]")
# Set for the workers when they should see their node's GPUs: Ray then leaves CUDA_VISIBLE_DEVICES to us.
NOSET_CUDA_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def own_gpus_first(assigned: list[str], node_visible: str | None, node_gpus: int) -> str:
    """CUDA_VISIBLE_DEVICES for a worker that sees its node's GPUs: its own first, so that cuda:0 .. cuda:N-1
    are still the GPUs Ray gave it (the engine's ranks use cuda:rank), then the node's others."""
    node = [g.strip() for g in node_visible.split(",") if g.strip()] if node_visible else [
        str(i) for i in range(node_gpus)]
    return ",".join(assigned + [g for g in node if g not in assigned])


class WorkerActor:
    """The Ray actor around one worker. `run` blocks in the actor's main thread until the worker stops."""

    def __init__(self, role: str, config: WorkerConfig, engine_config: EngineConfig):
        import ray

        self.began = time.time()  # the launcher counts its wait for the actor's process up to here
        logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                            format=f"%(asctime)s %(levelname)s {config.worker_id}: %(message)s")
        config.node_id = ray.get_runtime_context().get_node_id()  # its Ray node's: pairs across nodes see it
        if config.host in WILDCARDS:  # peers on other nodes reach this worker on its node's address
            config.host = ray.util.get_node_ip_address()
        gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        if gpu_ids and os.environ.get(NOSET_CUDA_VISIBLE_DEVICES) == "1":
            see_node_gpus(gpu_ids)
        config.device_index = int(gpu_ids[0]) if gpu_ids else 0
        self.worker, self.refusal, self.startup = None, None, Startup()
        try:
            with self.startup.timed("imports"):
                cls = worker_class(role)
            start = time.monotonic()
            self.worker = cls(config, engine_config)
            self.startup.extend(self.worker.engine.startup)
            self.startup.add("worker", time.monotonic() - start - self.worker.engine.startup.seconds)
        except ConfigError as e:  # raised by `ready`: Ray keeps a task's exception, and logs no traceback for it
            self.refusal = e

    def ready(self) -> tuple[float, Startup]:
        """When this actor began (wall clock), and how long each part of its start took since."""
        if self.refusal is not None:
            raise self.refusal
        return self.began, self.startup

    def run(self) -> None:
        self.ready()
        self.worker.run()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()


def worker_class(role: str) -> type:
    """The worker of `role`, imported in the actor's process: the engine (torch) never loads in the router's."""
    if role == "prefill":
        from prefill_worker.worker import PrefillWorker

        return PrefillWorker
    if role == "decode":
        from decode_worker.worker import DecodeWorker

        return DecodeWorker
    from common.worker.runtime import ColocatedWorker

    return ColocatedWorker


def see_node_gpus(assigned: list[str]) -> None:
    """Before CUDA starts in this process: show it the node's GPUs, its own first."""
    import torch

    if torch.cuda.is_initialized():
        log.warning("CUDA already started: this worker sees only CUDA_VISIBLE_DEVICES=%s",
                    os.environ.get("CUDA_VISIBLE_DEVICES"))
        return
    # Ray left the node's CUDA_VISIBLE_DEVICES (if any) alone; device_count reads it through NVML, uncached.
    os.environ["CUDA_VISIBLE_DEVICES"] = own_gpus_first(
        assigned, os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count())

