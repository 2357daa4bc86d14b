"""The benchmark's report from its results.json: report.md (a table per load point, modes side by side) and plots.

report.md also compares each load point's TPOT with the unloaded one (requests sent one at a time) and reads
the target: where colocated TPOT p90 breaks its SLO, does disagg's stay within 1.2x of its unloaded TPOT?

    python -m scripts.bench_report OUT/results.json     # redraw report.md and the PNGs beside it
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from scripts.bench_placement import hit_rate_rows, placement_reading, policy_reading, router_rows

METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E latency"))
STATS = ("mean", "p50", "p90", "p99")
PLOTS = ("latency.png", "goodput.png", "ttft_cdf.png", "tpot_cdf.png")
TPOT_RATIO_TARGET = 1.2  # disagg TPOT p90 / its unloaded TPOT p50 where colocated breaks the TPOT SLO
RATIO_ROW = "TPOT p90 / unloaded TPOT p50"

Cell = Callable[[dict], str]  # a summary's entry in one row of a table


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e3:.1f}"


def modes(results: dict) -> list[str]:
    return [run["mode"] for run in results["runs"]]


def point_of(run: dict, i: int) -> dict | None:
    """The run's i-th load point, None if the run stopped before it."""
    return run["points"][i] if i < len(run["points"]) else None


# ---- report.md ----------------------------------------------------------------------------------
SUMMARY_ROWS: list[tuple[str, Cell]] = [
    ("requests", lambda s: str(s["requests"])),
    ("completed / failed", lambda s: f"{s['completed']} / {s['failed']}"),
    ("wrong output length", lambda s: str(s["wrong_length"])),
    ("duration (s)", lambda s: f"{s['duration']:.2f}"),
    ("throughput (req/s)", lambda s: f"{s['request_throughput']:.2f}"),
    ("output tokens/s", lambda s: f"{s['output_throughput']:.1f}"),
    ("goodput (req/s)", lambda s: f"{s['goodput']:.2f}"),
    ("SLO attainment", lambda s: f"{100 * s['slo_attainment']:.1f}%"),
]


def latency_row(key: str, stat: str) -> tuple[str, Cell]:
    return f"{dict(METRICS)[key]} {stat} (ms)", lambda s: ms(s[key][stat])


def cells(summaries: list[dict | None], cell: Cell) -> list[str]:
    return [cell(s) if s is not None else "not run" for s in summaries]


def grid(runs: list[dict], rows: list[tuple[str, list[str]]]) -> list[str]:
    lines = ["| | " + " | ".join(run["mode"] for run in runs) + " |", "|---|" + "---:|" * len(runs)]
    return lines + [f"| {name} | " + " | ".join(row) + " |" for name, row in rows]


def unloaded_tpot(run: dict) -> float | None:
    """The run's unloaded TPOT p50: the pace of a request that has the cluster to itself."""
    unloaded = run.get("unloaded")  # absent in results from before the unloaded reference
    return unloaded["summary"]["tpot"]["p50"] if unloaded else None


def tpot_ratio(run: dict, summary: dict | None) -> float | None:
    """A load point's TPOT p90 as a multiple of the run's unloaded TPOT p50; None if either is missing."""
    base = unloaded_tpot(run)
    p90 = summary["tpot"]["p90"] if summary else None
    return None if base is None or p90 is None or base <= 0 else p90 / base


def times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def decode_engines(point: dict | None) -> dict | None:
    """The decoding engines' work over a load point (decode workers, or colocated ones): mean step, mean
    decode batch, busy share of the point. None when the results hold no engine totals."""
    rows = [e for e in (point or {}).get("engines") or [] if e["role"] in ("decode", "colocated")]
    steps = sum(e["busy_steps"] for e in rows)
    if not rows or not steps:
        return None
    seconds = sum(e["busy_seconds"] for e in rows)
    gpu = sum(e.get("gpu_seconds", 0.0) for e in rows)
    duration = point["summary"]["duration"]
    share = (lambda s: s / (len(rows) * duration)) if duration else (lambda s: None)
    return {"step_ms": 1e3 * seconds / steps, "batch": sum(e["decode_tokens_run"] for e in rows) / steps,
            "busy": share(seconds), "gpu_busy": share(gpu) if gpu else None}


def percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


ENGINE_ROWS: list[tuple[str, Cell]] = [
    ("decode step, mean (ms)", lambda d: f"{d['step_ms']:.2f}"),
    ("decode batch, mean", lambda d: f"{d['batch']:.1f}"),
    ("decode engines busy", lambda d: percent(d["busy"])),
    ("decode GPUs busy (CUDA events)", lambda d: percent(d["gpu_busy"])),
]


def engine_rows(points: list[dict | None]) -> list[tuple[str, list[str]]]:
    engines = [decode_engines(p) for p in points]
    if all(e is None for e in engines):
        return []
    return [(name, [cell(e) if e else "n/a" for e in engines]) for name, cell in ENGINE_ROWS]


def table(results: dict, i: int) -> list[str]:
    runs = results["runs"]
    summaries = [p["summary"] if (p := point_of(run, i)) else None for run in runs]
    rows = [(name, cells(summaries, cell)) for name, cell in SUMMARY_ROWS]
    for key, _ in METRICS:
        rows += [(name, cells(summaries, cell)) for name, cell in (latency_row(key, stat) for stat in STATS)]
        if key == "tpot":
            ratios = [times(tpot_ratio(run, s)) if s else "not run" for run, s in zip(runs, summaries)]
            rows.append((RATIO_ROW, ratios))
    points = [point_of(run, i) for run in runs]
    return grid(runs, rows + engine_rows(points) + hit_rate_rows(points) + router_rows(points))


def unloaded_table(results: dict) -> list[str]:
    """Each mode's requests sent one at a time: the reference the load points' TPOT is compared with."""
    runs = results["runs"]
    summaries = [run["unloaded"]["summary"] if run.get("unloaded") else None for run in runs]
    rows = SUMMARY_ROWS[:2] + [latency_row("ttft", "p50"), latency_row("tpot", "p50"), latency_row("tpot", "p90"),
                               latency_row("itl", "p50")]
    return grid(runs, [(name, cells(summaries, cell)) for name, cell in rows]
                + engine_rows([run.get("unloaded") for run in runs]))


def first_tpot_breach(run: dict, slo: float) -> int | None:
    """The first load point (in load order) where the run's TPOT p90 exceeds `slo`."""
    for i, p in enumerate(run["points"]):
        p90 = p["summary"]["tpot"]["p90"]
        if p90 is not None and p90 > slo:
            return i
    return None


def slo_reading(results: dict) -> str:
    """Where colocated TPOT p90 first breaks the TPOT SLO, and disagg's TPOT p90 there against its unloaded TPOT."""
    slo = results["config"]["slo_tpot"]
    target = f"the TPOT SLO ({slo * 1e3:g} ms)"
    runs = {run["mode"]: run for run in results["runs"]}
    missing = [mode for mode in ("disagg", "colocated") if mode not in runs]
    if missing:
        return f"No reading: it needs both modes, and this run has no {' and no '.join(missing)} results."
    colocated, disagg = runs["colocated"], runs["disagg"]
    i = first_tpot_breach(colocated, slo)
    if i is None:
        ran, total = len(colocated["points"]), len(results["load_points"])
        of = "" if ran == total else f" (it ran {ran} of {total} load points)"
        return (f"Colocated TPOT p90 never exceeded {target} in this run{of}: there is no breaking rate to read "
                "disagg at.")
    label, p90 = results["load_points"][i]["label"], colocated["points"][i]["summary"]["tpot"]["p90"]
    text = f"Colocated TPOT p90 first exceeds {target} at **{label}** ({ms(p90)} ms)."
    point = point_of(disagg, i)
    ratio = tpot_ratio(disagg, point["summary"] if point else None)
    if ratio is None:
        why = ("no unloaded TPOT to compare with (run with --unloaded-requests > 0)" if unloaded_tpot(disagg) is None
               else "no TPOT p90 there")
        return f"{text} Disagg has {why}, so the ratio cannot be read."
    verdict = "within" if ratio <= TPOT_RATIO_TARGET else "beyond"
    return (f"{text} There disagg TPOT p90 is {ms(point['summary']['tpot']['p90'])} ms, **{times(ratio)}** its "
            f"unloaded TPOT p50 ({ms(unloaded_tpot(disagg))} ms): {verdict} the {TPOT_RATIO_TARGET:g}x target.")


