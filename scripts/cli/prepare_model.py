"""`pdcluster prepare-model`: an HF checkpoint the engine can serve, offline (SmolLM2, or random weights)."""
from __future__ import annotations

import argparse
from pathlib import Path

from scripts.cli.args import UsageError
from scripts.model_prep import BUILTIN_CONFIGS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare-model", help="write an HF checkpoint: SmolLM2, or random weights of a real config")
    p.add_argument("source", choices=["smollm2", "random"])
    p.add_argument("--out", required=True, help="folder to write")
    p.add_argument("--config", help=f"{', '.join(BUILTIN_CONFIGS)}, or a config.json path")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default=None, help="weights dtype (default: bfloat16 for real sizes, float32 for tiny)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it is a non-empty folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    if args.source == "smollm2":
        from scripts.model_prep import prepare_smollm2

        path = prepare_smollm2(out, overwrite=args.overwrite)
    else:
        from scripts.model_prep import prepare_random

        if not args.config:
            raise UsageError("prepare-model random: --config is required")
        path = prepare_random(args.config, out, seed=args.seed, dtype=args.dtype, overwrite=args.overwrite)
    print(path)
