"""What a simulated run predicts (TTFT and TPOT percentiles, SLO attainment, goodput), the choice among layouts,
and the table `pdcluster plan` prints."""
from __future__ import annotations

import math
from dataclasses import dataclass

from scripts.planner.config import SLO
from scripts.planner.sim import SimRequest

ATTAINMENT = 0.9  # a layout sustains a rate when this share of its requests meet both SLOs


@dataclass(frozen=True)
class Point:
    """One layout at one rate."""

    layout: str
    rate: float
    requests: int
    ttft_p50: float
    ttft_p90: float
    tpot_p50: float
    tpot_p90: float
    attainment: float  # share of requests meeting both SLOs (a refused one meets neither)
    goodput: float  # requests/s meeting both SLOs, over the time from the first arrival to the last completion
    refused: int = 0  # requests the router refused (its queue was full); the percentiles are of the others

    @property
    def sustained(self) -> bool:
        return self.attainment >= ATTAINMENT


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summarize(layout: str, rate: float, requests: list[SimRequest], slo: SLO) -> Point:
    served = [r for r in requests if not r.refused]
    if not served:
        return Point(layout, rate, len(requests), *[math.inf] * 4, 0.0, 0.0, len(requests))
    ttfts = [r.ttft for r in served]
    tpots = [r.tpot for r in served]
    met = sum(slo.met(r) for r in served)
    span = max(r.done for r in served) - min(r.arrival for r in requests)
    return Point(layout, rate, len(requests), percentile(ttfts, 50), percentile(ttfts, 90), percentile(tpots, 50),
                 percentile(tpots, 90), met / len(requests), met / span if span > 0 else math.inf,
                 len(requests) - len(served))


def score(points: list[Point], slo: SLO) -> tuple[float, float, float]:
    """How good a layout is over the rates, best highest: the highest rate it sustains (0: none); at the highest
    rate tried, the share of its requests within both SLOs; and its headroom there (how far its worse p90 stays
    under its SLO: 1 - the larger of TTFT p90 / SLO and TPOT p90 / SLO)."""
    best = max((p.rate for p in points if p.sustained), default=0.0)
    top = max(points, key=lambda p: p.rate)
    return best, round(top.attainment, 3), 1 - max(top.ttft_p90 / slo.ttft, top.tpot_p90 / slo.tpot)


def recommend(results: dict[str, list[Point]], slo: SLO) -> tuple[str, str]:
    """The best layout and why, in one line."""
    scores = {name: score(points, slo) for name, points in results.items()}
    name = max(scores, key=scores.get)
    runner = max((n for n in scores if n != name), key=scores.get, default=None)
    return name, f"{_reading(scores[name])}" + (f"; next best {runner}: {_reading(scores[runner])}" if runner else "")


def _reading(s: tuple[float, float, float]) -> str:
    rate, attained, headroom = s
    sustained = f"sustains {rate:g} req/s" if rate else "sustains no rate tried"
    return f"{sustained}, {100 * attained:.1f}% within both SLOs at the highest rate, headroom {100 * headroom:.0f}%"


def table(results: dict[str, list[Point]]) -> str:
    head = (f"{'layout':<22} {'rate':>7} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} {'TPOT p90':>9} "
            f"{'in SLO':>7} {'goodput':>8} {'refused':>7}")
    lines = [head, "-" * len(head)]
    for name, points in results.items():
        for p in points:
            lines.append(f"{name:<22} {p.rate:>7g} {_ms(p.ttft_p50)} {_ms(p.ttft_p90)} {_ms(p.tpot_p50)} "
                         f"{_ms(p.tpot_p90)} {100 * p.attainment:>6.1f}% {p.goodput:>8.3g} {p.refused:>7}")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:>7.1f}ms"
