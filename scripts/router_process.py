"""The router under benchmark as a process of its own, pinned to one core, and what /proc says it spent; shared by
scripts/bench_frontend.py and scripts/bench_router.py. The processes it starts are spawned (a clean interpreter:
no state forked from the driver)."""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import socket
import time
from dataclasses import dataclass, field


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def other_cores(core: int | None) -> set[int] | None:
    """The cores this process may use besides the router's (None: no pinning, or no core would be left)."""
    cores = os.sched_getaffinity(0) - ({core} if core is not None else set())
    return cores if core is not None and cores else None


@dataclass
class RouterSpec:
    model: str
    mode: str = "colocated"
    http_port: int | None = None  # also serve HTTP on 127.0.0.1:PORT
    core: int | None = None  # pinned here
    profile_out: str | None = None  # cProfile the router's whole run into this file
    address: str = field(default_factory=lambda: f"tcp://127.0.0.1:{free_port()}")


def run_router(spec: RouterSpec, worker_address: mp.Queue, stop) -> None:
    """The entry point of the router's process: serves until `stop` (an Event) is set; puts its worker address."""
    import uvloop

    from router.config import RouterConfig
    from router.router import Router

    if spec.core is not None:
        os.sched_setaffinity(0, {spec.core})

    async def main() -> None:
        http = f"127.0.0.1:{spec.http_port}" if spec.http_port else None
        router = Router(RouterConfig(model=spec.model, bind=spec.address, mode=spec.mode, http=http,
                                     max_queued_requests=1 << 16))
        server = None
        if http:
            from router.http.server import HttpServer

            server = HttpServer(router, "127.0.0.1", spec.http_port)
            await server.start()
        worker_address.put(router.worker_address)
        done = asyncio.Event()
        serving = asyncio.create_task(router.serve(done))
        while not stop.is_set():
            await asyncio.sleep(0.1)
        done.set()
        await serving
        if server is not None:
            await server.stop()
        router.close()

    if spec.profile_out is None:
        uvloop.run(main())
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        uvloop.run(main())
    finally:
        profiler.disable()
        profiler.dump_stats(spec.profile_out)


class RouterProcess:
    """The router's process and its worker address, as a context manager that stops it."""

    def __init__(self, spec: RouterSpec):
        ctx = mp.get_context("spawn")
        self.spec, self.stop = spec, ctx.Event()
        addresses = ctx.Queue()
        self.proc = ctx.Process(target=run_router, args=(spec, addresses, self.stop))
        self.proc.start()
        self.worker_address: str = addresses.get(timeout=120)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def __enter__(self) -> RouterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop.set()
        stop_processes([self.proc])


def stop_processes(procs: list, timeout: float = 15.0) -> None:
    """Join each (their stop event already set), killing any that does not end in `timeout` seconds."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(timeout=max(0.1, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
