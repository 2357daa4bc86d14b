"""The planner against a measurement: `pdcluster plan --validate RESULTS.json --profile P` simulates each mode of a
`pdcluster bench` run (its workers, GPUs per worker, placement and disaggregation policy) on the same requests
(rebuilt by the bench's own builders from its recorded settings and checked against its records) sent at the
times the bench sent them, and sets the predictions beside the measurements: TTFT p50/p90, TPOT p50/p90 and
goodput per mode and load point, with each prediction's error. Both sides are summed up by the bench's own
`summarize` (scripts/bench_metrics.py) under the SLO the bench judged by. The run is rebuilt by
scripts/planner/bench_replay.py.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
import statistics
from dataclasses import dataclass

from scripts.bench_metrics import SLO, RequestRecord, percentile, summarize
from scripts.planner.bench_replay import bench_config, layout_of, served, with_transport, workload_of
from scripts.planner.layout import Layout
from scripts.planner.profile import Profile
from scripts.planner.report import Point, point
from scripts.planner.report import summarize as predict_summary
from scripts.planner.sim import Simulation
from scripts.planner.workload import SimRequest, Workload

TOLERANCE = 0.15  # a prediction within this share of the measurement agrees
METRICS = (("TTFT p50", "ttft_p50"), ("TTFT p90", "ttft_p90"), ("TPOT p50", "tpot_p50"), ("TPOT p90", "tpot_p90"),
           ("goodput", "goodput"))
BUSY = "engines busy (s)"  # a diagnosis beside the metrics, not one of them
PATHS = ("remote", "local", "colocated")  # how a request was served (`path`)


@dataclass
class Row:
    """One mode at one load point: predicted and measured."""

    mode: str
    layout: str
    load: str
    predicted: Point
    measured: Point
    offset_s: float = 0.0  # the mode's unloaded offset over all its unloaded requests (`unloaded_offset`)
    # What was added to the predicted requests of each path (`unloaded_offsets`); empty: `offset_s` to all
    offsets: dict[str, float] = dataclasses.field(default_factory=dict)
    borrowed: tuple[str, ...] = ()  # the paths whose offset came from the other runs validated with it (`validate`)
    note: str = ""  # what the simulation of this mode could not take from the run (said under the table)
    busy: tuple[float, float] | None = None  # the engines' busy seconds, simulated and measured (`busy_seconds`)
    # Where each latency prediction falls among the measured requests' values: the percentile it is of them
    # (`rank_of`). A p50 that falls in a gap between two groups of requests misses by far in value, not in rank.
    ranks: dict[str, float] = dataclasses.field(default_factory=dict)
    spans: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)  # the measured values 10 points
    # of rank either side of the cell's percentile
    # A missed latency cell's prediction on GPUs a share slower (> 0) or faster (< 0) in every step: (share, value)
    reach: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    def error(self, key: str) -> float:
        """(predicted - measured) / measured; 0 when both are 0, inf when only the measurement is."""
        p, m = getattr(self.predicted, key), getattr(self.measured, key)
        if p == m:
            return 0.0
        return math.inf if m == 0 or not math.isfinite(m) else (p - m) / m


def path(req: SimRequest) -> str:
    """How the simulated router served a request: `remote` (prefilled on a prefill worker, its KV handed over),
    `local` (prefilled by its decode worker) or `colocated`."""
    if req.estimate is None:
        return "colocated"
    return "local" if req.estimate.local else "remote"


def served_path(record: RequestRecord, simulated: SimRequest) -> str:
    """The path the served router took for a request: remote where it recorded a reservation, else local in a
    disaggregated cluster; the simulated one's where the run recorded no router timings (older results)."""
    if record.router_ttft is None or path(simulated) == "colocated":
        return path(simulated)
    return "remote" if record.router_reserved is not None else "local"


def unloaded_offsets(unloaded: list[RequestRecord], simulated: list[SimRequest]) -> dict[str, float]:
    """What a request meets outside the simulated steps, from the bench's unloaded reference (requests one at a
    time), for each path: the median of measured minus simulated TTFT over the unloaded requests served and
    simulated on that path, at least 0. It holds the client -> router -> worker messages and the streamed token
    back; on the remote path also the reserve round trip and the `kv_handoff` message; and how far this run's eager
    prefill floor lies from the profile's (it varies by some milliseconds from run to run). A request the router
    served on one path and the simulation on the other says nothing of either. Empty without unloaded requests."""
    gaps: dict[str, list[float]] = {}
    for m, s in zip(unloaded, simulated):
        if m.ttft is not None and s.first is not None and served_path(m, s) == path(s):
            gaps.setdefault(path(s), []).append(m.ttft - s.ttft)
    return {p: max(0.0, statistics.median(g)) for p, g in gaps.items()}


