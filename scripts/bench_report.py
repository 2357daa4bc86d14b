"""The benchmark's report from its results.json: report.md (the hardware and SLO of the run, a table per load point
with the modes side by side) and the plots (scripts/bench_plots.py).

report.md also compares each load point's TPOT with the unloaded one (requests sent one at a time) and reads
the target: where colocated TPOT p90 breaks its SLO, does disagg's stay within --tpot-ratio-target (1.2x) of its
unloaded TPOT?

    python -m scripts.bench_report OUT/results.json     # redraw report.md and the PNGs beside it
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from scripts.bench_hardware import comparison_note, describe, label
from scripts.bench_metrics import METRICS
from scripts.bench_placement import hit_rate_rows, placement_reading, policy_reading, router_rows
from scripts.bench_plots import PLOTS, missing, write_plots
from scripts.bench_slo import of_results

STATS = ("mean", "p50", "p90", "p99")
TPOT_RATIO_TARGET = 1.2  # the default of --tpot-ratio-target (results from before the flag)
RATIO_ROW = "TPOT p90 / unloaded TPOT p50"
BATCH_ROW = "decode tokens per busy step, mean"
BATCH_NOTE = (f"*{BATCH_ROW}*: the decode tokens the decoding engines ran, divided by all their busy steps. "
              "Those include steps that ran no decode: a colocated engine's prefill steps, and with overlap "
              "scheduling the step that only collects a request's last token. One request at a time, it reads "
              "just under 1 (say 15 decode tokens over 16 steps), not a batch of less than one request; under "
              "load it is close to the decode batch.")

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


OUTSIDE_ROW = "TTFT outside the router p50 / p99 (ms)"


def outside_ttft(s: dict) -> str:
    """Each request's TTFT less the router's own TTFT: its submit's way to the router and its first token's way back,
    the client's process included (n/a: results from before the router's timings were kept)."""
    d = s.get("outside_ttft")
    return "n/a" if not d or d["p50"] is None else f"{ms(d['p50'])} / {ms(d['p99'])}"


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
    (BATCH_ROW, lambda d: f"{d['batch']:.2f}"),
    ("decode engines busy", lambda d: percent(d["busy"])),
    ("decode GPUs busy (CUDA events)", lambda d: percent(d["gpu_busy"])),
]


def engine_rows(points: list[dict | None]) -> list[tuple[str, list[str]]]:
    engines = [decode_engines(p) for p in points]
    if all(e is None for e in engines):
        return []
    gpus = any(e and e["gpu_busy"] is not None for e in engines)  # no GPU row on CPU
    return [(name, [cell(e) if e else "n/a" for e in engines]) for name, cell in ENGINE_ROWS
            if gpus or "GPU" not in name]


HANDOFF_ROW = "KV handoffs: transport count (mean send to ack, GB/s)"


def handoff_rows(points: list[dict | None]) -> list[tuple[str, list[str]]]:
    """Which KV transport the prefill workers' handoffs took over each point, how many and how fast. Only where
    some point has handoffs (results from before they were recorded, colocated modes: none)."""
    cells = []
    for point in points:
        by: dict[str, list[float]] = {}
        for engine in (point or {}).get("engines") or []:
            for transport, h in (engine.get("handoffs") or {}).items():
                row = by.setdefault(transport, [0, 0, 0.0])
                row[0], row[1], row[2] = row[0] + h["count"], row[1] + h["bytes"], row[2] + h["seconds"]
        cells.append("; ".join(f"{t} {n} ({ms(s / n)} ms, {b / s / 1e9:.1f} GB/s)" if s > 0 else f"{t} {n}"
                               for t, (n, b, s) in sorted(by.items())) or "n/a")
    return [(HANDOFF_ROW, cells)] if any(c != "n/a" for c in cells) else []


def table(results: dict, i: int) -> list[str]:
    runs = results["runs"]
    summaries = [p["summary"] if (p := point_of(run, i)) else None for run in runs]
    rows = [(name, cells(summaries, cell)) for name, cell in SUMMARY_ROWS]
    for key, _ in METRICS:
        rows += [(name, cells(summaries, cell)) for name, cell in (latency_row(key, stat) for stat in STATS)]
        if key == "ttft":
            rows.append((OUTSIDE_ROW, cells(summaries, outside_ttft)))
        if key == "tpot":
            ratios = [times(tpot_ratio(run, s)) if s else "not run" for run, s in zip(runs, summaries)]
            rows.append((RATIO_ROW, ratios))
    points = [point_of(run, i) for run in runs]
    return grid(runs, rows + engine_rows(points) + handoff_rows(points) + hit_rate_rows(points)
                + router_rows(points))


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


def ratio_target(results: dict) -> float:
    return results["config"].get("tpot_ratio_target") or TPOT_RATIO_TARGET


def target_definition(results: dict) -> str:
    t = ratio_target(results)
    return (f"The question: at the load where colocated TPOT p90 first breaks the TPOT SLO, is disagg's TPOT p90 "
            f"within {t:g}x of its unloaded TPOT p50? That {t:g}x target is this project's design goal for decode "
            f"stability under load, not a property of your deployment (--tpot-ratio-target sets another).")


def slo_reading(results: dict) -> str:
    """Where colocated TPOT p90 first breaks the TPOT SLO, and disagg's TPOT p90 there against its unloaded TPOT."""
    slo = of_results(results)["tpot"]
    target = f"the TPOT SLO ({slo * 1e3:.4g} ms)"
    runs = {run["mode"]: run for run in results["runs"]}
    # A disaggregated variant (disagg:always, disagg:prefix, ...) stands for disagg when plain disagg did not run.
    disagg_mode = (next((m for m in runs if m == "disagg"), None)
                   or next((m for m in runs if m.startswith("disagg:")), None))
    missing = [mode for mode, found in (("disagg", disagg_mode), ("colocated", runs.get("colocated"))) if not found]
    if missing:
        return f"No reading: it needs both modes, and this run has no {' and no '.join(missing)} results."
    colocated, disagg = runs["colocated"], runs[disagg_mode]
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
        name = "Disagg" if disagg_mode == "disagg" else disagg_mode
        return f"{text} {name} has {why}, so the ratio cannot be read."
    verdict = "within" if ratio <= ratio_target(results) else "beyond"
    return (f"{text} There {disagg_mode} TPOT p90 is {ms(point['summary']['tpot']['p90'])} ms, **{times(ratio)}** its "
            f"unloaded TPOT p50 ({ms(unloaded_tpot(disagg))} ms): {verdict} the {ratio_target(results):g}x "
            "target.")


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


