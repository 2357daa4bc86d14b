"""`pdcluster plan`: predicts TTFT, TPOT and goodput of every prefill:decode split of N GPUs (and colocated
replicas) from a cost profile, by simulation on the CPU, and recommends one (scripts/planner/, docs/planner.md)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from scripts.cli.args import UsageError, add_dataclass_args, dataclass_from_args
from scripts.planner.config import BENCH_ONLY, MAX_SPLITS, PlanConfig


PLAN_DOC = f"""Every split xP:yD of the GPUs (x + y = GPUS; with --profile at TP t, of GPUS / t engines) and as many
colocated replicas (one GPU: a colocated engine, or 1P:1D sharing it in turns or under MPS), each split with each
of --disagg-policies, simulated at every rate on the bench's workloads (the same flags, requests and arrival times
as `pdcluster bench`). Where the top rate needs more routers than one
(--router-rps or the measured ceiling; --routers sets them), each router fronts its own shard of the engines with
its share of the clients, and a layout is predicted from its distinct shards, each simulated alone at its share of
the rate. Beyond {MAX_SPLITS} distinct splits (or shards), a coarse grid and then halving steps around the best
(--all-splits: every one). The recommendation: the layout sustaining the highest rate (90% of requests within both
SLOs), then the most within them at the highest rate, then the most headroom. The pick is then simulated again on
another draw of the workload (`noise:`, how far its figures move by chance) and on GPUs --slower-gpus slower
(`machine:`, how far they move on a slower machine of the kind).

--validate RESULTS.json[,RESULTS.json...]: instead of a plan, each mode of those `pdcluster bench` runs (of one
machine) simulated on its requests at its send times, predicted / measured (error) side by side (OUT/validation.md
and validation.json with --out)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="predict the best prefill:decode split of N GPUs for a workload (simulated)",
                       description=__doc__ + "\n\n" + PLAN_DOC,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataclass_args(p, PlanConfig, exclude=BENCH_ONLY)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from scripts.planner.plan import redraw, run_plan  # the simulator loads only when a plan runs
    from scripts.planner.plots import draw
    from scripts.planner.config import DEFAULT_REQUESTS
    from scripts.planner.report import ATTAINMENT, machine_line, moved, noise_line, recommend, short_spans, table
    from scripts.planner.router_ceiling import plan_checks, summary
    from scripts.planner.sim import ACROSS_GPUS

    cfg = dataclass_from_args(PlanConfig, args, exclude=BENCH_ONLY)
    if cfg.validate:
        return run_validate(cfg)
    last = [time.monotonic()]

    def progress(line: str) -> None:  # at most every 5 s: a long plan says how far it is
        if time.monotonic() - last[0] >= 5:
            last[0] = time.monotonic()
            print(f"plan: {line}", file=sys.stderr, flush=True)

    plan = run_plan(cfg, progress=progress)
    for prof in plan.profiles:
        print(f"profile: {prof.model} on {prof.machine} (tp {prof.tp})" + (f" -- {prof.note}" if prof.note else ""))
    prof = plan.profiles[0]
    slo = cfg.slo()
    gpus = f"{cfg.gpus} GPU{'s' if cfg.gpus > 1 else ''}"
    print(f"{gpus}; SLO: TTFT <= {slo.ttft:g} s, TPOT <= {slo.tpot:g} s; a layout sustains a rate when "
          f"{100 * ATTAINMENT:g}% of its requests meet both")
    if plan.capacity:
        print(rates_line(plan))
    if plan.skipped_splits:
        print(f"(more than {MAX_SPLITS} splits: a coarse grid, then refined around the best; "
              f"--all-splits simulates every one)")
    for line in router_lines(plan):
        print(line)
    shown = {name: points for name, points in plan.results.items() if name not in plan.hidden}
    print(table(shown))
    if plan.hidden:
        print(f"({len(plan.results)} layouts simulated; the table shows an even grid of the splits and the best "
              f"three; {'plan.json has' if cfg.out else '--out writes plan.json with'} every one)")
    for p in plan.profiles:
        if cfg.gpus // p.tp > 1 and (stand_in := p.cost_transport(ACROSS_GPUS)) != ACROSS_GPUS:
            print(f"note: KV handoffs between GPUs go over {ACROSS_GPUS}, costed here as {stand_in}: the profile "
                  f"({p.machine}, tp {p.tp}) has no {ACROSS_GPUS} cost (`pdcluster profile` measures it on two GPUs)")
    if not cfg.trace:
        for line in short_spans(plan.results, cfg.num_requests or DEFAULT_REQUESTS):
            print(f"note: {line}")
    best, why = recommend(plan.results, slo)
    print(f"recommendation: {best}: {why}")
    top = max(p.rate for p in plan.results[best])
    if plan.capacity and any(p.rate == top and p.sustained for p in plan.results[best]):
        print(f"note: {best} sustains the highest rate simulated ({top:g} req/s), so its ceiling is above it: "
              f"--rates higher to find it")
    again = None
    if not cfg.trace:  # a trace is one draw
        again = redraw(plan, best, cfg.seed + 1)
        print(noise_line(best, cfg.seed + 1, moved(plan.results[best], again)))
    slower = None
    if cfg.slower_gpus:
        slower = redraw(plan, best, cfg.seed, cfg.slower_gpus)
        print(machine_line(best, cfg.slower_gpus, plan.results[best], slower, slo))
    routers = plan_checks(plan)
    print("\n".join(summary(routers)), flush=True)
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        record = {"profiles": cfg.profile_list(), "machines": [p.machine for p in plan.profiles],
                  "model": prof.model, "tp": [p.tp for p in plan.profiles], "gpus": cfg.gpus,
                  "slo": dataclasses.asdict(slo), "rates": [rate for rate, _ in plan.loads],
                  "capacity": dataclasses.asdict(plan.capacity) if plan.capacity else None,
                  "recommendation": {"layout": best, "why": why},
                  "router": [dict(dataclasses.asdict(c), exceeded=c.exceeded) for c in routers],
                  "results": {name: [dataclasses.asdict(p) for p in points]
                              for name, points in plan.results.items()},
                  "redraw": None if again is None else {"layout": best, "seed": cfg.seed + 1,
                                                        "points": [dataclasses.asdict(p) for p in again]},
                  "slower_gpus": None if slower is None else {"layout": best, "share": cfg.slower_gpus,
                                                              "points": [dataclasses.asdict(p) for p in slower]}}
        (out / "plan.json").write_text(json.dumps(record, indent=2) + "\n")
        plots = draw(shown, plan.layouts, best, slo, f"{prof.model} on {prof.machine}, {cfg.gpus} GPUs (predicted)",
                     out)
        note = ", ".join(str(p) for p in plots) if plots else "no plots (matplotlib is not installed)"
        print(f"wrote {out / 'plan.json'}; {note}", file=sys.stderr)


