"""`pdcluster refit-profile`: fits a profile's costs again to the points it keeps, by this tree's cost models,
without a GPU: for a profile measured before a model changed (docs/planner.md, "Profiles")."""
from __future__ import annotations

import argparse
import datetime

import msgspec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("refit-profile", help="fit a profile's costs again to its measured points (no GPU needed)",
                       description=__doc__)
    p.add_argument("profile", help="a profile written by `pdcluster profile` (stop 25 on: it keeps its points)")
    p.add_argument("--out", required=True, help="where to write the refitted profile")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from scripts.planner.fit import refit
    from scripts.planner.profile import load_profile, save_profile

    profile, fits = refit(load_profile(args.profile))
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    save_profile(msgspec.structs.replace(profile, note=f"{profile.note}; refitted to its points on {day}"), args.out)
    for name, fit in fits.items():
        print(fit.summary(name))
    print(f"wrote {args.out}")
