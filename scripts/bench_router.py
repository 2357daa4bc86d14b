"""The router's own ceiling: the requests/s one router core sustains with N registered workers that answer at
once, the latency it adds, and its CPU per request.

    python -m scripts.bench_router --model DIR [--workers 10,100,1000] [--modes colocated,disagg] [--step-seconds 3]
        [--tokens 16] [--stream]

Per mode and N: the router (scripts/router_process.py) pinned to `--router-core`; N instant workers
(scripts/instant_workers.py: each its own ZMQ identity, hello and heartbeats at the real interval; disaggregated: half
prefill, half decode, the reserve / prefill_task / kv_handoff round all played) in `--fleet-processes` processes;
`--clients` load processes with router.client.AsyncClient, each sending its share of an open-loop Poisson rate of
distinct text prompts (the router tokenizes them), all pinned off the router's core. First the router's CPU with no
requests (heartbeats only) is read from /proc, then the offered rate climbs (x`--growth` a step, `--step-seconds`
each) from a guess the probe's CPU per request gives, and is bisected (`--bisect-steps`) between the last rate the
router kept up with and the first it did not. Kept up: every request answered within `--drain-seconds` and the p90
latency under `--max-p90-ms`; latency runs from each request's scheduled send, so a queue that grows over a step
shows there (a pause of the machine that delays a few requests, in the p99 only). Then p50 / p99 latency at
fractions of that ceiling. Latency is the client's: the router's work, two
hops to a worker and back (four messages disaggregated), and the client library.

"router busy" is the router's CPU time over the wall time at the ceiling: near 100%, the router bound it; lower, the
load processes (or the machine) did, and the ceiling is a lower bound for the router. "req/s per core" is what its
CPU per request at the ceiling allows one core, the heartbeats' share set apart: (1 - hb CPU) / (CPU per request net
of it). Progress on stderr, one table on stdout; docs/benchmarks.md keeps the figures.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass

from scripts.instant_workers import fleet_roles, run_fleet
from scripts.router_load import LoadPool, StepResult
from scripts.router_process import RouterProcess, RouterSpec, stop_processes

FRACTIONS = (0.25, 0.5, 0.8)


@dataclass
class Ceiling:
    mode: str
    workers: int
    idle_cpu: float  # the router's CPU share with no requests: the heartbeats'
    rps: float  # the highest offered rate it kept up with
    at_ceiling: StepResult
    by_fraction: dict[float, StepResult]

    @property
    def per_core(self) -> float:
        """Requests/s its CPU per request (net of the heartbeats' share) allows one core."""
        net_ms = self.at_ceiling.cpu_ms - 1e3 * self.idle_cpu / max(self.at_ceiling.served_rps, 1e-9)
        return (1 - self.idle_cpu) / (max(net_ms, 1e-6) / 1e3)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def kept_up(r: StepResult, max_p90_ms: float) -> bool:
    """Every request answered, and in time: latency runs from each request's scheduled send, so a queue that grows
    over the step (the router's or a load process's) shows in the p90; a pause of the machine that delays a few
    requests, in the p99 only."""
    return r.unanswered == 0 and r.p90_ms <= max_p90_ms


def wait_registered(address: str, n: int, timeout: float = 120.0) -> None:
    from router.client import Client

    deadline = time.monotonic() + timeout
    with Client(address) as client:
        while True:
            alive = sum(w.alive for w in client.stats(timeout=10).workers)
            if alive >= n:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {alive} of {n} workers registered in {timeout:g} s")
            time.sleep(0.2)


def start_fleets(address: str, mode: str, n: int, processes: int, tokens: int,
                 router_core: int | None = None, stream: bool = False) -> tuple[list, object]:
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    workers = [(f"{role[0]}{i}", role) for i, role in enumerate(fleet_roles(mode, n))]
    groups = [workers[i::processes] for i in range(min(processes, n))]  # each process has both roles
    procs = [ctx.Process(target=run_fleet, args=(address, group, tokens, stop, router_core, stream))
             for group in groups]
    for p in procs:
        p.start()
    return procs, stop


def find_ceiling(router: RouterProcess, load: LoadPool, args, mode: str, n: int) -> Ceiling:
    time.sleep(args.idle_seconds / 2)  # the heartbeats settle into their phases
    cpu0, t0 = router.cpu(), time.monotonic()
    time.sleep(args.idle_seconds)
    idle = (router.cpu() - cpu0) / (time.monotonic() - t0)
    log(f"{mode} N={n}: router CPU with heartbeats only: {100 * idle:.1f}%")

    def step(rate: float, seconds: float) -> StepResult:
        r = load.step(rate, seconds, router)
        ok = kept_up(r, args.max_p90_ms)
        log(f"  {rate:8.0f} req/s offered: served {r.served_rps:7.0f}, p50 / p90 / p99 {r.p50_ms:.2f} / "
            f"{r.p90_ms:.2f} / {r.p99_ms:.2f} ms, router CPU {r.cpu_ms:.3f} ms/req ({100 * r.busy:.0f}% busy), "
            f"unanswered {r.unanswered}: "
            f"{'kept up' if ok else 'fell behind'}")
        if not ok:
            time.sleep(1.0)  # what is left of its backlog drains before the next step
        return r

    probe = step(args.probe_rps, args.step_seconds)
    if not kept_up(probe, args.max_p90_ms):
        raise RuntimeError(f"{mode} N={n}: the router fell behind at the probe rate, {args.probe_rps:g} req/s")
    rate = max(args.probe_rps, 0.5 * (1 - idle) / (probe.cpu_ms / 1e3))  # half what its CPU per request allows
    good, bad = probe, None
    for _ in range(args.max_steps):
        r = step(rate, args.step_seconds)
        if not kept_up(r, args.max_p90_ms):
            bad = r
            break
        good, rate = r, rate * args.growth
    for _ in range(args.bisect_steps if bad is not None else 0):  # between the last rate kept up with and the first not
        rate = math.sqrt(good.offered_rps * bad.offered_rps)
        if bad.offered_rps / good.offered_rps < 1.05:
            break
        r = step(rate, args.step_seconds)
        good, bad = (r, bad) if kept_up(r, args.max_p90_ms) else (good, r)
    if bad is None:
        log(f"  still keeping up after {args.max_steps} steps: the ceiling is above {good.offered_rps:.0f} req/s")
    by_fraction = {f: step(f * good.offered_rps, args.step_seconds) for f in FRACTIONS}
    return Ceiling(mode, n, idle, good.offered_rps, good, by_fraction)


def run_one(args, mode: str, n: int) -> Ceiling:
    core = None if args.router_core < 0 else args.router_core
    profile = f"{args.profile_router}.{mode}-{n}" if args.profile_router else None
    with RouterProcess(RouterSpec(args.model, mode, core=core, profile_out=profile)) as router:
        fleets, stop = start_fleets(router.worker_address, mode, n, args.fleet_processes, args.tokens, core,
                                    args.stream)
        try:
            wait_registered(router.spec.address, n)
            with LoadPool(router.spec.address, args.clients, args.tokens, args.prompt_words, core,
                          args.drain_seconds, args.stream) as load:
                return find_ceiling(router, load, args, mode, n)
        finally:
            stop.set()
            stop_processes(fleets)
            if profile:
                log(f"router profile (cProfile, its overhead in every figure of this run): {profile}")


def table(results: list[Ceiling]) -> str:
    head = (f"{'mode':<10} {'workers':>7} {'hb CPU':>7} {'ceiling req/s':>13} {'router busy':>11} {'CPU ms/req':>10} "
            f"{'req/s per core':>14}"
            + "".join(f" {f'p50/p99 ms @{int(100 * f)}%':>18}" for f in FRACTIONS))
    lines = [head]
    for c in results:
        r = c.at_ceiling
        at = "".join(f" {f'{s.p50_ms:.2f} / {s.p99_ms:.2f}':>18}" for s in (c.by_fraction[f] for f in FRACTIONS))
        lines.append(f"{c.mode:<10} {c.workers:>7} {100 * c.idle_cpu:>6.1f}% {c.rps:>13.0f} {100 * r.busy:>10.0f}% "
                     f"{r.cpu_ms:>10.3f} {c.per_core:>14.0f}{at}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint folder (its tokenizer; e.g. prepare-model random)")
    p.add_argument("--workers", default="10,100,1000", help="comma list of registered worker counts")
    p.add_argument("--modes", default="colocated,disagg", help="comma list: colocated, disagg")
    p.add_argument("--tokens", type=int, default=16, help="tokens each answer carries")
    p.add_argument("--stream", action="store_true", help="stream every answer: the workers report one token an "
                                                         "update and the router sends a delta a token, as in serving")
    p.add_argument("--prompt-words", type=int, default=32, help="words of each (distinct) text prompt")
    p.add_argument("--clients", type=int, default=2, help="load processes")
    p.add_argument("--fleet-processes", type=int, default=4, help="processes the instant workers share")
    p.add_argument("--router-core", type=int, default=0, help="CPU the router is pinned to (-1: not pinned)")
    p.add_argument("--step-seconds", type=float, default=3.0, help="seconds of load at each offered rate")
    p.add_argument("--idle-seconds", type=float, default=2.0, help="seconds the heartbeats-only CPU is read over")
    p.add_argument("--probe-rps", type=float, default=100.0, help="the first rate, for the CPU per request")
    p.add_argument("--growth", type=float, default=1.3, help="factor between offered rates while it keeps up")
    p.add_argument("--max-steps", type=int, default=8, help="rates tried upwards before giving up on a ceiling")
    p.add_argument("--bisect-steps", type=int, default=3, help="rates tried between the last kept up with and "
                                                                 "the first not")
    p.add_argument("--max-p90-ms", type=float, default=50.0, help="a p90 above this is falling behind")
    p.add_argument("--drain-seconds", type=float, default=5.0, help="how long a step's last requests may take")
    p.add_argument("--profile-router", default=None, metavar="PREFIX",
                   help="cProfile each router into PREFIX.MODE-N (read: python -m pstats FILE)")
    args = p.parse_args(argv)
    args.worker_counts = [int(n) for n in args.workers.split(",")]
    args.mode_list = [m.strip() for m in args.modes.split(",")]
    for m in args.mode_list:
        if m not in ("colocated", "disagg"):
            p.error(f"--modes: colocated or disagg, got {m!r}")
    if min(args.worker_counts) < (2 if "disagg" in args.mode_list else 1):
        p.error("--workers: each count must be >= 1 (>= 2 for disagg: a prefill and a decode worker)")
    return args


def main(argv: list[str] | None = None) -> list[Ceiling]:
    args = parse_args(argv)
    results = []
    for mode in args.mode_list:
        for n in args.worker_counts:
            results.append(run_one(args, mode, n))
    print(table(results), flush=True)
    return results


if __name__ == "__main__":
    main()
