"""`pdcluster serve`: a router and its workers on Ray, until SIGINT or SIGTERM."""
from __future__ import annotations

import argparse

from common.config import EngineConfig
from router.config import RouterConfig
from router.launcher import ServeConfig, run_cluster
from scripts.cli.args import add_dataclass_args, dataclass_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run a cluster: router + prefill/decode (or colocated) workers on Ray")
    add_dataclass_args(p.add_argument_group("cluster"), ServeConfig)
    add_dataclass_args(p.add_argument_group("router"), RouterConfig, exclude=("model",))
    add_dataclass_args(p.add_argument_group("engine"), EngineConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    engine = dataclass_from_args(EngineConfig, args)
    router = dataclass_from_args(RouterConfig, args)
    run_cluster(dataclass_from_args(ServeConfig, args), router, engine)