def unloaded_offset(unloaded: list[RequestRecord], simulated: list[SimRequest]) -> float:
    """The same over every path at once (0 without unloaded requests)."""
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
@dataclass
class Replayed:
    """One mode's run simulated as the bench served it, its rows still to make: the offset of a path its unloaded
    requests did not take may come from the other runs validated with it."""

    run: dict
    slo: SLO
    layout: Layout
    note: str
    simulation: Simulation
    first_point: int  # the simulation's phase of the run's first load point
    records: list[list[RequestRecord]]  # measured, per load point
    offset: float  # over all its unloaded requests (`unloaded_offset`)
    offsets: dict[str, float]  # per path its unloaded requests took (`unloaded_offsets`)

    def point(self, i: int) -> list[SimRequest]:
        phase = self.first_point + i
        return since(self.simulation.phase(phase), self.simulation.phase_starts[phase])


def replay_run(results: dict, run: dict, profile: Profile, workloads: dict[int, Workload]) -> Replayed:
    """One mode of a results.json, simulated through its warm-up, unloaded requests and load points; `workloads`
    holds each load point's rebuilt requests, shared by the results' modes (rebuilt and checked once)."""
    cfg = bench_config(results)
    slo = SLO(results["slo"]["ttft"], results["slo"]["tpot"]) if results.get("slo") else SLO(1.0, 0.05)
    layout, note = with_transport(layout_of(run, cfg, profile), run, profile)
    points, measured_records = [], []
    for i, measured in enumerate(run["points"]):
        records = [RequestRecord.from_json(r) for r in measured["requests"]]
        if i not in workloads:
            workloads[i] = workload_of(results, cfg, i, records)
        sent = [r.start for r in sorted(records, key=lambda r: r.index)]  # each mode at its own send times
        points.append(dataclasses.replace(workloads[i], arrivals=sent, keys={}))
        measured_records.append(records)
    replay = served(results, run, cfg, points)
    simulation = Simulation(profile, layout, replay.workload)
    simulation.run()
    alone = [r for k in range(replay.first_point - len(replay.unloaded), replay.first_point)
             for r in simulation.phase(k)]  # one unloaded request a phase
    return Replayed(run, slo, layout, note, simulation, replay.first_point, measured_records,
                    unloaded_offset(replay.unloaded, alone), unloaded_offsets(replay.unloaded, alone))


def validate(results: dict | list[dict], profile: Profile) -> list[Row]:
    """Rows for every mode of one results.json, or of several from one machine: then a path that a mode's unloaded
    requests did not take (under `auto`, at idle, often none went remote) gets the median offset of the others'
    unloaded requests on that path."""
    runs = [replay_run(r, run, profile, {}) for r in ([results] if isinstance(results, dict) else results)
            for run in r["runs"]]
    rows = []
    for replayed in runs:
        points = [replayed.point(i) for i in range(len(replayed.records))]
        taken = {path(r) for requests in points for r in requests if r.first is not None}
        offsets = {p: replayed.offsets.get(p, replayed.offset) for p in taken}
        borrowed = {p: statistics.median(o.offsets[p] for o in runs if p in o.offsets) for p in taken
                    if p not in replayed.offsets and any(p in o.offsets for o in runs)}
        offsets.update(borrowed)
        note = "; ".join(filter(None, [replayed.note, borrowed and borrowed_note(replayed.run["mode"], borrowed)]))
        for i, (measured, records, requests) in enumerate(zip(replayed.run["points"], replayed.records, points)):
            for p, offset in offsets.items():
                shifted([r for r in requests if r.first is not None and path(r) == p], offset)
            load = measured["load"]
            rate = load["value"] if load["value"] is not None else math.inf
            row = Row(replayed.run["mode"], str(replayed.layout), load["label"],
                      predict_summary(str(replayed.layout), rate, requests, replayed.slo),
                      point(replayed.run["mode"], rate, summarize(records, replayed.slo)), replayed.offset, offsets,
                      tuple(borrowed), note, busy_seconds(replayed.simulation, replayed.first_point + i, measured,
                                                          replayed.layout))
            rank_cells(row, records)
            rows.append(row)
    return rows


