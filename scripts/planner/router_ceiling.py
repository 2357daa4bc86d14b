"""One router's ceiling, and how many routers a rate needs.

The router spends CPU on each request (admission, tokenizing, placement, the messages), on each token it streams
(the worker's update read, the text decoded, a delta sent) and on each worker's heartbeats. Placement looks at every
worker that could take the request, so a request's CPU grows with the workers behind the router, and the heartbeats
take a share of its core per worker:

    requests/s one router core sustains with W workers, requests of T streamed tokens
        = UTILIZATION x (1 - W x heartbeat_share) / (base_s + W x per_worker_s + T x per_token_s)

`MEASURED` holds the coefficients `python -m scripts.bench_router` gave (docs/benchmarks.md, "Router ceiling": the
machine and the command); UTILIZATION keeps the router off a full core, where its queue and latency grow.
Sharding the workers among K routers, each in front of W / K of them with the clients split across the routers,
multiplies the ceiling by more than K: each router also looks at fewer workers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


UTILIZATION = 0.8  # the bench's sustained rates came to 0.67-1.0 of its CPU bound (docs/benchmarks.md)


@dataclass(frozen=True)
class RouterCost:
    base_s: float  # router CPU seconds per request with no worker to look at
    per_worker_s: float  # added per worker behind the router
    heartbeat_share: float  # share of the router's core one worker's heartbeats take
    per_token_s: float = 0.0  # router CPU seconds per streamed token

    def ceiling(self, workers: int, tokens: float = 0.0) -> float:
        """Requests/s one router core sustains in front of `workers` workers, each request streaming `tokens`
        tokens (0: the heartbeats alone fill it)."""
        spare = 1 - workers * self.heartbeat_share
        return UTILIZATION * max(0.0, spare) / (self.base_s + workers * self.per_worker_s + tokens * self.per_token_s)


# scripts/bench_router.py's "req/s per core" at 10 and 1,000 instant workers and its heartbeats-only CPU (0.5 s
# interval), fitted; a streamed token's CPU from its --stream runs at 16 and 256 tokens, as a share of the plain
# request's in the same session, in the units of the fit. Measured on a quiet 16-core Xeon host (the GPU host's CPU,
# stop 32); where and how: docs/benchmarks.md, "Router ceiling".
MEASURED = {
    "colocated": RouterCost(base_s=0.459e-3, per_worker_s=0.82e-6, heartbeat_share=1.2e-4, per_token_s=33e-6),
    "disagg": RouterCost(base_s=0.538e-3, per_worker_s=0.68e-6, heartbeat_share=1.1e-4, per_token_s=27e-6),
}


@dataclass(frozen=True)
class RouterCheck:
    """Whether the `used` routers in front of a layout of `workers` workers, each in front of an even share of them
    with its share of the clients, carry `rate`; and if not how many would."""

    mode: str
    workers: int
    rate: float
    ceiling: float  # one router's, in front of all of them
    routers: int | None  # routers needed, each in front of an even share of the workers (None: none suffice)
    tokens: float = 0.0  # streamed tokens a request, on average
    used: int = 1  # routers the plan put in front of them
    carried: float = 0.0  # requests/s the used routers carry together (0: one router's ceiling)

    @property
    def capacity(self) -> float:
        return self.carried or self.ceiling

    @property
    def exceeded(self) -> bool:
        return self.rate > self.capacity

    def advice(self) -> str:
        behind = ("more than one router sustains" if self.used == 1 else
                  f"more than {self.used} routers sustain (each in front of about {self.share(self.used)} workers)")
        head = (f"{self.mode}, {self.workers} workers, {self.rate:g} req/s: {behind} (about {self.capacity:.0f} req/s "
                f"of {self.tokens:.0f} streamed tokens)")
        if self.routers is None:
            return head + "; no split of these workers among routers carries it"
        return (f"{head}; {self.routers} routers carry it, each in front of about {self.share(self.routers)} workers "
                f"(its own prefill and decode pools when disaggregated), with the clients split across them")

    def share(self, routers: int) -> int:
        return math.ceil(self.workers / routers)


def routers_needed(rate: float, workers: int, ceiling) -> int | None:
    """The fewest routers, each in front of ceil(workers / k) workers, whose ceilings add up to `rate`."""
    for k in range(1, workers + 1):
        if k * ceiling(math.ceil(workers / k)) >= rate:
            return k
    return None


def check(mode: str, workers: int, rate: float, router_rps: float | None = None, tokens: float = 0.0,
          used: int = 1) -> RouterCheck:
    """`router_rps`: one router's ceiling whatever the workers (else `MEASURED`'s, which falls as they grow and as
    each request streams more `tokens`); `used` routers in front of the workers."""
    ceiling = (lambda w: router_rps) if router_rps else (lambda w: MEASURED[mode].ceiling(w, tokens))
    carried = used * ceiling(math.ceil(workers / used)) if used > 1 else 0.0
    return RouterCheck(mode, workers, rate, ceiling(workers), routers_needed(rate, workers, ceiling), tokens, used,
                       carried)


def plan_checks(plan) -> list[RouterCheck]:
    """Each worker count and mode of a plan (scripts/planner/plan.py's Plan) at each rate it simulated, behind the
    routers it put in front of them, its requests streaming the loads' mean output tokens (as `pdcluster bench`
    streams every request)."""
    rates = sorted({p.rate for points in plan.results.values() for p in points})
    modes = sorted({"colocated" if "colocated" in name else "disagg" for name in plan.results})
    return [check(mode, plan.config.gpus // profile.tp, rate, plan.config.router_rps, plan.output_tokens,
                  plan.routers.get(profile.tp, {}).get(mode, 1))
            for profile in plan.profiles for mode in modes for rate in rates]


def summary(checks: list[RouterCheck]) -> list[str]:
    """What a plan's report says of its routers: where they carry every rate, one line (one per mode and worker count
    behind several); else one per mode and worker count, at the lowest rate that needs more."""
    over = [c for c in checks if c.exceeded]
    if not over:
        lines, groups = [], {}
        for c in checks:
            groups.setdefault((c.mode, c.workers, c.used), []).append(c)
        if all(used == 1 for _, _, used in groups):
            top = max(checks, key=lambda c: c.rate / c.ceiling)
            return [f"router: one router carries every rate here (at most {100 * top.rate / top.ceiling:.0f}% of its "
                    f"ceiling, about {top.ceiling:.0f} req/s of {top.tokens:.0f} streamed tokens for {top.mode} with "
                    f"{top.workers} worker{'s' if top.workers != 1 else ''})"]
        for (mode, workers, used), group in groups.items():
            top = max(group, key=lambda c: c.rate)
            who = "one router carries" if used == 1 else (f"{used} routers, each in front of about {top.share(used)} "
                                                          "workers with its share of the clients, carry")
            lines.append(f"router: {mode}, {workers} workers: {who} every rate here (at most "
                         f"{100 * top.rate / top.capacity:.0f}% of about {top.capacity:.0f} req/s of "
                         f"{top.tokens:.0f} streamed tokens)")
        return lines
    first: dict[tuple[str, int], RouterCheck] = {}
    for c in sorted(over, key=lambda c: c.rate):
        first.setdefault((c.mode, c.workers), c)
    return ["router: " + c.advice() for c in first.values()]
