"""The planner against a measurement: `pdcluster plan --validate RESULTS.json --profile P` simulates each mode of a
`pdcluster bench` run (its workers, GPUs per worker, placement and disaggregation policy) on the same requests
(rebuilt by the bench's own builders from its recorded settings and checked against its records) sent at the
times the bench sent them, and sets the predictions beside the measurements: TTFT p50/p90, TPOT p50/p90 and
goodput per mode and load point, with each prediction's error. Both sides are summed up by the bench's own
`summarize` (scripts/bench_metrics.py) under the SLO the bench judged by.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from router.config import RouterConfig
from scripts.bench_config import DEFAULT_NUM_REQUESTS, POLICY_VARIANTS, BenchConfig, mode_variants
from scripts.bench_hardware import tensor_parallel_size
from scripts.bench_metrics import SLO, RequestRecord, summarize
from scripts.bench_workloads import read_trace
from scripts.benchmark import build_requests, point_requests
from scripts.planner.config import DEFAULT_VOCAB
from scripts.planner.profile import Profile
from scripts.planner.report import Point, point
from scripts.planner.report import summarize as predict_summary
from scripts.planner.sim import Layout, SimRequest, Simulation, Workload

TOLERANCE = 0.15  # a prediction within this share of the measurement agrees
METRICS = (("TTFT p50", "ttft_p50"), ("TTFT p90", "ttft_p90"), ("TPOT p50", "tpot_p50"), ("TPOT p90", "tpot_p90"),
           ("goodput", "goodput"))
BUSY = "engines busy (s)"  # a diagnosis beside the metrics, not one of them


class ValidationError(ValueError):
    """Results that cannot be replayed: the message says what is missing or does not match."""


@dataclass
class Row:
    """One mode at one load point: predicted and measured."""

    mode: str
    layout: str
    load: str
    predicted: Point
    measured: Point
    offset_s: float = 0.0  # the mode's unloaded offset, added to every predicted request (`unloaded_offset`)
    note: str = ""  # what the simulation of this mode could not take from the run (said under the table)
    busy: tuple[float, float] | None = None  # the engines' busy seconds, simulated and measured (`busy_seconds`)

    def error(self, key: str) -> float:
        """(predicted - measured) / measured; 0 when both are 0, inf when only the measurement is."""
        p, m = getattr(self.predicted, key), getattr(self.measured, key)
        if p == m:
            return 0.0
        return math.inf if m == 0 or not math.isfinite(m) else (p - m) / m


# ---- what the bench ran -------------------------------------------------------------------------
def bench_config(results: dict) -> BenchConfig:
    """The run's settings (fields unknown to this version dropped, missing ones at their defaults)."""
    known = {f.name for f in dataclasses.fields(BenchConfig)}
    return BenchConfig(**{k: v for k, v in results["config"].items() if k in known})