def failures(results: dict) -> list[str]:
    lines = []
    for run in results["runs"]:
        if run.get("error"):
            lines.append(f"- **{run['mode']}**: the run stopped: {run['error']}")
        warm = run.get("warmup") or {}
        if warm.get("failed"):
            lines.append(f"- **{run['mode']}**, warm-up: {warm['failed']} of {warm['requests']} failed: "
                         + "; ".join(warm.get("errors", [])))
        measured = [("unloaded", run["unloaded"])] if run.get("unloaded") else []
        for label, p in measured + [(p["load"]["label"], p) for p in run["points"]]:
            errors = p["summary"]["errors"]
            if not errors:
                continue
            first = {}
            for r in p["requests"]:
                if r["error_code"] and r["error_code"] not in first:
                    first[r["error_code"]] = r["error"]
            counts = ", ".join(f"{n} x {code} (e.g. {first.get(code, '')!r})" for code, n in errors.items())
            lines.append(f"- **{run['mode']}**, {label}: {counts}")
    return lines


def markdown(results: dict) -> str:
    cfg = results["config"]
    lines = [
        "# Disaggregated vs colocated: serving benchmark",
        "",
        f"- started: {results['started']}; model: `{cfg.get('model') or results.get('address')}`",
        f"- workload: {results['workload']}; seed {cfg['seed']}; "
        f"{cfg['warmup_requests']} warm-up requests per cluster, not counted"
        + (f"; then {n} unloaded requests, one at a time" if (n := cfg.get("unloaded_requests")) else ""),
        f"- SLO: TTFT <= {cfg['slo_ttft'] * 1e3:g} ms and TPOT <= {cfg['slo_tpot'] * 1e3:g} ms; "
        "goodput = requests/s meeting both",
        "- latencies measured at the client (see docs/benchmarks.md for definitions)",
        "",
        "## Clusters",
        "",
    ]
    for run in results["runs"]:
        where = " ".join(run["serve_command"]) if run.get("serve_command") else f"running cluster at {run['address']}"
        lines += [f"**{run['mode']}**:", "", "```", where, "```", ""]
    if any(run.get("unloaded") for run in results["runs"]):
        lines += ["## Unloaded reference", "", "Requests sent one at a time, before the load points.", ""]
        lines += unloaded_table(results) + [""]
    lines += ["## SLO reading", "", slo_reading(results), ""]
    if (reading := placement_reading(results)) is not None:
        lines += ["## Placement reading", "", reading, ""]
    if (reading := policy_reading(results)) is not None:
        lines += ["## Disaggregation policy reading", "", reading, ""]
    for i, point in enumerate(results["load_points"]):
        lines += [f"## {point['label']}", ""] + table(results, i) + [""]
    problems = failures(results)
    lines += ["## Failures", ""] + (problems or ["None: every request finished."]) + [""]
    lines += ["## Plots", ""] + [f"![{name}]({name})" for name in PLOTS] + [""]
    return "\n".join(lines)


# ---- plots --------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(mode: str, i: int) -> str:
    return {"disagg": "C0", "colocated": "C1"}.get(mode, f"C{i + 2}")


def _xaxis(ax, results: dict) -> None:
    points = results["load_points"]
    ax.set_xticks(range(len(points)), [p["short"] for p in points])
    ax.set_xlabel(points[0]["axis"] if points else "")
    ax.grid(alpha=0.3)


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:  # a run that never got to a point leaves nothing to label
        ax.legend(fontsize=8)