def hardware_lines(results: dict) -> list[str]:
    """Each mode's workers, processes and GPUs or CPU threads, its `serve` command, and whether the modes had equal
    hardware."""
    lines = []
    for run in results["runs"]:
        where = " ".join(run["serve_command"]) if run.get("serve_command") else f"running cluster at {run['address']}"
        hw = describe(run["hardware"]) if "hardware" in run else "hardware not recorded (results from before it was)"
        lines += [f"**{run['mode']}**: {hw}", "", "```", where, "```", ""]
    note = hardware_note(results)
    return lines + ([note, ""] if note else [])


def hardware_note(results: dict) -> str | None:
    return comparison_note({run["mode"]: run.get("hardware") for run in results["runs"] if "hardware" in run})


def markdown(results: dict, plots_note: str | None = None) -> str:
    """report.md; `plots_note` in place of the plots when there are none (bench_plots.missing)."""
    cfg, slo, note = results["config"], of_results(results), hardware_note(results)
    machine = results.get("machine") or {}
    lines = [
        "# Disaggregated vs colocated: serving benchmark",
        "",
        f"- started: {results['started']}; model: `{cfg.get('model') or results.get('address')}`",
        f"- hardware: {label(machine)}"
        + (f" ({machine['cpu_model']})" if machine.get("device") == "cpu" and machine.get("cpu_model") else ""),
        f"- workload: {results['workload']}; seed {cfg['seed']}; "
        f"{cfg['warmup_requests']} warm-up requests per cluster, not counted"
        + (f"; then {n} unloaded requests, one at a time" if (n := cfg.get("unloaded_requests")) else ""),
        f"- SLO: TTFT <= {slo['ttft'] * 1e3:.4g} ms and TPOT <= {slo['tpot'] * 1e3:.4g} ms; goodput = requests/s "
        "meeting both",
        f"  - TTFT SLO: {slo['ttft_from']}",
        f"  - TPOT SLO: {slo['tpot_from']}",
        "- latencies measured at the client (see docs/benchmarks.md for definitions)",
        "",
        "## Clusters",
        "",
    ]
    lines += hardware_lines(results)
    engines = any(decode_engines(p) for run in results["runs"] for p in [run.get("unloaded"), *run["points"]])
    if any(run.get("unloaded") for run in results["runs"]):
        lines += ["## Unloaded reference", "", "Requests sent one at a time, before the load points.", ""]
        lines += unloaded_table(results) + [""] + ([BATCH_NOTE, ""] if engines else [])
        engines = False  # explained once
    lines += ["## SLO reading", "", target_definition(results), "", slo_reading(results), ""]
    if note and note.startswith("Not"):
        lines += [note, ""]
    if (reading := placement_reading(results)) is not None:
        lines += ["## Placement reading", "", reading, ""]
    if (reading := policy_reading(results)) is not None:
        lines += ["## Disaggregation policy reading", "", reading, ""]
    for i, point in enumerate(results["load_points"]):
        lines += [f"## {point['label']}", ""] + table(results, i) + [""]
        if engines and any(decode_engines(point_of(run, i)) for run in results["runs"]):
            lines += [BATCH_NOTE, ""]
            engines = False
    problems = failures(results)
    lines += ["## Failures", ""] + (problems or ["None: every request finished."]) + [""]
    plots = [f"Plots skipped: {plots_note.removeprefix('plots skipped: ')}."] if plots_note else [
        f"![{name}]({name})" for name in PLOTS]
    lines += ["## Plots", ""] + plots + [""]
    return "\n".join(lines)


def write_report(out: Path, results: dict) -> list[Path]:
    """report.md and, where matplotlib is installed, the PNGs in `out` (without it, one line on stderr says so and
    how to get them); returns the paths written."""
    note = missing()
    report = out / "report.md"
    report.write_text(markdown(results, note))
    if note:
        print(f"pdcluster: note: {note}", file=sys.stderr, flush=True)
        return [report]
    return [report, *write_plots(out, results, of_results(results))]


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
