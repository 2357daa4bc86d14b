"""`pdcluster profile`: measures one model's costs on this machine (prefill against prompt tokens and a cached
prefix, the decode step against batch and context, each KV transport's handoff, the host's per-step work), fits
the planner's cost models and writes the profile `pdcluster plan --profile` reads (docs/planner.md)."""
from __future__ import annotations

import argparse
import sys
import time

from scripts.cli.args import add_dataclass_args, dataclass_from_args
from scripts.planner.profile_config import NOT_FLAGS, ProfileConfig

PROFILE_DOC = """The engine is built as `serve` builds one (the same engine flags; CUDA graphs and warm-up on a GPU),
and every step is timed warm. Progress goes to stderr; the points, each fit's worst relative error (a warning above
20%) and the coefficients to stdout. --quick measures fewer points."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="measure this machine's cost profile of a model for `pdcluster plan`",
                       description=__doc__ + "\n\n" + PROFILE_DOC,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataclass_args(p, ProfileConfig, exclude=NOT_FLAGS)
    p.set_defaults(func=run)


def progress(line: str) -> None:
    print(f"profile: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> None:
    cfg = dataclass_from_args(ProfileConfig, args, exclude=NOT_FLAGS)
    from scripts.planner.measure.run import measure_profile  # torch loads only when a profile is measured
    from scripts.planner.fit import apart_seconds
    from scripts.planner.profile import save_profile

    start = time.perf_counter()
    profile, measured = measure_profile(cfg, progress)
    print(f"profile of {profile.model} on {profile.machine} (tp {profile.tp}): {profile.note}")
    print(f"engine: {profile.num_kv_blocks} KV blocks of {profile.block_size} tokens, {profile.kv_bytes_per_token} "
          f"KV bytes/token, step budget {profile.max_num_batched_tokens} tokens, max {profile.max_num_seqs} seqs; "
          f"started in {measured.engine_start_s:.1f} s")
    print(f"host_launch_s {profile.host_launch_s:.3e}: the host's work per step, added to every simulated step")
    h = profile.host_launch_s
    print(f"\n{'prefill tokens':>14} {'cached':>7} {'measured ms':>12} {'fit ms':>9}")
    for p in measured.points.prefill:
        cost, _ = profile.prefill_cost(p.tokens)
        fit = h + cost.seconds(p.tokens, p.context)
        print(f"{p.tokens:>14} {p.context:>7} {p.seconds * 1e3:>12.3f} {fit * 1e3:>9.3f}")
    if profile.prefill_graph_max_tokens:
        print(f"(up to {profile.prefill_graph_max_tokens} tokens a prompt step replays a graph: the prefill fit; "
              "past it, the prefill_eager fit)")
    for name in ("prefill", "prefill_eager"):
        if name in measured.fits:
            print(measured.fits[name].summary(name))
    print(f"\n{'decode batch':>12} {'mean ctx':>9} {'measured ms':>12} {'fit ms':>9}")
    for d in measured.points.decode:
        print(f"{d.batch:>12} {d.total_context // d.batch:>9} {d.seconds * 1e3:>12.3f} "
              f"{(h + profile.decode_cost(d.batch).seconds(d.batch, d.total_context)) * 1e3:>9.3f}")
    if profile.decode_skinny is not None:
        print(f"(up to {profile.decode_skinny_max_batch} sequences a decode step runs the skinny GEMMs: the "
              "decode_skinny fit; past it, the decode fit)")
    for name in ("decode", "decode_skinny"):
        if name in measured.fits:
            print(measured.fits[name].summary(name))
    if measured.points.mixed:
        print(f"\n{'mixed: decodes':>14} {'mean ctx':>9} {'prompt':>7} {'measured ms':>12} {'apart ms':>9} "
              f"{'fit ms':>9}")
        for m in measured.points.mixed:
            apart = apart_seconds(m, h, profile.prefill, profile.decode_cost)
            print(f"{m.batch:>14} {m.total_context // m.batch:>9} {m.tokens:>7} {m.seconds * 1e3:>12.3f} "
                  f"{apart * 1e3:>9.3f} {(apart + profile.mixed_step_s) * 1e3:>9.3f}")
        print(measured.fits["mixed"].summary("mixed"))
    for name, points in measured.points.handoff.items():
        print(f"\n{'handoff ' + name:>16} {'MB':>9} {'measured ms':>12} {'fit ms':>9}")
        for pt in points:
            print(f"{'':>16} {pt.num_bytes / 1e6:>9.2f} {pt.seconds * 1e3:>12.3f} "
                  f"{profile.handoff[name].seconds(pt.num_bytes) * 1e3:>9.3f}")
        print(measured.fits[f"handoff.{name}"].summary(f"handoff {name}"))
    for line in measured.skipped:
        print(f"skipped: {line}")
    pc, dc = profile.prefill, profile.decode
    for name, cost in (("prefill", pc), ("prefill_eager", profile.prefill_eager)):
        if cost is not None:
            print(f"\n{name}: base_s {cost.base_s:.3e}, per_token_s {cost.per_token_s:.3e}, per_token_context_s "
                  f"{cost.per_token_context_s:.3e}, per_chunk_pair_s {cost.per_chunk_pair_s:.3e}")
    print(f"decode: base_s {dc.base_s:.3e}, per_seq_s {dc.per_seq_s:.3e}, per_seq_context_s {dc.per_seq_context_s:.3e}")
    print(f"mixed_step_s {profile.mixed_step_s:.3e}: added to a step with prompt tokens and decodes")
    print(f"sustained_prefill_factor {profile.sustained_prefill_factor:.3f}: prompt steps back to back over alone")
    for name, cost in profile.handoff.items():
        print(f"handoff {name}: base_s {cost.base_s:.3e}, bytes_per_s {cost.bytes_per_s:.3e}")
    save_profile(profile, cfg.out)
    print(f"wrote {cfg.out} ({time.perf_counter() - start:.0f} s in all)", flush=True)
