"""`pdcluster serve`: start (or join) Ray, place the workers as Ray actors, run the router until a signal."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from common import faults
from common.config import ConfigError, EngineConfig
from common.prompt import tokenizer_loading
from common.startup import Startup
from common.worker.config import WorkerConfig
from kvtransfer.choice import available_transports
from kvtransfer.errors import TransferError
from router.config import RouterConfig
from router.http.server import HttpServer
from router.mps import MpsServer, parse_shares
from router.router import Router
from router.serve_config import ROLES, ServeConfig
from router.text import RouterText
from router.worker_actor import NOSET_CUDA_VISIBLE_DEVICES, WILDCARDS, WorkerActor

log = logging.getLogger(__name__)

ID_PREFIX = {"prefill": "p", "decode": "d", "colocated": "c"}
REPO_ROOT = str(Path(__file__).resolve().parent.parent)
GPU_VISIBILITY = ("node", "own")


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host in ("::1", "[::1]")


def nodes_out_of_reach(worker_host: str, here: str, nodes: list[dict], needs: list[dict[str, float]]) -> list[str]:
    """Addresses of the live Ray nodes (`ray.nodes()`) other than `here` that could take a worker (one of
    `needs` fits their resources) but could not reach a router whose worker endpoint is on `worker_host`."""
    if not is_loopback(worker_host):
        return []
    fits = [n for n in nodes if n.get("Alive") and n.get("NodeManagerAddress") != here and any(
        all(n.get("Resources", {}).get(name, 0) >= amount for name, amount in need.items()) for need in needs)]
    return sorted({n["NodeManagerAddress"] for n in fits})


class Cluster:
    """The router plus its worker actors."""

    def __init__(self, serve: ServeConfig, router_config: RouterConfig, engine_config: EngineConfig):
        self.serve_config, self.router_config, self.engine_config = serve, router_config, engine_config
        if engine_config.device != "auto":  # before anything starts (auto: once Ray tells whether it has GPUs)
            self._check_transport()
        # Asked for by name, a transport must work on every worker; otherwise each offers what it can.
        self.kv_transports = [] if router_config.kv_transport == "auto" else [router_config.kv_transport]
        for role in ROLES:
            serve.resources(role)  # a malformed resource is a usage error before anything starts
        if serve.gpu_visibility not in GPU_VISIBILITY:
            raise ConfigError(f"gpu_visibility: must be one of {', '.join(GPU_VISIBILITY)}, "
                              f"got {serve.gpu_visibility!r}")
        self.mps = MpsServer(parse_shares(serve.mps_shares)) if serve.mps else None
        self.router: Router | None = None
        self.actors: dict[str, object] = {}
        self.runs: dict[str, object] = {}
        self._own_ray = False
        self._actor_cls = None
        self._started = dict.fromkeys(ROLES, 0)  # workers ever started per role: new ids continue from here

    def worker_plan(self) -> list[tuple[str, str, EngineConfig]]:
        """(worker id, role, engine config) for each worker to start."""
        s = self.serve_config
        if self.router_config.mode == "colocated":
            return self.plan("colocated", 0, s.workers)
        return self.plan("prefill", 0, s.prefill_workers) + self.plan("decode", 0, s.decode_workers)

    def plan(self, role: str, first: int, count: int) -> list[tuple[str, str, EngineConfig]]:
        """(worker id, role, engine config) for workers `first` .. `first + count - 1` of `role`."""
        s, e = self.serve_config, self.engine_config
        util = {"prefill": s.prefill_gpu_memory_utilization, "decode": s.decode_gpu_memory_utilization}.get(role)
        share = util or (e.gpu_memory_utilization * min(1.0, s.gpus_per_worker))
        config = dataclasses.replace(e, gpu_memory_utilization=share)
        return [(f"{ID_PREFIX[role]}{i}", role, config) for i in range(first, first + count)]

    def _check_transport(self) -> None:
        """A transport these workers cannot have is a usage error, found before any worker starts."""
        try:
            available_transports(self.engine_config.device, self.router_config.kv_transport)
        except TransferError as e:
            raise ConfigError(f"kv_transport: {e}") from None

    def worker_env(self, role: str) -> dict[str, str]:
        """Environment of a worker process of `role`: CPU workers share the cores; with node visibility, Ray leaves
        CUDA_VISIBLE_DEVICES to the worker (see_node_gpus); under --mps, the MPS server's pipe and the role's
        share of the SMs."""
        if self.engine_config.device == "cpu":
            return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, len(self.worker_plan()))))}
        env = {NOSET_CUDA_VISIBLE_DEVICES: "1"} if self.serve_config.gpu_visibility == "node" else {}
        return env | (self.mps.env(role) if self.mps is not None else {})

    def start_ray(self) -> None:
        import ray

        plan = self.worker_plan()
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))}
        kwargs = dict(include_dashboard=False, logging_level=logging.WARNING, runtime_env={"env_vars": env})
        if self.serve_config.ray_address:
            ray.init(address=self.serve_config.ray_address, **kwargs)
        else:
            # Room to scale up on this machine; each custom resource asked for exists here in plenty. "local":
            # a Ray of our own even when another runs here (ray.init would join that one, then refuse num_cpus).
            custom = {name: 1000.0 for role in ROLES for name in self.serve_config.resources(role)}
            # Our own Ray enables its token authentication and says so on every start: noise to a user here.
            logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            ray.init(address="local", num_cpus=max(len(plan), os.cpu_count() or 1) + 1, resources=custom, **kwargs)
            self._own_ray = True
        if self.engine_config.device == "auto":
            has_gpus = ray.cluster_resources().get("GPU", 0) > 0
            self.engine_config = self.engine_config.on_device("cuda" if has_gpus else "cpu")
            self._check_transport()

    def _check_worker_host(self) -> None:
        """Workers on other nodes dial the router's worker endpoint: a loopback one is out of their reach, and
        they would never join (clients would get `unavailable` forever). Refused before any worker starts."""
        import ray

        host, here = self.router_config.worker_host, ray.util.get_node_ip_address()
        needs = [self.serve_config.resources(role) for role in {r for _, r, _ in self.worker_plan()}]
        away = nodes_out_of_reach(host, here, ray.nodes(), needs)
        if away:
            raise ConfigError(f"worker_host: {host} is out of reach of workers on the other nodes of this Ray "
                              f"cluster ({', '.join(away)}): pass --worker-host 0.0.0.0 (or this node's "
                              f"address, {here})")

    def start_workers(self) -> None:
        import ray

        s = self.serve_config
        if not self._own_ray:
            self._check_worker_host()
        # A worker that dies is started again and `run` retried: it says hello and the router takes it back.
        self._actor_cls = ray.remote(max_concurrency=2, max_restarts=s.worker_restarts,
                                     max_task_retries=s.worker_restarts)(WorkerActor)
        host = self.router_config.worker_host
        if host in WILDCARDS:  # bound on every interface; workers on other nodes dial this node's address
            self.router.worker_address = self.router.worker_address.replace(host, ray.util.get_node_ip_address(), 1)
        self._fault_dir = faults.Faults.from_env().folder  # test-only; read once, here
        plan = self.worker_plan()
        for role in ROLES:
            self._started[role] = sum(1 for _, r, _ in plan if r == role)
        log.info("starting %d workers (%s) on %s; Ctrl-C stops", len(plan), ", ".join(w for w, _, _ in plan),
                 self.engine_config.device)
        self._start_mps()
        self._launch(plan)

    def _start_mps(self) -> None:
        """The MPS server of --mps, where workers share GPUs; otherwise it would only cap lone workers' SMs."""
        if self.mps is None:
            return
        if self.engine_config.device != "cuda" or self.serve_config.gpus_per_worker >= 1:
            log.info("mps: workers do not share GPUs here: not used")
            self.mps = None
            return
        self.mps.start()
        log.info("mps: workers share their GPUs through an MPS server (SM shares: %s)",
                 ", ".join(f"{role} {share}%" for role, share in self.mps.shares.items()))

    def add_workers(self, role: str, count: int) -> list[str]:
        """Starts `count` more workers of `role` (blocking until they have loaded); returns their ids."""
        plan = self.plan(role, self._started[role], count)
        self._started[role] += count
        return self._launch(plan)

    def _launch(self, plan: list[tuple[str, str, EngineConfig]]) -> list[str]:
        import ray

        s, e = self.serve_config, self.engine_config
        gpus = s.gpus_per_worker * e.tensor_parallel_size if e.device == "cuda" else 0
        actors, launched = {}, time.time()
        for worker_id, role, engine_config in plan:
            config = WorkerConfig(worker_id=worker_id, router_address=self.router.worker_address,
                                  host=self.router_config.worker_host, kv_transports=self.kv_transports,
                                  handoff_timeout=s.handoff_timeout,
                                  local_prefill_chunk=self.router_config.local_prefill_chunk,
                                  auth_token=self.router.auth_token,
                                  fault_dir=self._fault_dir, timeline_dir=s.timeline_dir)
            actors[worker_id] = self._actor_cls.options(
                name=f"pdcluster-{worker_id}", num_cpus=1, num_gpus=gpus, resources=s.resources(role),
                runtime_env={"env_vars": self.worker_env(role)},
            ).remote(role, config, engine_config)
        self.actors.update(actors)
        try:
            ids = self._loaded(actors, {worker_id: role for worker_id, role, _ in plan}, launched)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"{', '.join(actors)} did not load within {s.startup_timeout:g} s: does some node "
                               f"have the resources they ask for ({plan[0][1]}: {s.resources(plan[0][1]) or 'none'}"
                               f", {gpus:g} GPUs, 1 CPU)?") from None
        self.runs.update({wid: a.run.remote() for wid, a in actors.items()})
        return ids

    def _loaded(self, actors: dict[str, Any], roles: dict[str, str], launched: float) -> list[str]:
        """Waits for `actors` (asked for at `launched`, wall clock) to load, logging how long each took; their ids.
        Where one does not load in time, fails, or refuses to start (its ConfigError, one line), all are killed."""
        import ray

        deadline = time.monotonic() + self.serve_config.startup_timeout
        ready = {worker_id: actor.ready.remote() for worker_id, actor in actors.items()}
        try:
            for worker_id, ref in ready.items():
                try:
                    began, startup = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
                except ray.exceptions.RayTaskError as e:
                    if isinstance(e.cause, ConfigError):
                        raise ConfigError(f"{roles[worker_id]} worker {worker_id}: {e.cause}") from None
                    raise
                shown = Startup()
                shown.add("Ray actor", began - launched)  # Ray starting its process
                shown.extend(startup)
                log.info("%s (%s) ready in %s", worker_id, roles[worker_id], shown.summary())
            return list(ready)
        except BaseException:
            for worker_id, actor in actors.items():
                ray.kill(actor)
                self.actors.pop(worker_id, None)
            raise

    def remove_worker(self, worker_id: str, timeout: float = 30.0) -> None:
        """Stops a (drained) worker: it leaves its loop and closes its sockets, then its actor goes."""
        import ray

        actor, run = self.actors.pop(worker_id, None), self.runs.pop(worker_id, None)
        if actor is None:
            return
        actor.stop.remote()
        if run is not None:
            ray.wait([run], timeout=timeout)
        ray.kill(actor)  # no restart: this one is meant to be gone

    # ---- the router's Scaler ------------------------------------------------------------------------
    async def add(self, role: str, count: int) -> list[str]:
        return await asyncio.get_running_loop().run_in_executor(None, self.add_workers, role, count)

    async def remove(self, worker_id: str) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.remove_worker, worker_id)

    async def serve(self, stop: asyncio.Event) -> None:
        import ray  # noqa: F401  (before the tokenizer's thread: two threads importing at once may deadlock)

        loop, startup = asyncio.get_running_loop(), Startup()
        with startup.timed("router"):  # its tokenizer loads on a thread of its own while Ray starts
            self.router = Router(self.router_config, RouterText(tokenizer_loading(self.router_config.model)))
            self.router.scaling.scaler = self
            http = self.http_server()
        why = "stopped"
        try:
            if http is not None:  # answers (503 on /health, `unavailable` on requests) while the workers load
                await http.start()
            with startup.timed("Ray"):
                self.start_ray()
            with startup.timed("tokenizer"):  # the rest of its load, if Ray was quicker; or why it failed
                self.router.text.tokenizer
            # After ray.init, which installs a SIGTERM handler of its own that aborts the process.
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            with startup.timed("workers"):
                if not await self._start_workers_unless(stop):
                    why = "interrupted while the workers were starting"
                    return
            log.info("serving on %s (%s mode), ready in %s", self.router_config.bind, self.router_config.mode,
                     startup.summary())
            await self.router.serve(stop)
            why = "asked to stop"
        except BaseException as exc:
            why = f"{type(exc).__name__}" + (f": {exc}" if str(exc) else "")
            raise
        finally:
            log.info("shutting down (%s)", why)
            if http is not None:
                await http.stop()
            await loop.run_in_executor(None, self.shutdown)

    async def _start_workers_unless(self, stop: asyncio.Event) -> bool:
        """Starts the workers; False as soon as `stop` is set (a Ctrl-C while they load), not once they have loaded:
        the shutdown that follows kills them, which ends the wait for them in its thread."""
        starting = asyncio.get_running_loop().run_in_executor(None, self.start_workers)
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if stopped.done():
            starting.add_done_callback(lambda f: f.cancelled() or f.exception())  # its error is no news then
            return False
        stopped.cancel()
        starting.result()  # raises why the workers could not start
        return True

    def http_server(self) -> HttpServer | None:
        """The OpenAI-compatible front end of `--http HOST:PORT`, bound (not yet serving); None without it."""
        where = self.router_config.http_host_port()
        return None if where is None else HttpServer(self.router, *where)

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
        if self.mps is not None:  # after its clients
            self.mps.stop()
        if self.router is not None:
            self.router.close()


def run_cluster(serve: ServeConfig, router_config: RouterConfig, engine_config: EngineConfig) -> None:
    import uvloop

    async def main() -> None:
        await Cluster(serve, router_config, engine_config).serve(asyncio.Event())

    uvloop.run(main())
