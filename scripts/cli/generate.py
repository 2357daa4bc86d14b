"""`pdcluster generate`: offline generation with the colocated engine, in this process."""
from __future__ import annotations

import argparse

from common.config import EngineConfig
from scripts.cli.args import (add_dataclass_args, add_prompt_args, add_sampling_args, dataclass_from_args,
                              print_results, read_prompts, sampling_from_args)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="offline generation with the colocated engine")
    add_prompt_args(p)
    add_sampling_args(p)
    add_dataclass_args(p.add_argument_group("engine"), EngineConfig, exclude=("seed",))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from common.engine.llm import LLM  # the engine (torch) loads only for this command

    prompts = read_prompts(args)
    sampling = sampling_from_args(args)
    llm = LLM.from_config(dataclass_from_args(EngineConfig, args, exclude=("seed",)))
    try:
        outputs = llm.generate(prompts, sampling, chat=args.chat)
    finally:
        llm.close()
    print_results([(o.index, o.text, o.token_ids) for o in outputs], args.json)
