"""The `pdcluster` command line: one module a subcommand. Results go to stdout; logs and progress to stderr.

Nothing here loads torch until a subcommand that runs the engine does (`generate`): the router, the clients and
the benchmark driver run without it.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys

from common.config import ConfigError
from common.sampling_params import InvalidRequest

from scripts.cli import bench, client, generate, plan, prepare_model, profile, refit_profile, scale, serve
from scripts.cli.args import UsageError

SUBCOMMANDS = (generate, serve, prepare_model, client, scale, bench, plan, profile, refit_profile)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def version() -> str:
    try:
        return importlib.metadata.version("pdcluster")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdcluster", description="Disaggregated prefill/decode LLM serving")
    parser.add_argument("--version", action="version", version=f"pdcluster {version()}")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                        default=os.environ.get("PDCLUSTER_LOG_LEVEL", "INFO").upper(),
                        help="what goes to stderr (default: %(default)s, or $PDCLUSTER_LOG_LEVEL)")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in SUBCOMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args.func(args)
    except (UsageError, ConfigError, InvalidRequest, OSError, ValueError) as e:
        if args.log_level.upper() == "DEBUG":
            raise
        print(f"pdcluster: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