def vocab_size(results: dict, cfg: BenchConfig) -> int:
    """The vocabulary the prompts were drawn from: recorded, given, or the model's (results from before it was
    recorded); else Qwen3's."""
    if results.get("vocab_size"):
        return results["vocab_size"]
    if cfg.vocab_size:
        return cfg.vocab_size
    try:
        return int(json.loads((Path(cfg.model or "") / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_VOCAB


def layout_of(run: dict, cfg: BenchConfig, profile: Profile) -> Layout:
    """The cluster one mode ran, as the simulator's layout."""
    base, variants = mode_variants(run["mode"])
    router = RouterConfig(model="simulated", mode=base)
    policy = next((v for v in variants if v in POLICY_VARIANTS), router.disagg_policy)
    placement = next((v for v in variants if v not in POLICY_VARIANTS), router.placement)
    hw = run.get("hardware")
    tp = tensor_parallel_size(cfg.serve_args)
    if tp != profile.tp:
        raise ValidationError(f"{run['mode']}: the bench ran TP {tp}, the profile is of TP {profile.tp}")
    if base == "disagg":
        workers = hw["workers"] if hw else {"prefill": cfg.prefill_workers, "decode": cfg.decode_workers}
        per = cfg.gpus_per_worker
        counts = dict(prefill=workers["prefill"], decode=workers["decode"])
    else:
        workers = hw["workers"] if hw else {"colocated": cfg.workers}
        per = cfg.colocated_gpus_per_worker or cfg.gpus_per_worker
        counts = dict(colocated=workers["colocated"])
    if hw and hw.get("device") == "cuda":
        per = hw["gpus_per_worker"] / tp
    elif hw and hw.get("device") == "cpu":
        per = 1.0  # CPU workers split the cores: a CPU profile measured one worker's share
    return Layout(**counts, policy=policy, placement=placement, local_prefill_chunk=router.local_prefill_chunk,
                  tp=tp, gpus_per_engine=per)


def run_transport(run: dict) -> str | None:
    """The KV transport most of the run's handoffs took, as its prefill workers recorded them (None: no handoffs,
    or results from before they were recorded)."""
    counts: dict[str, int] = {}
    for measured in run["points"]:
        for engine in measured.get("engines") or []:
            for transport, h in (engine.get("handoffs") or {}).items():
                counts[transport] = counts.get(transport, 0) + h["count"]
    return max(counts, key=counts.get) if counts else None


def with_transport(layout: Layout, run: dict, profile: Profile) -> tuple[Layout, str]:
    """The layout with its handoffs over the transport the run used, and a note where the profile has no cost for
    it (then the profile's fastest stands in)."""
    used = run_transport(run)
    if used is None:
        return layout, ""
    layout = dataclasses.replace(layout, transport=used)
    if (stand_in := profile.cost_transport(used)) == used:
        return layout, ""
    return layout, (f"{run['mode']}: the run's KV handoffs went over {used}, which the profile has no cost for (it "
                    f"has {', '.join(profile.handoff)}; `pdcluster profile` measures nccl on two GPUs): costed as "
                    f"{stand_in}")


def run_trace(cfg: BenchConfig) -> list | None:
    """The trace a trace run replayed (from where it started), as the bench read it; None for other workloads."""
    return read_trace(cfg.trace, cfg.trace_start) if cfg.trace else None


def workload_of(results: dict, cfg: BenchConfig, index: int, records: list[RequestRecord]) -> Workload:
    """Load point `index`'s requests, rebuilt as the bench built them, sent when the bench sent them (in the
    order built: the bench sends them in that order)."""
    trace = run_trace(cfg)
    n = cfg.num_requests or (len(trace) if trace is not None else DEFAULT_NUM_REQUESTS)
    requests = point_requests(cfg, index, n, vocab_size(results, cfg), trace)
    records = sorted(records, key=lambda r: r.index)
    if [(len(r.prompt_ids), r.output_len) for r in requests] != [(r.prompt_len, r.output_len) for r in records]:
        raise ValidationError(f"load point {index}: the rebuilt requests differ from the recorded ones (prompt "
                              "and output lengths): another vocabulary size or trace than the run's?")
    return Workload([r.start for r in records], [r.prompt_ids for r in requests], [r.output_len for r in requests],
                    cfg.workload == "shared-prefix")


@dataclass
class Served:
    """A mode's run as the bench served it (scripts/benchmark.py, `bench_cluster`): one cluster through its warm-up,
    its unloaded requests one at a time, then its load points, each phase begun once the one before has finished.
    Simulated as one run, what the cluster learns in one phase (the router's per-request policy, the prefix caches)
    carries into the next, as it did when served."""

    workload: Workload
    unloaded: list[RequestRecord]  # measured, one a phase after the warm-up's
    first_point: int  # the phase of the first load point


def served(results: dict, run: dict, cfg: BenchConfig, points: list[Workload]) -> Served:
    """The run's phases, rebuilt by the bench's builders: the warm-up (all at once), each unloaded request, each
    load point at its send times (a phase of none where the run recorded no warm-up)."""
    unloaded = sorted((RequestRecord.from_json(r) for r in (run.get("unloaded") or {}).get("requests", [])),
                      key=lambda r: r.index)
    vocab, trace = vocab_size(results, cfg), run_trace(cfg)
    warm = (run.get("warmup") or {}).get("requests", 0)
    before = build_requests(cfg, random.Random(f"{cfg.seed}:warmup"), warm, vocab, trace) if warm else []
    if unloaded:
        alone = build_requests(cfg, random.Random(f"{cfg.seed}:unloaded"), cfg.unloaded_requests, vocab, trace)
        if [len(r.prompt_ids) for r in alone][:len(unloaded)] != [r.prompt_len for r in unloaded]:
            raise ValidationError("the unloaded requests differ from the recorded ones (prompt lengths)")
        before += alone[:len(unloaded)]
    phases = [warm] + [1] * len(unloaded) + [len(w.arrivals) for w in points]
    workload = Workload([0.0] * len(before) + [t for w in points for t in w.arrivals],
                        [r.prompt_ids for r in before] + [p for w in points for p in w.prompts],
                        [r.output_len for r in before] + [n for w in points for n in w.output_lens],
                        any(w.shared_prefixes for w in points), phases=phases)
    return Served(workload, unloaded, len(phases) - len(points))


def unloaded_offset(unloaded: list[RequestRecord], simulated: list[SimRequest]) -> float:
    """What a request meets outside the simulated steps, from the bench's unloaded reference (requests one at a
    time): the median of measured minus simulated TTFT, at least 0. It holds the client -> router -> worker messages
    and the streamed token back, disaggregated the reserve round trip and the `kv_handoff` message, and how far this
    run's eager prefill floor lies from the profile's (it varies by some milliseconds from run to run). 0 when
    the run has no unloaded requests."""
    pairs = [(m.ttft, s.ttft) for m, s in zip(unloaded, simulated) if m.ttft is not None and s.first is not None]
    return max(0.0, statistics.median(m - s for m, s in pairs)) if pairs else 0.0


def busy_seconds(sim: Simulation, phase: int, measured: dict, layout: Layout) -> tuple[float, float] | None:
    """The engines' busy seconds in one phase, summed, simulated and measured: how the profile costs the steps this
    load made, apart from how long requests waited for them. None where engines share GPUs (a step's wall time there
    holds the other engine's turns) or the run recorded none."""
    engines = measured.get("engines") or []
    if layout.gpus_per_engine < 1 or not engines or any("busy_seconds" not in e for e in engines):
        return None
    start, end = sim.phase_busy[phase], sim.phase_busy[phase + 1]
    return sum(end[n] - start[n] for n in end), sum(e["busy_seconds"] for e in engines)


def shifted(requests: list, offset: float) -> list:
    """Every request's first and last token `offset` later (what the client sees of them)."""
    for req in requests:
        if req.first is not None:
            req.first += offset
            req.done += offset
    return requests


def since(requests: list[SimRequest], start: float) -> list[SimRequest]:
    """The requests' times counted from `start` (a phase's, as the bench counts each load point's)."""
    for req in requests:
        req.arrival -= start
        if req.first is not None:
            req.first -= start
            req.done -= start
    return requests


# ---- predictions beside measurements ------------------------------------------------------------
def validate(results: dict, profile: Profile) -> list[Row]:
    cfg = bench_config(results)
    slo = SLO(results["slo"]["ttft"], results["slo"]["tpot"]) if results.get("slo") else SLO(1.0, 0.05)
    workloads: dict[int, Workload] = {}
    rows = []
    for run in results["runs"]:
        layout, note = with_transport(layout_of(run, cfg, profile), run, profile)
        points, measured_records = [], []
        for i, measured in enumerate(run["points"]):
            records = [RequestRecord.from_json(r) for r in measured["requests"]]
            if i not in workloads:  # the same requests in every mode (rebuilt and checked once)
                workloads[i] = workload_of(results, cfg, i, records)
            sent = [r.start for r in sorted(records, key=lambda r: r.index)]  # each mode at its own send times
            points.append(dataclasses.replace(workloads[i], arrivals=sent, keys={}))
            measured_records.append(records)
        replay = served(results, run, cfg, points)
        simulation = Simulation(profile, layout, replay.workload)
        simulation.run()
        alone = range(replay.first_point - len(replay.unloaded), replay.first_point)  # one unloaded request a phase
        offset = unloaded_offset(replay.unloaded, [r for k in alone for r in simulation.phase(k)])
        for i, (measured, records) in enumerate(zip(run["points"], measured_records)):
            phase = replay.first_point + i
            requests = shifted(since(simulation.phase(phase), simulation.phase_starts[phase]), offset)
            load = measured["load"]
            rate = load["value"] if load["value"] is not None else math.inf
            rows.append(Row(run["mode"], str(layout), load["label"], predict_summary(str(layout), rate, requests, slo),
                            point(run["mode"], rate, summarize(records, slo)), offset, note,
                            busy_seconds(simulation, phase, measured, layout)))
    return rows


# ---- the table ----------------------------------------------------------------------------------
def _value(key: str, x: float) -> str:
    if not math.isfinite(x):
        return "inf"
    return f"{x:.2f}" if key == "goodput" else f"{1e3 * x:.1f}"


def _error(e: float) -> str:
    return "inf" if not math.isfinite(e) else f"{100 * e:+.1f}%"


def cell(row: Row, key: str) -> str:
    """`predicted / measured (error)`: milliseconds, or requests/s for goodput."""
    return (f"{_value(key, getattr(row.predicted, key))} / {_value(key, getattr(row.measured, key))} "
            f"({_error(row.error(key))})")


def busy_cell(row: Row) -> str:
    """`predicted / measured (error)` of the engines' busy seconds; not judged against the tolerance."""
    if row.busy is None:
        return "n/a"
    p, m = row.busy
    return f"{p:.2f} / {m:.2f} ({_error((p - m) / m) if m else 'inf'})"


def label(row: Row) -> str:
    return f"{row.mode} ({row.layout}; +{1e3 * row.offset_s:.1f} ms)"


def beyond(row: Row, key: str, tolerance: float) -> bool:
    return not abs(row.error(key)) <= tolerance


def headers() -> list[str]:
    return ["mode (simulated as)", "load"] + [f"{name} ({'req/s' if key == 'goodput' else 'ms'})"
                                             for name, key in METRICS] + [BUSY]


def notes(rows: list[Row]) -> list[str]:
    """Each mode's note, once."""
    return list(dict.fromkeys(r.note for r in rows if r.note))


def table(rows: list[Row], tolerance: float = TOLERANCE) -> str:
    """The text table: each cell predicted / measured (error), `!` where the error is beyond `tolerance`."""
    body = [[label(r), r.load] + [cell(r, k) + ("!" if beyond(r, k, tolerance) else " ")
                                                 for _, k in METRICS] + [busy_cell(r)] for r in rows]
    widths = [max(len(line[i]) for line in [headers(), *body]) for i in range(len(headers()))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers(), widths))]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in body]
    return "\n".join(lines + [f"note: {n}" for n in notes(rows)])


