"""The planner's curves: TTFT p90, TPOT p90 and goodput against the rate, one line per layout; and a validation's
predicted against measured, each mode's (matplotlib, the `bench` extra; without it, none, and `missing` says why)."""
from __future__ import annotations

from pathlib import Path

from scripts.bench_plots import missing
from scripts.planner.config import SLO
from scripts.planner.report import Point

PLOTS = ("plan_latency.png", "plan_goodput.png")
VALIDATION_PLOT = "validation.png"
VALIDATED = (("ttft_p50", "TTFT p50 (s)"), ("ttft_p90", "TTFT p90 (s)"), ("tpot_p90", "TPOT p90 (s)"),
             ("goodput", "goodput (req/s)"))


def _pyplot():
    """matplotlib's pyplot drawing to files (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def draw(results: dict[str, list[Point]], slo: SLO, title: str, out: Path) -> list[Path]:
    if missing():
        return []
    plt = _pyplot()
    fig, (ttft, tpot) = plt.subplots(1, 2, figsize=(11, 4))
    for name, points in results.items():
        rates = [p.rate for p in points]
        ttft.plot(rates, [p.ttft_p90 for p in points], marker="o", label=name)
        tpot.plot(rates, [p.tpot_p90 for p in points], marker="o", label=name)
    for ax, what, limit in ((ttft, "TTFT p90 (s)", slo.ttft), (tpot, "TPOT p90 (s)", slo.tpot)):
        ax.axhline(limit, color="grey", linestyle="--", linewidth=1, label="SLO")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    tpot.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    paths = [out / PLOTS[0]]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in results.items():
        ax.plot([p.rate for p in points], [p.goodput for p in points], marker="o", label=name)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("goodput (req/s within both SLOs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title)
    fig.tight_layout()
    paths.append(out / PLOTS[1])
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def draw_validation(rows: list, title: str, out: Path) -> Path | None:
    """`pdcluster plan --validate`'s rows (scripts/planner/validate.py `Row`): each metric against the load point,
    measured as markers, predicted as a dashed line in the same colour, one colour a mode."""
    if missing():
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(VALIDATED), figsize=(4 * len(VALIDATED), 3.6))
    modes = list(dict.fromkeys(f"{r.mode} ({r.layout})" for r in rows))
    for i, mode in enumerate(modes):
        mine = [r for r in rows if f"{r.mode} ({r.layout})" == mode]
        loads, colour = [r.load for r in mine], f"C{i}"
        for ax, (key, label) in zip(axes, VALIDATED):
            ax.plot(loads, [getattr(r.measured, key) for r in mine], "o", color=colour, label=f"{mode} measured")
            ax.plot(loads, [getattr(r.predicted, key) for r in mine], "--", color=colour, label=f"{mode} predicted")
            ax.set_ylabel(label)
    for ax in axes:
        ax.set_xlabel("load point")
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path = out / VALIDATION_PLOT
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