def _series(run: dict, n: int, get) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for i in range(n):
        p = point_of(run, i)
        value = get(p["summary"]) if p else None
        if value is not None:
            xs.append(i)
            ys.append(value)
    return xs, ys


def plot_latency(results: dict, path: Path) -> None:
    plt = _pyplot()
    n = len(results["load_points"])
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (key, name) in zip(axes.flat, METRICS):
        for m, run in enumerate(results["runs"]):
            for stat, style, marker in (("p50", "-", "o"), ("p90", "--", "s"), ("p99", ":", "^")):
                xs, ys = _series(run, n, lambda s: None if s[key][stat] is None else s[key][stat] * 1e3)
                ax.plot(xs, ys, style, marker=marker, color=_color(run["mode"], m), label=f"{run['mode']} {stat}")
        ax.set_title(name)
        ax.set_ylabel("ms")
        ax.set_ylim(bottom=0)
        _xaxis(ax, results)
    _legend(axes.flat[0])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_goodput(results: dict, path: Path) -> None:
    plt = _pyplot()
    n = len(results["load_points"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for m, run in enumerate(results["runs"]):
        color = _color(run["mode"], m)
        left.plot(*_series(run, n, lambda s: s["goodput"]), "-", marker="o", color=color,
                  label=f"{run['mode']} goodput")
        left.plot(*_series(run, n, lambda s: s["request_throughput"]), "--", marker="x", color=color,
                  label=f"{run['mode']} throughput")
        right.plot(*_series(run, n, lambda s: 100 * s["slo_attainment"]), "-", marker="o", color=color,
                   label=run["mode"])
    left.set_title("goodput (requests/s meeting the SLO)")
    left.set_ylabel("requests/s")
    left.set_ylim(bottom=0)
    right.set_title("SLO attainment")
    right.set_ylabel("% of requests")
    right.set_ylim(0, 105)
    for ax in (left, right):
        _xaxis(ax, results)
        _legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_cdf(results: dict, key: str, slo: float, path: Path) -> None:
    """One panel per load point; y is the share of all requests, so failed ones keep a curve below 1."""
    plt = _pyplot()
    points = results["load_points"]
    cols = min(4, max(1, len(points)))
    rows = -(-len(points) // cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.3 * rows), squeeze=False)
    for i, point in enumerate(points):
        ax = axes.flat[i]
        top = 0.0
        for m, run in enumerate(results["runs"]):
            p = point_of(run, i)
            if not p or not p["requests"]:
                continue
            values = sorted(r[key] * 1e3 for r in p["requests"] if r[key] is not None)
            total = len(p["requests"])
            ax.step(values, [(j + 1) / total for j in range(len(values))], where="post",
                    color=_color(run["mode"], m), label=run["mode"])
            top = max([top, *values])
        if slo * 1e3 <= 2 * top:  # further right, it would squash the curves against the axis
            ax.axvline(slo * 1e3, color="gray", linestyle=":", label="SLO")
        ax.set_title(f"{point['label']} (SLO {slo * 1e3:g} ms)", fontsize=10)
        ax.set_xlabel(f"{key.upper()} (ms)")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        _legend(ax)
    for ax in list(axes.flat)[len(points):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(out: Path, results: dict) -> list[Path]:
    """report.md and the PNGs in `out`; returns their paths."""
    cfg = results["config"]
    paths = [out / "report.md"] + [out / name for name in PLOTS]
    paths[0].write_text(markdown(results))
    plot_latency(results, paths[1])
    plot_goodput(results, paths[2])
    plot_cdf(results, "ttft", cfg["slo_ttft"], paths[3])
    plot_cdf(results, "tpot", cfg["slo_tpot"], paths[4])
    return paths


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m scripts.bench_report OUT/results.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    for written in write_report(path.parent, json.loads(path.read_text())):
        print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