def markdown(rows: list[Row], profile: Profile, source: str, tolerance: float = TOLERANCE) -> str:
    missed = sum(beyond(r, k, tolerance) for r in rows for _, k in METRICS)
    lines = [f"Predicted (`pdcluster plan`, profile of {profile.model} on {profile.machine}) / measured "
             f"(`pdcluster bench`, {source}) (error); **bold**: beyond {100 * tolerance:g}%. "
             f"{missed} of {len(rows) * len(METRICS)} cells beyond.", "",
             "| " + " | ".join(headers()) + " |", "|---|---|" + "---:|" * (len(METRICS) + 1)]
    for r in rows:
        cells = [f"**{cell(r, k)}**" if beyond(r, k, tolerance) else cell(r, k) for _, k in METRICS] + [busy_cell(r)]
        lines.append(f"| {label(r)} | {r.load} | " + " | ".join(cells) + " |")
    lines += [""] + [f"Note: {n}" for n in notes(rows)] if notes(rows) else []
    return "\n".join(lines) + "\n"


def to_json(rows: list[Row], tolerance: float = TOLERANCE) -> list[dict]:
    return [{"mode": r.mode, "layout": r.layout, "load": r.load, "unloaded_offset_s": r.offset_s, "note": r.note,
             "metrics": {k: {"predicted": _finite(getattr(r.predicted, k)), "measured": _finite(getattr(r.measured, k)),
                             "error": _finite(r.error(k)), "beyond": beyond(r, k, tolerance)} for _, k in METRICS},
             "attainment": {"predicted": r.predicted.attainment, "measured": r.measured.attainment},
             "busy_seconds": None if r.busy is None else {"predicted": r.busy[0], "measured": r.busy[1]}}
            for r in rows]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
