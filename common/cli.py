"""`pdcluster` command line. Results go to stdout; logs and progress to stderr."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from common.cli_args import add_dataclass_args, dataclass_from_args
from common.config import ConfigError, EngineConfig
from common.sampling_params import InvalidRequest, SamplingParams


class UsageError(Exception):
    """A problem with what the user asked for: one line on stderr, exit status 2."""


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=16)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--seed", type=int, default=None, help="per-request seed")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--stop-token-ids", type=int, nargs="*", default=[])


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed, stop_token_ids=args.stop_token_ids,
                          ignore_eos=args.ignore_eos)


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--prompts", type=Path, help='JSONL file of {"prompt": "..."} lines')
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    p.add_argument("--json", action="store_true", help='one JSON line per prompt: {"index", "text", "token_ids"}')


def read_prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt:
        return args.prompt
    try:
        lines = args.prompts.read_text().splitlines()
    except OSError as e:
        raise UsageError(f"--prompts: cannot read {str(args.prompts)!r}: {e.strerror}") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"--prompts: line {n} is not JSON: {e.msg}") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise UsageError(f'--prompts: line {n} must be an object with a string "prompt"')
        prompts.append(record["prompt"])
    return prompts


def print_results(results: list[tuple[int, str, list[int]]], as_json: bool) -> None:
    for index, text, token_ids in results:
        if as_json:
            print(json.dumps({"index": index, "text": text, "token_ids": token_ids}, ensure_ascii=False), flush=True)
        else:
            print(f"[{index}] {text}", flush=True)


def cmd_generate(args: argparse.Namespace) -> None:
    from common.llm import LLM

    prompts = read_prompts(args)
    sampling = sampling_from_args(args)
    config = dataclass_from_args(EngineConfig, args, exclude=("seed",))
    llm = LLM.from_config(config)
    try:
        outputs = llm.generate(prompts, sampling, chat=args.chat)
    finally:
        llm.close()
    print_results([(o.index, o.text, o.token_ids) for o in outputs], args.json)


def cmd_prepare_model(args: argparse.Namespace) -> None:
    from common import model_prep

    out = Path(args.out)
    if args.source == "smollm2":
        path = model_prep.prepare_smollm2(out)
    else:
        if not args.config:
            raise UsageError("prepare-model random: --config is required")
        path = model_prep.prepare_random(args.config, out, seed=args.seed, dtype=args.dtype)
    print(path)


def cmd_serve(args: argparse.Namespace) -> None:
    from router.launcher import ServeConfig, run_cluster
    from router.router import RouterConfig

    engine = dataclass_from_args(EngineConfig, args)
    router = dataclass_from_args(RouterConfig, args)
    run_cluster(dataclass_from_args(ServeConfig, args), router, engine)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdcluster", description="Disaggregated prefill/decode LLM serving")
    parser.add_argument("--log-level", default=os.environ.get("PDCLUSTER_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="offline generation with the colocated engine")
    add_prompt_args(gen)
    add_sampling_args(gen)
    add_dataclass_args(gen.add_argument_group("engine"), EngineConfig, exclude=("seed",))
    gen.set_defaults(func=cmd_generate)

    from router.launcher import ServeConfig
    from router.router import RouterConfig

    serve = sub.add_parser("serve", help="run a cluster: router + prefill/decode (or colocated) workers on Ray")
    add_dataclass_args(serve.add_argument_group("cluster"), ServeConfig)
    add_dataclass_args(serve.add_argument_group("router"), RouterConfig, exclude=("model",))
    add_dataclass_args(serve.add_argument_group("engine"), EngineConfig)
    serve.set_defaults(func=cmd_serve)

    prep = sub.add_parser("prepare-model", help="write an HF checkpoint: SmolLM2, or random weights of a real config")
    prep.add_argument("source", choices=["smollm2", "random"])
    prep.add_argument("--out", required=True, help="folder to write")
    prep.add_argument("--config", help="tiny-qwen3, tiny-llama, qwen3-0.6b, qwen3-8b, or a config.json path")
    prep.add_argument("--seed", type=int, default=0)
    prep.add_argument("--dtype", default=None, help="weights dtype (default: bfloat16 for real sizes, float32 for tiny)")
    prep.set_defaults(func=cmd_prepare_model)

    from router.client import add_client_parser, add_scale_parser  # lazy: keeps the client free of engine imports
    add_client_parser(sub)
    add_scale_parser(sub)
    from scripts.benchmark import add_bench_parser  # the client and matplotlib load only when it runs
    add_bench_parser(sub)
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


if __name__ == "__main__":
    sys.exit(main())
