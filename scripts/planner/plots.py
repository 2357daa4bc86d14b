"""The planner's curves: TTFT p90, TPOT p90 and goodput against the rate, one line per layout (`styles`: how each is
told apart); and a validation's predicted against measured, each mode's (matplotlib, the `bench` extra; without it,
none, and `missing` says why)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scripts.bench_plots import missing
from scripts.planner.config import SLO
from scripts.planner.layout import Layout
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


@dataclass(frozen=True)
class Style:
    """How one layout's line is drawn: disaggregated splits shaded by their share of prefill engines (0 to 1, on one
    colour map with a colour bar, so neighbouring splits read as neighbours however many there are), colocated in
    black (`shade` None); the policy in the line style; the recommended layout thicker."""

    shade: float | None
    linestyle: str
    linewidth: float


POLICY_LINES = {"always": "-", "auto": "--", "never": ":"}


def styles(layouts: dict[str, Layout], best: str | None) -> dict[str, Style]:
    return {name: Style(None if layout.colocated else layout.prefill / layout.engines,
                        "-" if layout.colocated else POLICY_LINES.get(layout.policy, "-."),
                        3.0 if name == best else 1.0)
            for name, layout in layouts.items()}


def draw(results: dict[str, list[Point]], layouts: dict[str, Layout], best: str | None, slo: SLO, title: str,
         out: Path) -> list[Path]:
    """TTFT p90 (log scale: an overloaded layout's seconds beside a loaded one's milliseconds), TPOT p90 and goodput
    against the rate, one line a layout; the legend says what the line styles are, the colour bar the prefill share."""
    if missing():
        return []
    plt = _pyplot()
    from matplotlib.cm import ScalarMappable
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    shades = plt.get_cmap("viridis")
    shown = {name: layouts[name] for name in results}
    looks = styles(shown, best)

    def colour(name: str):
        return "black" if looks[name].shade is None else shades(looks[name].shade)

    def plot(ax, name: str, ys: list[float]) -> None:
        look = looks[name]
        ax.plot([p.rate for p in results[name]], ys, marker="o", markersize=3, color=colour(name),
                linestyle=look.linestyle, linewidth=look.linewidth, zorder=3 if name == best else 2)

    def key(extra: list[Line2D]) -> list[Line2D]:
        """Legend entries: each policy's line style, colocated, the pick, and the reference lines."""
        policies = dict.fromkeys(layout.policy for layout in shown.values() if not layout.colocated)
        entries = [Line2D([], [], color="grey", linestyle=POLICY_LINES.get(p, "-."), label=f"xP:yD, {p}")
                   for p in policies]
        if any(layout.colocated for layout in shown.values()):
            entries.append(Line2D([], [], color="black", label="colocated"))
        if best in shown:
            entries.append(Line2D([], [], color=colour(best), linestyle=looks[best].linestyle, linewidth=3,
                                  label=f"{best} (recommended)"))
        return entries + extra

    def finish(fig, axes, extra: list[Line2D]) -> None:
        fig.legend(handles=key(extra), loc="outside right upper", fontsize=8)
        if any(look.shade is not None for look in looks.values()):
            bar = fig.colorbar(ScalarMappable(cmap=shades), ax=axes, location="right", shrink=0.6)
            bar.set_label("prefill engines / engines")

    slo_line = [Line2D([], [], color="grey", linestyle="--", linewidth=1, label="SLO")]
    fig, (ttft, tpot) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    for name, points in results.items():
        plot(ttft, name, [p.ttft_p90 for p in points])
        plot(tpot, name, [p.tpot_p90 for p in points])
    ttft.set_yscale("log")
    ttft.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    for ax, what, limit in ((ttft, "TTFT p90 (s)", slo.ttft), (tpot, "TPOT p90 (s)", slo.tpot)):
        ax.axhline(limit, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    finish(fig, [ttft, tpot], slo_line)
    fig.suptitle(title)
    paths = [out / PLOTS[0]]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8.5, 4.5), layout="constrained")
    for name, points in results.items():
        plot(ax, name, [p.goodput for p in points])
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("goodput (req/s within both SLOs)")
    ax.grid(alpha=0.3)
    finish(fig, [ax], [])
    ax.set_title(title)
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
