"""`pdcluster serve`: start (or join) Ray, place the workers as Ray actors, run the router until a signal."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from common import faults
from common.config import ConfigError, EngineConfig
from common.worker import ColocatedWorker, WorkerConfig
from decode_worker.worker import DecodeWorker
from kvtransfer import TransferError, available_transports
from prefill_worker.worker import PrefillWorker
from router.router import Router, RouterConfig

log = logging.getLogger(__name__)

ROLES = {"prefill": PrefillWorker, "decode": DecodeWorker, "colocated": ColocatedWorker}
REPO_ROOT = str(Path(__file__).resolve().parent.parent)


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


class WorkerActor:
    """The Ray actor around one worker. `run` blocks in the actor's main thread until the worker stops."""

    def __init__(self, role: str, config: WorkerConfig, engine_config: EngineConfig):
        import ray

        logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                            format=f"%(asctime)s %(levelname)s {config.worker_id}: %(message)s")
        config.node_id = ray.get_runtime_context().get_node_id()
        gpu_ids = ray.get_gpu_ids()
        config.device_index = int(gpu_ids[0]) if gpu_ids else 0
        self.worker = ROLES[role](config, engine_config)

    def ready(self) -> str:
        return self.worker.config.worker_id

    def run(self) -> None:
        self.worker.run()

    def stop(self) -> None:
        self.worker.stop()


class Cluster:
    """The router plus its worker actors."""

    def __init__(self, serve: ServeConfig, router_config: RouterConfig, engine_config: EngineConfig):
        self.serve_config, self.router_config, self.engine_config = serve, router_config, engine_config
        try:  # before anything starts: a transport these workers cannot have is a usage error
            available_transports(engine_config.device, router_config.kv_transport)
        except TransferError as e:
            raise ConfigError(f"kv_transport: {e}") from None
        # Asked for by name, a transport must work on every worker; otherwise each offers what it can.
        self.kv_transports = [] if router_config.kv_transport == "auto" else [router_config.kv_transport]
        self.router: Router | None = None
        self.actors: dict[str, object] = {}
        self.runs: dict[str, object] = {}
        self._own_ray = False

    def worker_plan(self) -> list[tuple[str, str, EngineConfig]]:
        """(worker id, role, engine config) for each worker to start."""
        s, e = self.serve_config, self.engine_config
        if self.router_config.mode == "colocated":
            roles = [("colocated", f"c{i}", None) for i in range(s.workers)]
        else:
            roles = ([("prefill", f"p{i}", s.prefill_gpu_memory_utilization) for i in range(s.prefill_workers)]
                     + [("decode", f"d{i}", s.decode_gpu_memory_utilization) for i in range(s.decode_workers)])
        plan = []
        for role, worker_id, util in roles:
            share = util or (e.gpu_memory_utilization * min(1.0, s.gpus_per_worker))
            plan.append((worker_id, role, dataclasses.replace(e, gpu_memory_utilization=share)))
        return plan

    def start_ray(self) -> None:
        import ray

        plan = self.worker_plan()
        threads = max(1, (os.cpu_count() or 1) // max(1, len(plan)))
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))}
        if self.engine_config.device == "cpu":
            env["OMP_NUM_THREADS"] = str(threads)
        kwargs = dict(include_dashboard=False, logging_level=logging.WARNING, runtime_env={"env_vars": env})
        if self.serve_config.ray_address:
            ray.init(address=self.serve_config.ray_address, **kwargs)
        else:
            ray.init(num_cpus=len(plan) + 1, **kwargs)
            self._own_ray = True

    def start_workers(self) -> None:
        import ray

        s, e = self.serve_config, self.engine_config
        # A worker that dies is started again and `run` retried: it says hello and the router takes it back.
        actor_cls = ray.remote(max_concurrency=2, max_restarts=s.worker_restarts,
                               max_task_retries=s.worker_restarts)(WorkerActor)
        host = self.router_config.worker_host
        gpus = s.gpus_per_worker * e.tensor_parallel_size if e.device == "cuda" else 0
        fault_dir = faults.Faults.from_env().folder  # test-only; read once, here
        for worker_id, role, engine_config in self.worker_plan():
            config = WorkerConfig(worker_id=worker_id, router_address=self.router.worker_address, host=host,
                                  kv_transports=self.kv_transports, handoff_timeout=s.handoff_timeout,
                                  auth_token=self.router.auth_token, fault_dir=fault_dir)
            actor = actor_cls.options(name=f"pdcluster-{worker_id}", num_cpus=1, num_gpus=gpus).remote(
                role, config, engine_config)
            self.actors[worker_id] = actor
        ids = ray.get([a.ready.remote() for a in self.actors.values()], timeout=s.startup_timeout)
        log.info("workers loaded: %s", ", ".join(ids))
        self.runs = {wid: a.run.remote() for wid, a in self.actors.items()}

    async def serve(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self.router = Router(self.router_config)
        try:
            self.start_ray()
            # After ray.init, which installs a SIGTERM handler of its own that aborts the process.
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await loop.run_in_executor(None, self.start_workers)
            log.info("serving on %s (%s mode)", self.router_config.bind, self.router_config.mode)
            await self.router.serve(stop)
        finally:
            await loop.run_in_executor(None, self.shutdown)

    def shutdown(self) -> None:
        """Workers stop (the router has told them), then their actors and Ray go; nothing is left behind."""
        import ray

        if ray.is_initialized():
            if self.runs:
                ray.wait(list(self.runs.values()), num_returns=len(self.runs), timeout=10)
            for actor in self.actors.values():
                ray.kill(actor)
            if self._own_ray:
                ray.shutdown()
        if self.router is not None:
            self.router.close()


def run_cluster(serve: ServeConfig, router_config: RouterConfig, engine_config: EngineConfig) -> None:
    import uvloop

    async def main() -> None:
        await Cluster(serve, router_config, engine_config).serve(asyncio.Event())

    uvloop.run(main())
