"""`pdcluster scale`: add or remove workers of a running cluster, without a restart."""
from __future__ import annotations

import argparse
import json
import sys

import msgspec

from common import auth
from router.client import Client
from scripts.cli.client import add_router_args, answer_or_exit

SCALE_TIMEOUT_S = 900.0  # workers load their model, or drain their requests


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scale", help="add or remove workers of a running cluster, without a restart")
    add_router_args(p)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--prefill", type=int, help="prefill workers to add (+N) or remove (-N)")
    what.add_argument("--decode", type=int, help="decode workers to add (+N) or remove (-N)")
    what.add_argument("--workers", type=int, help="colocated workers to add (+N) or remove (-N)")
    p.add_argument("--timeout", type=float, default=SCALE_TIMEOUT_S,
                   help="seconds to wait for the workers to load or drain (default %(default)g)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    """One JSON line with the reply; exit 1 when the router could not do it all."""
    role, delta = next((r, d) for r, d in (("prefill", args.prefill), ("decode", args.decode),
                                           ("colocated", args.workers)) if d is not None)
    with Client(args.address, auth_token=auth.load_token(args.auth_token_file)) as client:
        reply = answer_or_exit(lambda: client.scale(role, delta, timeout=args.timeout))
    print(json.dumps(msgspec.to_builtins(reply)), flush=True)
    if not reply.ok:
        print(f"pdcluster: error: {reply.message}", file=sys.stderr)
        raise SystemExit(1)