LATENCIES = {"ttft_p50": ("ttft", 50), "ttft_p90": ("ttft", 90), "tpot_p50": ("tpot", 50), "tpot_p90": ("tpot", 90)}


def machine_reach(results: dict | list[dict], profile: Profile, rows: list[Row], share: float,
                  tolerance: float = TOLERANCE) -> None:
    """For each latency cell of `rows` (`validate`'s of these results) beyond `tolerance`: its prediction on GPUs
    `share` slower in every step where it came out low, `share` faster where high (`Profile.slower`), as far as a
    machine of the kind may differ from the profile's (docs/planner.md, "One kind, many machines")."""
    for sign in (1, -1):
        cells = [(i, key) for i, r in enumerate(rows) for key in LATENCIES
                 if beyond(r, key, tolerance) and math.isfinite(r.error(key)) and (r.error(key) < 0) == (sign > 0)]
        if cells:
            other = validate(results, profile.slower(sign * share))
            for i, key in cells:
                rows[i].reach[key] = (sign * share, getattr(other[i].predicted, key))


def rank_cells(row: Row, records: list[RequestRecord]) -> None:
    """Each latency cell's prediction ranked among the measured values the cell's percentile was taken of (the
    served requests' TTFTs, their TPOTs where they have one), and the measured values 10 points either side."""
    served = [r for r in records if r.ok]
    values = {"ttft": sorted(r.ttft for r in served if r.ttft is not None),
              "tpot": sorted(t for r in served if (t := r.tpot) is not None)}
    for key, (metric, q) in LATENCIES.items():
        measured, predicted = values[metric], getattr(row.predicted, key)
        if measured and math.isfinite(predicted):
            row.ranks[key] = rank_of(measured, predicted)
            row.spans[key] = (percentile(measured, max(0, q - 10)), percentile(measured, min(100, q + 10)))


def rank_of(values: list[float], x: float) -> float:
    """The percentile (0-100) that `x` would be of sorted `values`: the inverse of bench_metrics.percentile (linear
    between the closest ranks), the middle of a run of equal values."""
    n = len(values)
    if x < values[0]:
        return 0.0
    if x > values[-1]:
        return 100.0
    if n == 1:
        return 50.0
    lo, hi = bisect.bisect_left(values, x), bisect.bisect_right(values, x)
    if lo < hi:  # equal to values[lo:hi]
        position = (lo + hi - 1) / 2
    else:  # between values[lo - 1] and values[lo]
        a, b = values[lo - 1], values[lo]
        position = lo - 1 + (x - a) / (b - a)
    return 100 * position / (n - 1)


def borrowed_note(mode: str, borrowed: dict[str, float]) -> str:
    paths = ", ".join(f"{p} +{1e3 * o:.1f} ms" for p, o in borrowed.items())
    return (f"{mode}: its unloaded requests took no {' or '.join(borrowed)} path; its requests there get the other "
            f"runs' median offset on it ({paths}, marked *)")


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
    """The mode, its layout and its offset: one figure, or one per path where they differ (`*`: borrowed)."""
    if len(set(row.offsets.values())) > 1 or row.borrowed:
        offset = ", ".join(f"{p} +{1e3 * o:.1f}{'*' if p in row.borrowed else ''}" for p, o in row.offsets.items())
        return f"{row.mode} ({row.layout}; {offset} ms)"
    offset = next(iter(row.offsets.values()), row.offset_s)
    return f"{row.mode} ({row.layout}; +{1e3 * offset:.1f} ms)"


def beyond(row: Row, key: str, tolerance: float) -> bool:
    return not abs(row.error(key)) <= tolerance


def headers() -> list[str]:
    return ["mode (simulated as)", "load"] + [f"{name} ({'req/s' if key == 'goodput' else 'ms'})"
                                             for name, key in METRICS] + [BUSY]


def notes(rows: list[Row]) -> list[str]:
    """Each mode's note, once."""
    return list(dict.fromkeys(r.note for r in rows if r.note))


