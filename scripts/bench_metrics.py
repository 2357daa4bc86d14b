"""Benchmark metrics: what one request measured at the client, and a load point's summary of them.

Latencies are seconds. TTFT runs from submitting to the first streamed token, ITL between streamed
deltas that carry tokens, TPOT = (e2e - ttft) / (output tokens - 1). Only requests that finished count
in latencies and throughput; failed ones are counted apart and miss every SLO.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field, fields

PERCENTILES = (50, 90, 99)
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E latency"))  # a summary's latencies


@dataclass
class RequestRecord:
    index: int
    prompt_len: int
    output_len: int  # asked for (ignore_eos: also what should come back)
    start: float  # seconds after the load point's start
    end: float
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0  # received
    finish_reason: str | None = None
    error_code: str | None = None  # set when the request failed
    error: str | None = None
    # The router's own clock (the Timings of its answer): from arrival there to dispatch, and to its first token.
    # Beside `ttft`, they split a first token's wait into router queue, workers, and the path back to the client.
    router_queued: float | None = None
    router_ttft: float | None = None
    router_reserved: float | None = None  # disaggregated: arrival at the router to the reservation's answer

    @property
    def ok(self) -> bool:
        return self.error_code is None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> dict:
        """The record (ITLs to the microsecond), plus e2e and tpot."""
        out = asdict(self)
        out["itl"] = [round(gap, 6) for gap in self.itl]
        return {**out, "e2e": self.e2e, "tpot": self.tpot}

    @classmethod
    def from_json(cls, d: dict) -> RequestRecord:
        """A record as to_json wrote it; fields a results file from before them lacks keep their defaults."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass(frozen=True)
class SLO:
    ttft: float  # seconds
    tpot: float

    def met(self, r: RequestRecord) -> bool:
        """Finished, first token in time, and every later token in time on average (one-token answers have no TPOT)."""
        if not r.ok or r.ttft is None or r.ttft > self.ttft:
            return False
        tpot = r.tpot
        return tpot is None or tpot <= self.tpot


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Dist:
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: list[float]) -> Dist:
        mean = sum(values) / len(values) if values else None
        return cls(mean, *(percentile(values, q) for q in PERCENTILES))


@dataclass(frozen=True)
class Summary:
    requests: int
    completed: int
    failed: int
    wrong_length: int  # finished with another number of tokens than asked for
    errors: dict[str, int]  # error code -> failed requests
    duration: float  # from the load point's start to the last request's end
    request_throughput: float  # completed requests/s
    output_throughput: float  # output tokens/s of completed requests
    input_throughput: float  # prompt tokens/s of completed requests
    goodput: float  # requests/s meeting the SLO
    slo_attainment: float  # share of all requests meeting the SLO
    ttft: Dist
    tpot: Dist
    itl: Dist
    e2e: Dist
    router_ttft: Dist  # the same first tokens by the router's clock (RequestRecord.router_ttft)
    # TTFT less the router's own, per request: the submit's way in, the first token's way out, the client's process
    outside_ttft: Dist


def judge(records: list[RequestRecord], slo: SLO, duration: float) -> tuple[float, float]:
    """(goodput, SLO attainment) of a load point's requests."""
    good = sum(slo.met(r) for r in records)
    return (good / duration if duration > 0 else 0.0), (good / len(records) if records else 0.0)


def summarize(records: list[RequestRecord], slo: SLO) -> Summary:
    done = [r for r in records if r.ok]
    duration = max((r.end for r in records), default=0.0)

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    goodput, attainment = judge(records, slo, duration)
    return Summary(
        requests=len(records),
        completed=len(done),
        failed=len(records) - len(done),
        wrong_length=sum(r.output_tokens != r.output_len for r in done),
        errors=dict(Counter(r.error_code for r in records if not r.ok)),
        duration=duration,
        request_throughput=per_s(len(done)),
        output_throughput=per_s(sum(r.output_tokens for r in done)),
        input_throughput=per_s(sum(r.prompt_len for r in done)),
        goodput=goodput,
        slo_attainment=attainment,
        ttft=Dist.of([r.ttft for r in done if r.ttft is not None]),
        tpot=Dist.of([t for r in done if (t := r.tpot) is not None]),
        itl=Dist.of([gap for r in done for gap in r.itl]),
        e2e=Dist.of([r.e2e for r in done]),
        router_ttft=Dist.of([r.router_ttft for r in done if r.router_ttft is not None]),
        outside_ttft=Dist.of([r.ttft - r.router_ttft for r in done
                              if r.ttft is not None and r.router_ttft is not None]),
    )