def rates_line(plan) -> str:
    """Where the rates of a plan given none came from."""
    cap, cfg = plan.capacity, plan.config
    return (f"rates: {', '.join(f'{rate:g}' for rate, _ in plan.loads)} req/s (no --rates: half to 1.25 times the "
            f"most {cfg.gpus} GPUs could serve, about {cap.rate:.4g} req/s with every GPU busy: a request takes "
            f"{1e3 * cap.prefill_s:.3g} ms of full prompt steps and {1e3 * cap.decode_s:.3g} ms of decode steps of "
            f"{cap.seats})")


def router_lines(plan) -> list[str]:
    """How the plan put routers in front of the engines, where it put more than one."""
    from scripts.planner.shards import shard_sizes

    lines = []
    for prof in plan.profiles:
        n = plan.config.gpus // prof.tp
        tp = f"tp{prof.tp} " if prof.tp > 1 else ""
        for mode, k in plan.routers.get(prof.tp, {}).items():
            if mode == "disagg" and plan.unsharded.get(prof.tp) == n - 1:
                lines.append(f"routers: {tp}disagg: no split of {n} engines gives each of {k} routers a prefill and a "
                             f"decode engine; none planned")
            elif k > 1:
                sizes = "-".join(map(str, sorted(set(shard_sizes(n, k)))))
                lines.append(f"routers: {tp}{mode} layouts behind {k} routers, each in front of {sizes} "
                             f"engine{'s' if sizes != '1' else ''} with its share of the clients: each layout "
                             f"predicted from its shards, each simulated alone (--routers 1: one router, simulated "
                             f"whole)")
        if 0 < plan.unsharded.get(prof.tp, 0) < n - 1:
            lines.append(f"routers: {plan.unsharded[prof.tp]} splits with fewer prefill or decode engines than "
                         f"routers left out (each router needs one of each)")
    return lines


def run_validate(cfg: PlanConfig) -> None:
    from scripts.planner.profile import load_profile
    from scripts.planner.bench_replay import ValidationError
    from scripts.planner.validate import machine_reach, markdown, table, to_json, validate

    profile = load_profile(cfg.profile)
    paths = [Path(p.strip()) for p in cfg.validate.split(",") if p.strip()]
    results = []
    for path in paths:
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            raise UsageError(f"--validate: cannot read {str(path)!r}: {e}") from None
    try:
        rows = validate(results, profile)
        if cfg.slower_gpus:
            machine_reach(results, profile, rows, cfg.slower_gpus, cfg.tolerance)
    except ValidationError as e:
        raise UsageError(f"--validate: {e}") from None
    source = ", ".join(map(str, paths))
    workload = "; ".join(dict.fromkeys(r.get("workload", "") for r in results))
    print(f"profile: {profile.model} on {profile.machine}" + (f" -- {profile.note}" if profile.note else ""))
    print(f"bench: {source} ({workload}); cells: predicted / measured (error), ! beyond {100 * cfg.tolerance:g}%")
    print(table(rows, cfg.tolerance), flush=True)
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "validation.md").write_text(markdown(rows, profile, source, cfg.tolerance))
        record = {"results": [str(p) for p in paths], "profile": cfg.profile, "tolerance": cfg.tolerance,
                  "rows": to_json(rows, cfg.tolerance)}
        (out / "validation.json").write_text(json.dumps(record, indent=2) + "\n")
        from scripts.planner.plots import draw_validation
        plot = draw_validation(rows, f"{profile.model} on {profile.machine}: {workload}"[:110], out)
        plot_note = str(plot) if plot else "no plot (matplotlib is not installed)"
        print(f"wrote {out / 'validation.md'}, {out / 'validation.json'}, {plot_note}", file=sys.stderr)
