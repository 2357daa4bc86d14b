"""What every subcommand shares: flags generated from a config dataclass (each component's config is one source of
truth), sampling flags, prompts in, results out, and the one-line usage error."""
from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from pathlib import Path

from common.sampling_params import SamplingParams


class UsageError(Exception):
    """A problem with what the user asked for: one line on stderr, exit status 2."""


METAVARS = {int: "N", float: "X", str: "STR"}


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, exclude: tuple[str, ...] = ()) -> None:
    """One flag per field, with its help and its default as a user would write it (sizes as sizes, on/off flags
    as on or off); a field's metadata may give `parse` (text -> value), `show` (value -> text) and `metavar`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.name in exclude:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = _base_type(hints[f.name])
        default = None if f.default is dataclasses.MISSING else f.default
        help_text = f.metadata.get("help", "")
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=f"{help_text} (default: {'on' if default else 'off'})")
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        shown = "" if default is None else f" (default: {f.metadata.get('show', str)(default)})"
        parser.add_argument(flag, type=f.metadata.get("parse", kind), default=default, required=required,
                            metavar=f.metadata.get("metavar", "SIZE" if "show" in f.metadata else METAVARS.get(kind)),
                            help=(help_text + shown).replace("%", "%%"))


def dataclass_from_args(cls: type, args: argparse.Namespace, exclude: tuple[str, ...] = (), **overrides):
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
              if f.init and f.name not in exclude and hasattr(args, f.name)}
    values.update(overrides)
    return cls(**values)


def _base_type(hint: object) -> type:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint  # type: ignore[return-value]


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=16, metavar="N",
                   help="most tokens to generate per prompt (default %(default)s)")
    g.add_argument("--temperature", type=float, default=0.0, metavar="X",
                   help="0 = greedy, the most likely token each step (default); higher samples more freely")
    g.add_argument("--top-p", type=float, default=1.0, metavar="X",
                   help="sample only from the most likely tokens whose probabilities add up to X (default 1: all)")
    g.add_argument("--top-k", type=int, default=-1, metavar="N",
                   help="sample only from the N most likely tokens (default -1: all)")
    g.add_argument("--seed", type=int, default=None, metavar="N",
                   help="per-request seed: the same seed gives the same sample (default: none)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    g.add_argument("--stop-token-ids", type=int, nargs="*", default=[], metavar="ID",
                   help="token ids that end the completion (besides the model's end of sequence)")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed, stop_token_ids=args.stop_token_ids,
                          ignore_eos=args.ignore_eos)


def add_prompt_args(p: argparse.ArgumentParser, *, required: bool = True) -> argparse._MutuallyExclusiveGroup:
    """--prompt / --prompts (one of them), --chat and --json; returns the group, to which a caller may add
    other choices that replace a prompt (`client --ping`)."""
    src = p.add_mutually_exclusive_group(required=required)
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--prompts", type=Path, help='JSONL file of {"prompt": "..."} lines')
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    p.add_argument("--json", action="store_true", help='one JSON line per prompt: {"index", "text", "token_ids"}')
    return src


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
