"""The cluster a benchmark measures: `pdcluster serve` started as a subprocess and stopped like a service, waited
for until it can serve, watched while it runs, and asked what its engines ran (the router's worker stats)."""
from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scripts.bench_config import VARIANTS, BenchConfig, mode_variants

log = logging.getLogger("pdcluster.bench")

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_POLL_S = 2.0  # between checks that `serve` is still alive while waiting for it
STOP_TIMEOUT_S = 120.0
# Two worker heartbeats: the router's stats then hold every step of what just ran.
HEARTBEAT_WAIT_S = 1.0
TOTALS = ("busy_steps", "busy_seconds", "prefill_tokens_run", "decode_tokens_run", "gpu_seconds",
          "prefix_query_tokens", "prefix_hit_tokens")
# The router's own counts (`Stats.totals`), kept under ROUTER beside the workers' rows (a point's `router`).
ROUTER = "router"
ROUTER_TOTALS = ("prompt_tokens", "cached_tokens", "migrations", "local_prefills", "remote_prefills", "loop_stalls",
                 "loop_stall_seconds", "gc_pauses", "gc_seconds")


class ClusterError(Exception):
    """A cluster that would not start, or died: its mode's run stops, the others go on."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(cfg: BenchConfig, mode: str, address: str, device: str | None = None) -> list[str]:
    """`pdcluster serve ...` for one mode (`disagg` or `colocated`, maybe with a `:variant`) on `device` (cpu or
    cuda, as the benchmark found it; default --device), as a user would type it: only the flags that apply there (no
    GPUs per worker on CPU)."""
    device = device or cfg.device
    mode, variants = mode_variants(mode)
    cmd = ["pdcluster", "serve", "--model", str(Path(cfg.model).resolve()), "--mode", mode, "--bind", address,
           "--device", device, *(flag for v in variants for flag in VARIANTS[v])]
    if mode == "disagg":
        cmd += ["--prefill-workers", str(cfg.prefill_workers), "--decode-workers", str(cfg.decode_workers)]
        gpus = cfg.gpus_per_worker
    else:
        cmd += ["--workers", str(cfg.workers)]
        gpus = cfg.colocated_gpus_per_worker or cfg.gpus_per_worker
    if device != "cpu":
        cmd += ["--gpus-per-worker", f"{gpus:g}"]
    return cmd + shlex.split(cfg.serve_args)


class ServeProcess:
    """`pdcluster serve` as a subprocess in its own process group, stopped with SIGTERM like a service."""

    def __init__(self, command: list[str], log_path: Path):
        self.command = command
        self.log_path = log_path
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        with open(log_path, "wb") as log_file:
            self.proc = subprocess.Popen([sys.executable, "-m", "scripts.cli", *command[1:]], env=env,
                                         stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def exited(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> int:
        """SIGTERM, wait, SIGKILL if it hangs; whatever it left in its process group is killed too."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("serve did not stop within %g s of SIGTERM: killing it", STOP_TIMEOUT_S)
                self.proc.kill()
                self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
            log.warning("serve left processes behind in its group %d: killed them", self.proc.pid)
        except ProcessLookupError:
            pass
        return self.proc.returncode


async def wait_ready(client: Any, server: ServeProcess | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    problem = "the router did not answer"
    while True:
        if server is not None and (status := server.exited()) is not None:
            log.error("serve log (%s):\n%s", server.log_path, server.log_tail())
            raise ClusterError(f"serve exited with status {status} before it was ready (log: {server.log_path})")
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClusterError(f"{problem} (after {timeout:g} s)")
        try:
            await client.wait_ready(min(left, READY_POLL_S))
            return
        except TimeoutError as e:
            problem = str(e)


async def infer_mode(address: str) -> str:
    """A running cluster's mode, from the roles of its workers."""
    from router.client import AsyncClient

    async with AsyncClient(address) as client:
        stats = await client.stats(timeout=10)
    return "colocated" if any(w.role == "colocated" for w in stats.workers) else "disagg"


async def watch(server: ServeProcess, client: Any) -> None:
    """If serve dies mid-run, close the client: every waiting request fails at once instead of timing out."""
    while server.exited() is None:
        await asyncio.sleep(1.0)
    log.error("serve exited with status %s; log (%s):\n%s", server.exited(), server.log_path, server.log_tail())
    await client.close()


async def engine_totals(client: Any) -> dict[str, dict] | None:
    """Each worker's engine totals (`WorkerStats`) and the router's (`totals`, under "router"), after the heartbeats
    settle; None if stats fail."""
    await asyncio.sleep(HEARTBEAT_WAIT_S)
    try:
        stats = await client.stats(timeout=10)
    except Exception as e:  # a benchmark of a cluster that cannot say this still measures latencies
        log.warning("no engine totals from the cluster's stats: %s", e)
        return None
    rows = {w.worker_id: {"role": w.role, **{k: getattr(w, k, 0) for k in TOTALS},
                          "handoffs": {h.transport: [h.count, h.bytes, h.seconds] for h in getattr(w, "handoffs", [])}}
            for w in stats.workers}
    if (totals := getattr(stats, "totals", None)) is not None:
        rows[ROUTER] = {"role": ROUTER, **{k: getattr(totals, k, 0) for k in ROUTER_TOTALS}}
    return rows


def engine_activity(before: dict[str, dict] | None, after: dict[str, dict] | None) -> list[dict] | None:
    """What each worker's engine ran over a load point: the differences of its totals, and of its KV handoffs by
    transport (a prefill worker's: which transport its pairs used, how much and how fast)."""
    if before is None or after is None:
        return None
    return [{"worker_id": wid, "role": a["role"], **{k: a.get(k, 0) - before[wid].get(k, 0) for k in TOTALS},
             "handoffs": handoffs_over(before[wid].get("handoffs") or {}, a.get("handoffs") or {})}
            for wid, a in sorted(after.items()) if wid in before and wid != ROUTER]


def handoffs_over(before: dict[str, list], after: dict[str, list]) -> dict[str, dict]:
    """transport -> {count, bytes, seconds} of the handoffs acknowledged between two of a worker's totals."""
    out = {}
    for transport, totals in after.items():
        count, size, seconds = (a - b for a, b in zip(totals, before.get(transport, (0, 0, 0.0))))
        if count:
            out[transport] = {"count": count, "bytes": size, "seconds": seconds}
    return out


def router_activity(before: dict[str, dict] | None, after: dict[str, dict] | None) -> dict | None:
    """What the router decided over a load point: the differences of its totals; None without them."""
    if before is None or after is None or ROUTER not in before or ROUTER not in after:
        return None
    return {k: after[ROUTER][k] - before[ROUTER][k] for k in ROUTER_TOTALS}
