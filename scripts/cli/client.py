"""`pdcluster client`: talk to a running router: wait until it can serve, print its stats, or generate."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

import msgspec

from common import auth
from common.protocol import DEFAULT_ROUTER_ADDRESS
from common.sampling_params import InvalidRequest
from router.client import AsyncClient, Client, ClientError, ClientTimeout, Completion
from router.client.core import CONNECT_TIMEOUT_S
from scripts.cli.args import (UsageError, add_prompt_args, add_sampling_args, print_results, read_prompts,
                              sampling_from_args)

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 60.0
STATS_TIMEOUT_S = 10.0


def add_router_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=DEFAULT_ROUTER_ADDRESS, help="the router's address (default %(default)s)")
    p.add_argument("--auth-token-file", default=None,
                   help="file holding the cluster's shared secret "
                        f"(default: ${auth.TOKEN_FILE_ENV} or ${auth.TOKEN_ENV})")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("client", help="talk to a running router: ping, stats, or generate")
    add_router_args(p)
    what = add_prompt_args(p)
    what.add_argument("--ping", action="store_true", help="wait until the cluster can serve: exit 0, else 2")
    what.add_argument("--stats", action="store_true", help="print the router's stats as one JSON line")
    p.add_argument("--timeout", type=float, default=None,
                   help=f"seconds: for --ping (default {PING_TIMEOUT_S:g}), --stats (default {STATS_TIMEOUT_S:g}) "
                        "or each prompt (default: no limit)")
    p.add_argument("--stream", action="store_true",
                   help="print each completion's text as it comes (prompts one after another; not with --json)")
    p.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_S,
                   help="seconds to wait for the router's first answer before saying none is there "
                        "(default %(default)g; --ping waits its --timeout instead)")
    add_sampling_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    """Raises SystemExit(1) when the router answered with an error."""
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0, got {args.timeout:g}")
    token = auth.load_token(args.auth_token_file)
    if args.ping:
        with Client(args.address, auth_token=token) as client:
            client.wait_ready(args.timeout or PING_TIMEOUT_S)  # TimeoutError: main prints it, exit 2
        log.info("cluster at %s is ready", args.address)
    elif args.stats:
        with Client(args.address, auth_token=token, connect_timeout=args.connect_timeout) as client:
            stats = answer_or_exit(lambda: client.stats(timeout=args.timeout or STATS_TIMEOUT_S))
        print(json.dumps(msgspec.to_builtins(stats)), flush=True)
    elif args.stream:
        if args.json:
            raise UsageError("--stream prints text as it comes: leave out --json")
        if not asyncio.run(_stream_each(args, token)):
            raise SystemExit(1)
    elif not asyncio.run(_generate_all(args, token)):
        raise SystemExit(1)


def answer_or_exit(call):
    """The router's answer; an error it sent is one line on stderr and exit 1 (a timeout propagates: exit 2)."""
    try:
        return call()
    except ClientTimeout:
        raise
    except ClientError as exc:
        print(f"pdcluster: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


async def _stream_each(args: argparse.Namespace, token: str | None) -> bool:
    """Each prompt's completion printed delta by delta, a line per prompt; False if any failed."""
    sampling = msgspec.structs.asdict(sampling_from_args(args))
    ok = True
    async with AsyncClient(args.address, timeout=args.timeout, auth_token=token,
                           connect_timeout=args.connect_timeout) as client:
        for index, prompt in enumerate(read_prompts(args)):
            try:
                async for delta in client.stream(prompt, chat=args.chat, **sampling):
                    print(delta.text, end="", flush=True)
            except (ClientError, InvalidRequest) as exc:
                print(f"pdcluster: error: prompt {index}: {exc}", file=sys.stderr)
                ok = False
            print(flush=True)
    return ok


async def _generate_all(args: argparse.Namespace, token: str | None) -> bool:
    """Send every prompt at once, print results in prompt order; False if any failed."""
    prompts = read_prompts(args)
    sampling = msgspec.structs.asdict(sampling_from_args(args))
    async with AsyncClient(args.address, timeout=args.timeout, auth_token=token,
                           connect_timeout=args.connect_timeout) as client:
        outcomes = await asyncio.gather(
            *(client.generate(p, chat=args.chat, **sampling) for p in prompts), return_exceptions=True
        )
    done = []
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, Completion):
            done.append((index, outcome.text, outcome.token_ids))
        elif isinstance(outcome, (ClientError, InvalidRequest)):
            print(f"pdcluster: error: prompt {index}: {outcome}", file=sys.stderr)
        else:
            raise outcome
    print_results(done, args.json)
    return len(done) == len(prompts)
