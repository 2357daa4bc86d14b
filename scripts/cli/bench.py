"""`pdcluster bench`: the serving benchmark (scripts/benchmark.py)."""
from __future__ import annotations

import argparse

from scripts import benchmark
from scripts.cli.args import add_dataclass_args, dataclass_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="serving benchmark: disagg vs colocated clusters at several loads",
                       description=benchmark.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataclass_args(p, benchmark.BenchConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    """Exit status 1 when a cluster would not start or died."""
    results = benchmark.run_benchmark(dataclass_from_args(benchmark.BenchConfig, args))
    if any(run["error"] for run in results["runs"]):
        raise SystemExit(1)