def ranks(rows: list[Row], tolerance: float = TOLERANCE) -> list[str]:
    """For each latency cell beyond `tolerance`: which of the measured requests' percentiles the prediction is, and
    the measured values 10 points either side of the cell's (wide where the percentile falls in a gap)."""
    lines = []
    for r in rows:
        for name, key in METRICS:
            if key in r.ranks and beyond(r, key, tolerance):
                q = LATENCIES[key][1]
                low, high = r.spans[key]
                lines.append(f"{r.mode} at {r.load}, {name} {_error(r.error(key))}: the prediction is the measured "
                             f"p{r.ranks[key]:.0f} (p{max(0, q - 10)}-p{min(100, q + 10)}: {_value(key, low)}-"
                             f"{_value(key, high)} ms)" + _reach(r, key))
    return lines


def _reach(row: Row, key: str) -> str:
    if (reach := _reach_json(row, key)) is None:
        return ""
    share = reach["slower"]
    return (f"; on GPUs {100 * abs(share):g}% {'slower' if share > 0 else 'faster'}: "
            f"{_value(key, reach['predicted'])} ms ({_error(reach['error'])})")


def table(rows: list[Row], tolerance: float = TOLERANCE) -> str:
    """The text table: each cell predicted / measured (error), `!` where the error is beyond `tolerance`; under it,
    where those latency predictions rank among the measured values (`ranks`)."""
    body = [[label(r), r.load] + [cell(r, k) + ("!" if beyond(r, k, tolerance) else " ")
                                                 for _, k in METRICS] + [busy_cell(r)] for r in rows]
    widths = [max(len(line[i]) for line in [headers(), *body]) for i in range(len(headers()))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers(), widths))]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in body]
    return "\n".join(lines + [f"note: {n}" for n in notes(rows)] + [f"rank: {n}" for n in ranks(rows, tolerance)])


def markdown(rows: list[Row], profile: Profile, source: str, tolerance: float = TOLERANCE) -> str:
    missed = sum(beyond(r, k, tolerance) for r in rows for _, k in METRICS)
    lines = [f"Predicted (`pdcluster plan`, profile of {profile.model} on {profile.machine}) / measured "
             f"(`pdcluster bench`, {source}) (error); **bold**: beyond {100 * tolerance:g}%. "
             f"{missed} of {len(rows) * len(METRICS)} cells beyond.", "",
             "| " + " | ".join(headers()) + " |", "|---|---|" + "---:|" * (len(METRICS) + 1)]
    for r in rows:
        cells = [f"**{cell(r, k)}**" if beyond(r, k, tolerance) else cell(r, k) for _, k in METRICS] + [busy_cell(r)]
        lines.append(f"| {label(r)} | {r.load} | " + " | ".join(cells) + " |")
    said, ranked = notes(rows), ranks(rows, tolerance)
    lines += [""] + [f"Note: {n}" for n in said] if said else []
    lines += [""] + [f"Rank: {n}" for n in ranked] if ranked else []
    return "\n".join(lines) + "\n"


def to_json(rows: list[Row], tolerance: float = TOLERANCE) -> list[dict]:
    return [{"mode": r.mode, "layout": r.layout, "load": r.load, "unloaded_offset_s": r.offset_s,
             "offsets_s": r.offsets, "borrowed": list(r.borrowed), "note": r.note,
             "metrics": {k: {"predicted": _finite(getattr(r.predicted, k)), "measured": _finite(getattr(r.measured, k)),
                             "error": _finite(r.error(k)), "beyond": beyond(r, k, tolerance),
                             "measured_rank": r.ranks.get(k), "measured_span": r.spans.get(k),
                             "machine": _reach_json(r, k)} for _, k in METRICS},
             "attainment": {"predicted": r.predicted.attainment, "measured": r.measured.attainment},
             "busy_seconds": None if r.busy is None else {"predicted": r.busy[0], "measured": r.busy[1]}}
            for r in rows]


def _reach_json(row: Row, key: str) -> dict | None:
    """A missed cell's prediction on GPUs a share slower (< 0: faster), and its error; None for the others."""
    if key not in row.reach:
        return None
    share, value = row.reach[key]
    measured = getattr(row.measured, key)
    return {"slower": share, "predicted": value, "error": (value - measured) / measured}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
