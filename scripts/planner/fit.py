"""Fitting a profile's cost models to measured points (tensor-free, no numpy): non-negative least squares on
relative residuals, so a 2 ms step and a 200 ms one count alike, and every coefficient stays >= 0 as
`Profile.check` wants.

The models are linear in their coefficients (scripts/planner/profile.py); with at most six unknowns (the two prompt
lines fitted together), exact NNLS is cheap by enumeration: solve the unconstrained problem on every subset of the
unknowns, keep the best solution whose coefficients are all >= 0.
"""
from __future__ import annotations

from collections.abc import Callable

import itertools
import math
import statistics
from dataclasses import dataclass

import msgspec

from scripts.planner.points import (DecodePoint, HandoffPoint, MeasuredPoints, MixedPoint, PrefillPoint,
                                    SustainedPoint)
from scripts.planner.profile import (DecodeCost, HandoffCost, PrefillCost, Profile, ProfileError, decode_cost,
                                     step_work)

WARN_ERROR = 0.2  # a fit whose worst point is off by more than this gets a warning line


@dataclass(frozen=True)
class Fit:
    coefficients: list[float]
    worst_error: float  # the largest |predicted - measured| / measured over the points

    def summary(self, name: str) -> str:
        line = f"{name}: worst relative error {100 * self.worst_error:.1f}% over its points"
        if self.worst_error > WARN_ERROR:
            line += f" -- WARNING: above {100 * WARN_ERROR:.0f}%, the cost model fits this machine poorly"
        return line


def nnls(rows: list[list[float]], targets: list[float]) -> list[float]:
    """x >= 0 minimising sum((row . x - target)^2), for a few unknowns (exact, by trying every active set)."""
    if not rows or len(rows) != len(targets):
        raise ValueError("nnls: needs as many targets as rows, and at least one")
    n = len(rows[0])
    best: tuple[float, list[float]] = (_residual(rows, targets, [0.0] * n), [0.0] * n)
    for k in range(1, n + 1):
        for active in itertools.combinations(range(n), k):
            sub = _least_squares([[row[j] for j in active] for row in rows], targets)
            if sub is None or any(v < 0 for v in sub):
                continue
            x = [0.0] * n
            for j, v in zip(active, sub):
                x[j] = v
            r = _residual(rows, targets, x)
            if r < best[0]:
                best = (r, x)
    return best[1]


def _residual(rows: list[list[float]], targets: list[float], x: list[float]) -> float:
    return sum((sum(a * b for a, b in zip(row, x)) - t) ** 2 for row, t in zip(rows, targets))


