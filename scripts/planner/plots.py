"""The planner's curves: TTFT p90, TPOT p90 and goodput against the rate, one line per layout (matplotlib, the
`bench` extra; without it, none, and `missing` says why)."""
from __future__ import annotations

from pathlib import Path

from scripts.bench_plots import missing
from scripts.planner.config import SLO
from scripts.planner.report import Point

PLOTS = ("plan_latency.png", "plan_goodput.png")


def draw(results: dict[str, list[Point]], slo: SLO, title: str, out: Path) -> list[Path]:
    if missing():
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
