"""The benchmark's plots, titled with the model and the hardware: latencies and goodput against the load, and the
TTFT and TPOT distributions of each load point. Drawn with matplotlib (the `bench` extra); without it the report
still has its tables (`missing`).

    pip install matplotlib            # or: pip install -e '.[bench]'
"""
from __future__ import annotations

from pathlib import Path

from scripts.bench_hardware import label
from scripts.bench_metrics import METRICS

PLOTS = ("latency.png", "goodput.png", "ttft_cdf.png", "tpot_cdf.png")
HOW_TO_GET = "pip install matplotlib, or pip install -e '.[bench]'"


def missing() -> str | None:
    """Why there can be no plots (matplotlib not installed), None when there can."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"plots skipped: matplotlib is not installed ({HOW_TO_GET})"
    return None


def title(results: dict) -> str:
    """"MODEL on HARDWARE": the model folder's name (or the running cluster's address) and the machine."""
    model = results["config"].get("model")
    name = Path(model).name if model else f"the cluster at {results.get('address')}"
    return f"{name} on {label(results.get('machine'))}"


def point_of(run: dict, i: int) -> dict | None:
    return run["points"][i] if i < len(run["points"]) else None


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
    fig.suptitle(title(results))
    fig.tight_layout(rect=(0, 0, 1, 0.95))
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
    fig.suptitle(title(results))
    fig.tight_layout(rect=(0, 0, 1, 0.95))
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
        ax.set_title(f"{point['label']} (SLO {slo * 1e3:.4g} ms)", fontsize=10)
        ax.set_xlabel(f"{key.upper()} (ms)")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        _legend(ax)
    for ax in list(axes.flat)[len(points):]:
        ax.set_visible(False)
    fig.suptitle(title(results))
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(out: Path, results: dict, slo: dict) -> list[Path]:
    """The PNGs in `out`, goodput and the CDFs' marks by `slo`; returns their paths."""
    paths = [out / name for name in PLOTS]
    plot_latency(results, paths[0])
    plot_goodput(results, paths[1])
    plot_cdf(results, "ttft", slo["ttft"], paths[2])
    plot_cdf(results, "tpot", slo["tpot"], paths[3])
    return paths