def _least_squares(rows: list[list[float]], targets: list[float]) -> list[float] | None:
    """The normal equations, solved by Gaussian elimination with columns scaled to unit size (coefficients here
    span 1e-12 to 1e-2); None when they are singular."""
    n = len(rows[0])
    scale = [math.sqrt(sum(row[j] ** 2 for row in rows)) or 1.0 for j in range(n)]
    a = [[row[j] / scale[j] for j in range(n)] for row in rows]
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] + [sum(r[i] * t for r, t in zip(a, targets))]
         for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda i: abs(m[i][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(n):
            if i != col:
                f = m[i][col] / m[col][col]
                m[i] = [x - f * y for x, y in zip(m[i], m[col])]
    return [m[i][n] / m[i][i] / scale[i] for i in range(n)]


def fit_relative(features: list[list[float]], seconds: list[float], offset: float = 0.0) -> Fit:
    """NNLS of seconds ~ offset + features . x, each point weighted by 1 / its seconds (relative residuals).
    `offset` is a known part of every point (the host's launch work, which the simulator adds to every step)."""
    if any(not s > 0 for s in seconds):
        raise ValueError("fit: every measured time must be > 0")
    x = nnls([[f / s for f in row] for row, s in zip(features, seconds)], [1.0 - offset / s for s in seconds])
    return Fit(x, worst_error(features, seconds, x, offset))


def relative_errors(features: list[list[float]], seconds: list[float], x: list[float], offset: float = 0.0
                    ) -> list[float]:
    """Each point's (fitted - measured) / measured."""
    return [(offset + sum(f * c for f, c in zip(row, x)) - s) / s for row, s in zip(features, seconds)]


def worst_error(features: list[list[float]], seconds: list[float], x: list[float], offset: float = 0.0) -> float:
    return max(map(abs, relative_errors(features, seconds, x, offset)))


# The floors a prompt fit tries (PrefillCost.min_tokens, context_min_tokens): it keeps the pair whose fit has the
# least squared relative error. Past a few hundred tokens a GPU's tiles are full.
MIN_TOKENS = (0, 64, 128, 256, 512)
CONTEXT_MIN_TOKENS = (0, 256, 512, 768, 1024, 2048)


def _prefill_row(p: PrefillPoint, min_tokens: int, context_min_tokens: int, eager: bool | None,
                 eager_pairs: bool = False) -> list[float]:
    """A one-prompt step's features: (base, GEMM tokens) on its side (None: one side for every point), and the pairs
    it attends, context and its own together (one cost a pair: the same kernel's work either way); with
    `eager_pairs`, each side's pairs in a column of their own."""
    gemm, context_pairs, chunk_pairs = step_work(p.tokens, [(p.tokens, p.context)], min_tokens, context_min_tokens)
    pairs = context_pairs + chunk_pairs
    if eager is None:
        return [1.0, float(gemm), pairs]
    side = [0.0, 0.0, 1.0, float(gemm)] if eager else [1.0, float(gemm), 0.0, 0.0]
    if eager_pairs:
        return [*side, *([0.0, pairs] if eager else [pairs, 0.0])]
    return [*side, pairs]


def _best_prefill_fit(points: list[PrefillPoint], host_launch_s: float,
                      eager_of: Callable[[PrefillPoint], bool | None], eager_pairs: bool = False
                      ) -> tuple[list[float], int, int]:
    """The prompt fit (coefficients, min_tokens, context_min_tokens) whose squared relative error is least over
    every pair of floors tried."""
    seconds = [p.seconds for p in points]
    best = None
    for floors in itertools.product(MIN_TOKENS, CONTEXT_MIN_TOKENS):
        rows = [_prefill_row(p, *floors, eager_of(p), eager_pairs) for p in points]
        x = fit_relative(rows, seconds, host_launch_s).coefficients
        err = sum(e * e for e in relative_errors(rows, seconds, x, host_launch_s))
        if best is None or err < best[0] - 1e-12:
            best = (err, x, *floors)
    return best[1], best[2], best[3]


def _prompt_cost(base: float, per_token: float, per_pair: float, floors: tuple[int, int]) -> PrefillCost:
    return PrefillCost(base_s=base, per_token_s=per_token, per_token_context_s=per_pair, per_chunk_pair_s=per_pair,
                       min_tokens=floors[0], context_min_tokens=floors[1])


def fit_prefill(points: list[PrefillPoint], host_launch_s: float = 0.0) -> tuple[PrefillCost, Fit]:
    """A prefill-only step: the simulator charges host_launch_s + PrefillCost.seconds(tokens, context)."""
    x, *floors = _best_prefill_fit(points, host_launch_s, lambda p: None)
    rows = [_prefill_row(p, *floors, None) for p in points]
    return _prompt_cost(*x, floors), Fit(x, worst_error(rows, [p.seconds for p in points], x, host_launch_s))


def tells_its_square(points: list[PrefillPoint]) -> bool:
    """Whether prompt points can tell a cost a pair attended from a line through them: at least two prompt sizes,
    and more points than the line and the square have unknowns (a base, a cost a token, a cost a pair)."""
    return len({p.tokens for p in points}) >= 2 and len({(p.tokens, p.context) for p in points}) > 3


def fit_prefill_costs(points: list[PrefillPoint], host_launch_s: float, graph_max: int
                      ) -> tuple[PrefillCost, PrefillCost | None, dict[str, Fit]]:
    """`Profile.prefill` and `prefill_eager`: prompt steps of up to `graph_max` tokens replay a graph, those past it
    run eagerly, launch-bound, so each side has its own base and per-token cost, and the floors are fitted over
    every point. Each side has its own cost a pair attended (with the context before a chunk or among its own tokens:
    one cost, the same kernel's work either way) where the eager side measured sizes and prefixes enough to tell its
    square from its line: a cost shared with the graphed side, whose short prompts bend with their GEMMs, priced
    an H200's 8,192-token prompt 8% low and its cached prefixes 11% high (docs/benchmarks.md, "Stop 28"). With fewer
    eager points the two sides share that cost: a separate one for a chunk's own pairs then took up the bend of the
    graphed side's GEMMs (an H200's eager line cost nothing a token). One cost for all (and None) when one side has
    no points."""
    graphed = [p for p in points if p.tokens <= graph_max]
    eager = [p for p in points if p.tokens > graph_max]
    if not (graphed and eager):
        prefill, fit = fit_prefill(points, host_launch_s)
        return prefill, None, {"prefill": fit}
    own = tells_its_square(eager)
    x, *floors = _best_prefill_fit(points, host_launch_s, lambda p: p.tokens > graph_max, own)
    base, per_token, eager_base, eager_per_token, per_pair, *rest = x
    eager_per_pair = rest[0] if own else per_pair
    fits = {name: Fit(x, worst_error([_prefill_row(p, *floors, name == "prefill_eager", own) for p in side],
                                     [p.seconds for p in side], x, host_launch_s))
            for name, side in (("prefill", graphed), ("prefill_eager", eager))}
    return (_prompt_cost(base, per_token, per_pair, floors),
            _prompt_cost(eager_base, eager_per_token, eager_per_pair, floors), fits)


def fit_decode(points: list[DecodePoint], host_launch_s: float = 0.0) -> tuple[DecodeCost, Fit]:
    """A decode-only step: the simulator charges host_launch_s + DecodeCost.seconds(batch, total_context)."""
    fit = fit_relative([[1.0, p.batch, p.total_context] for p in points], [p.seconds for p in points],
                       host_launch_s)
    base, per_seq, per_context = fit.coefficients
    return DecodeCost(base_s=base, per_seq_s=per_seq, per_seq_context_s=per_context), fit


def fit_decode_costs(points: list[DecodePoint], host_launch_s: float, skinny_max: int
                     ) -> tuple[DecodeCost, DecodeCost | None, dict[str, Fit]]:
    """`Profile.decode` and `decode_skinny`: decode steps of up to `skinny_max` sequences run the skinny GEMMs, far
    below the line through larger batches, so each side has its own line. One line (and None) when one side has
    no points."""
    skinny = [p for p in points if p.batch <= skinny_max]
    rest = [p for p in points if p.batch > skinny_max]
    if not (skinny and rest):
        decode, fit = fit_decode(points, host_launch_s)
        return decode, None, {"decode": fit}
    (decode, fit), (decode_skinny, skinny_fit) = fit_decode(rest, host_launch_s), fit_decode(skinny, host_launch_s)
    return decode, decode_skinny, {"decode": fit, "decode_skinny": skinny_fit}


def fit_handoff(points: list[HandoffPoint]) -> tuple[HandoffCost, Fit]:
    features, seconds = [[1.0, p.num_bytes] for p in points], [p.seconds for p in points]
    fit = fit_relative(features, seconds)
    base, per_byte = fit.coefficients
    if per_byte <= 0:  # time did not grow with size over these points: bound the rate by the largest point's
        largest = max(points, key=lambda p: p.num_bytes)
        per_byte = largest.seconds / largest.num_bytes
        fit = Fit([base, per_byte], worst_error(features, seconds, [base, per_byte]))
    return HandoffCost(base_s=base, bytes_per_s=1.0 / per_byte), fit


def apart_seconds(p: MixedPoint, host_launch_s: float, prefill: PrefillCost,
                  decode_cost: Callable[[int], DecodeCost]) -> float:
    """What the simulator charges a mixed step before `mixed_step_s`: its decode part (`decode_cost(batch)`, as
    Profile.decode_cost) and its prompt part, each as its own fit says (both bases), and the host's work once."""
    return host_launch_s + prefill.seconds(p.tokens) + decode_cost(p.batch).seconds(p.batch, p.total_context)


def fit_mixed(points: list[MixedPoint], host_launch_s: float, prefill: PrefillCost,
              decode_cost: Callable[[int], DecodeCost]) -> tuple[float, Fit]:
    """`mixed_step_s`: the median of what each mixed step took beyond its two parts apart, at least 0 (a
    constant: the points print beside it, to show whether it grows with the batch)."""
    if not points:
        return 0.0, Fit([0.0], 0.0)
    apart = [apart_seconds(p, host_launch_s, prefill, decode_cost) for p in points]
    extra = max(0.0, statistics.median(p.seconds - a for p, a in zip(points, apart)))
    worst = max(abs(a + extra - p.seconds) / p.seconds for p, a in zip(points, apart))
    return extra, Fit([extra], worst)


def sustained_factor(point: SustainedPoint | None) -> float:
    """`Profile.sustained_prefill_factor`: back to back over alone, at least 1 (a host that runs steps back to back
    faster than alone has no power limit to model); 1 when not measured."""
    return 1.0 if point is None else max(1.0, point.back_to_back_s / point.alone_s)


def fit_costs(points: MeasuredPoints, host_launch_s: float, graph_max: int, skinny_max: int
              ) -> tuple[dict[str, object], dict[str, Fit]]:
    """A profile's cost fields fitted to `points` (prompt steps past `graph_max` tokens run eagerly, decode steps of
    up to `skinny_max` sequences the skinny GEMMs), and each fit, by name."""
    prefill, prefill_eager, fits = fit_prefill_costs(points.prefill, host_launch_s, graph_max)
    decode, decode_skinny, decode_fits = fit_decode_costs(points.decode, host_launch_s, skinny_max)
    fits.update(decode_fits)
    mixed_step_s, fits["mixed"] = fit_mixed(points.mixed, host_launch_s, prefill,
                                            lambda b: decode_cost(b, decode, decode_skinny, skinny_max))
    handoff = {}
    for name, handoffs in points.handoff.items():
        handoff[name], fits[f"handoff.{name}"] = fit_handoff(handoffs)
    costs = dict(prefill=prefill, prefill_eager=prefill_eager, decode=decode, decode_skinny=decode_skinny,
                 decode_skinny_max_batch=skinny_max if decode_skinny else 0, mixed_step_s=mixed_step_s,
                 handoff=handoff, sustained_prefill_factor=sustained_factor(points.sustained))
    return costs, fits


def refit(profile: Profile) -> tuple[Profile, dict[str, Fit]]:
    """`profile` with its costs fitted again to the points it keeps, by this tree's models. A transport with no
    points (a cost added by hand) keeps its cost."""
    if profile.points is None:
        raise ProfileError("this profile keeps no measured points (measured before stop 25): measure it again with "
                           "`pdcluster profile`")
    costs, fits = fit_costs(profile.points, profile.host_launch_s, profile.prefill_graph_max_tokens,
                            profile.decode_skinny_max_batch)
    costs["handoff"] = {**profile.handoff, **costs["handoff"]}
    fitted = msgspec.structs.replace(profile, **costs)
    fitted.check()
    return fitted, fits
