"""The benchmark's report from its results.json: report.md (a table per load point, modes side by side) and plots.

    python -m scripts.bench_report OUT/results.json     # redraw report.md and the PNGs beside it
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E latency"))
STATS = ("mean", "p50", "p90", "p99")
PLOTS = ("latency.png", "goodput.png", "ttft_cdf.png", "tpot_cdf.png")


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e3:.1f}"


def modes(results: dict) -> list[str]:
    return [run["mode"] for run in results["runs"]]


def point_of(run: dict, i: int) -> dict | None:
    """The run's i-th load point, None if the run stopped before it."""
    return run["points"][i] if i < len(run["points"]) else None


# ---- report.md ----------------------------------------------------------------------------------
def table(results: dict, i: int) -> list[str]:
    runs = results["runs"]
    rows: list[tuple[str, Callable[[dict], str]]] = [
        ("requests", lambda s: str(s["requests"])),
        ("completed / failed", lambda s: f"{s['completed']} / {s['failed']}"),
        ("wrong output length", lambda s: str(s["wrong_length"])),
        ("duration (s)", lambda s: f"{s['duration']:.2f}"),
        ("throughput (req/s)", lambda s: f"{s['request_throughput']:.2f}"),
        ("output tokens/s", lambda s: f"{s['output_throughput']:.1f}"),
        ("goodput (req/s)", lambda s: f"{s['goodput']:.2f}"),
        ("SLO attainment", lambda s: f"{100 * s['slo_attainment']:.1f}%"),
    ]
    for key, name in METRICS:
        for stat in STATS:
            rows.append((f"{name} {stat} (ms)", lambda s, key=key, stat=stat: ms(s[key][stat])))
    lines = ["| | " + " | ".join(run["mode"] for run in runs) + " |", "|---|" + "---:|" * len(runs)]
    for name, cell in rows:
        cells = [cell(p["summary"]) if (p := point_of(run, i)) else "not run" for run in runs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def failures(results: dict) -> list[str]:
    lines = []
    for run in results["runs"]:
        if run.get("error"):
            lines.append(f"- **{run['mode']}**: the run stopped: {run['error']}")
        warm = run.get("warmup") or {}
        if warm.get("failed"):
            lines.append(f"- **{run['mode']}**, warm-up: {warm['failed']} of {warm['requests']} failed: "
                         + "; ".join(warm.get("errors", [])))
        for p in run["points"]:
            errors = p["summary"]["errors"]
            if not errors:
                continue
            first = {}
            for r in p["requests"]:
                if r["error_code"] and r["error_code"] not in first:
                    first[r["error_code"]] = r["error"]
            counts = ", ".join(f"{n} x {code} (e.g. {first.get(code, '')!r})" for code, n in errors.items())
            lines.append(f"- **{run['mode']}**, {p['load']['label']}: {counts}")
    return lines


def markdown(results: dict) -> str:
    cfg = results["config"]
    lines = [
        "# Disaggregated vs colocated: serving benchmark",
        "",
        f"- started: {results['started']}; model: `{cfg.get('model') or results.get('address')}`",
        f"- workload: {results['workload']}; seed {cfg['seed']}; "
        f"{cfg['warmup_requests']} warm-up requests per cluster, not counted",
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
