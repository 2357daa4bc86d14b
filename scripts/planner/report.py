"""What a simulated run predicts (TTFT and TPOT percentiles, SLO attainment, goodput), the choice among layouts,
and the table `pdcluster plan` prints."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scripts.bench_metrics import SLO, RequestRecord, Summary
from scripts.bench_metrics import summarize as bench_summarize
from scripts.planner.workload import SimRequest

ATTAINMENT = 0.9  # a layout sustains a rate when this share of its requests meet both SLOs
# A load point's arrivals should span this many of a request's decode lives (median, first token to last): over a
# shorter span the decode batches are still filling when the arrivals end, and TPOT comes out low (docs/planner.md,
# "Requests per rate")
STEADY_LIVES = 4.0


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
    goodput: float  # requests/s meeting both SLOs, over the time from the point's start to the last completion
    refused: int = 0  # requests the router refused (its queue was full); the percentiles are of the others
    span_s: float = 0.0  # simulated: from the first arrival to the last
    life_s: float = 0.0  # simulated: a served request's median time from its first token to its last (a decode seat)

    @property
    def sustained(self) -> bool:
        return self.attainment >= ATTAINMENT


def records(requests: list[SimRequest]) -> list[RequestRecord]:
    """The simulated requests as `pdcluster bench` records what it measures, so both sides are summed up by one
    function (scripts/bench_metrics.py's `summarize`): the same TTFT, TPOT, percentiles, goodput and attainment.
    A request the router refused is a failed one, as the bench records the router's `overloaded` answer."""
    out = []
    for i, r in enumerate(requests):
        done = r.done if not r.refused else r.arrival
        out.append(RequestRecord(index=i, prompt_len=len(r.attempt_ids), output_len=r.output_len, start=r.arrival,
                                 end=done, ttft=None if r.refused else r.ttft,
                                 output_tokens=0 if r.refused else r.output_len,
                                 finish_reason=None if r.refused else "length", error_code=r.refused or None))
    return out


def point(layout: str, rate: float, summary: Summary) -> Point:
    """A bench or simulated summary as one row of the table (no served request: latencies infinite)."""
    def stat(value: float | None) -> float:
        return math.inf if value is None else value

    return Point(layout, rate, summary.requests, stat(summary.ttft.p50), stat(summary.ttft.p90),
                 stat(summary.tpot.p50), stat(summary.tpot.p90), summary.slo_attainment, summary.goodput,
                 summary.errors.get("overloaded", 0))


def summarize(layout: str, rate: float, requests: list[SimRequest], slo: SLO,
              recorded: list[RequestRecord] | None = None) -> Point:
    """`recorded`: the requests' `records`, made already."""
    lives = sorted(r.done - r.first for r in requests if r.done is not None and not r.refused)
    span = max(r.arrival for r in requests) - min(r.arrival for r in requests) if requests else 0.0
    recorded = records(requests) if recorded is None else recorded
    return dataclasses.replace(point(layout, rate, bench_summarize(recorded, slo)), span_s=span,
                               life_s=lives[len(lives) // 2] if lives else 0.0)


def short_spans(results: dict[str, list[Point]], requests: int) -> list[str]:
    """A line for each rate whose arrivals span fewer than STEADY_LIVES of a request's decode life in some layout that
    sustains it (an overloaded one's lives grow with the requests: more only show its overload), with the requests
    a rate that would span them."""
    lines = []
    for rate in sorted({p.rate for points in results.values() for p in points}):
        at = [p for points in results.values() for p in points if p.rate == rate and p.life_s > 0 and p.sustained]
        short = [p for p in at if p.span_s < STEADY_LIVES * p.life_s]
        if short:
            worst = max(short, key=lambda p: p.life_s / max(p.span_s, 1e-9))
            need = math.ceil(requests * STEADY_LIVES * worst.life_s / max(worst.span_s, 1e-9))
            lines.append(f"at {rate:g} req/s the {requests} requests arrive within {worst.span_s:.2f} s, under "
                         f"{STEADY_LIVES:g} times a request's decode ({worst.layout}: {worst.life_s:.2f} s, first to "
                         f"last token, at the median): in {len(short)} of {len(at)} layouts that sustain it the "
                         f"batches were still filling when the arrivals ended, so their TPOT is low; --num-requests "
                         f"{need} or more (a request's decode lengthens as the batches fill)")
    return lines


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
    width = max([22, *map(len, results)])
    head = (f"{'layout':<{width}} {'rate':>7} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} {'TPOT p90':>9} "
            f"{'in SLO':>7} {'goodput':>8} {'refused':>7}")
    lines = [head, "-" * len(head)]
    for name, points in results.items():
        for p in points:
            lines.append(f"{name:<{width}} {p.rate:>7g} {_ms(p.ttft_p50)} {_ms(p.ttft_p90)} {_ms(p.tpot_p50)} "
                         f"{_ms(p.tpot_p90)} {100 * p.attainment:>6.1f}% {p.goodput:>8.3g} {p.refused:>7}")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:>7.1f}ms"


FIGURES = {"ttft_p50": "TTFT p50", "ttft_p90": "TTFT p90", "tpot_p50": "TPOT p50", "tpot_p90": "TPOT p90",
           "goodput": "goodput"}


def moved(first: list[Point], second: list[Point]) -> dict[str, float]:
    """The most each figure moved from one simulation of a layout to another (`second` against `first`, as a share
    of `first`), over the rates where both are finite."""
    out = {}
    for name in FIGURES:
        shares = [abs(getattr(b, name) / getattr(a, name) - 1) for a, b in zip(first, second)
                  if math.isfinite(getattr(a, name)) and math.isfinite(getattr(b, name)) and getattr(a, name) > 0]
        out[name] = max(shares, default=math.nan)
    return out


def _moves(moves: dict[str, float]) -> str:
    return ", ".join(f"{FIGURES[figure]} {100 * share:.0f}%" for figure, share in moves.items() if math.isfinite(share))


def noise_line(name: str, seed: int, moves: dict[str, float]) -> str:
    return (f"noise: {name} again on another draw of the workload (--seed {seed}), the most each figure moved over "
            f"the rates: {_moves(moves)}. Layouts closer than that differ by the draw (more --num-requests narrows it)")


def machine_line(name: str, share: float, first: list[Point], slower: list[Point], slo: SLO) -> str:
    """How much `name`'s figures hang on the machine's pace: `slower`, its simulation on GPUs `share` slower in every
    step, against `first`; and the highest rate it still sustains there."""
    rate, before = score(slower, slo)[0], score(first, slo)[0]
    sustains = ("it sustains no rate tried" if not rate else f"it still sustains {rate:g} req/s" if rate == before
                else f"it sustains {rate:g} req/s instead of {before:g}")
    return (f"machine: {name} on GPUs {100 * share:g}% slower in every step (machines of one kind differ by a few "
            f"percent; --slower-gpus), the most each figure moved over the rates: {_moves(moved(first, slower))}; "
            f"{sustains}")
