"""What `pdcluster profile` measured: the points its cost models are fitted to (scripts/planner/fit.py). A profile
keeps them (`Profile.points`), so a changed model refits them without a GPU (`pdcluster refit-profile`)."""
from __future__ import annotations

from dataclasses import dataclass

import msgspec


@dataclass(frozen=True)
class PrefillPoint:
    tokens: int  # prompt tokens the step computed
    context: int  # tokens before them (a cached prefix)
    seconds: float  # the whole step, as measured


@dataclass(frozen=True)
class DecodePoint:
    batch: int
    total_context: int  # the batch's contexts added up
    seconds: float  # one decode step, as measured


@dataclass(frozen=True)
class MixedPoint:
    """A step with a prompt of `tokens` beside a decode batch (the engine runs it eagerly, no decode graph)."""

    batch: int
    total_context: int  # the decodes' contexts added up
    tokens: int
    seconds: float  # the whole step, as measured


@dataclass(frozen=True)
class SustainedPoint:
    """One prompt step of `prompts` prompts, `tokens` in all: the least of a few each after a pause (`alone_s`), and
    the median of the same step run back to back once the GPU has run them for a while (`back_to_back_s`)."""

    tokens: int
    prompts: int
    alone_s: float
    back_to_back_s: float


@dataclass(frozen=True)
class HandoffPoint:
    num_bytes: int
    seconds: float


class MeasuredPoints(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    prefill: list[PrefillPoint] = msgspec.field(default_factory=list)
    decode: list[DecodePoint] = msgspec.field(default_factory=list)
    mixed: list[MixedPoint] = msgspec.field(default_factory=list)
    handoff: dict[str, list[HandoffPoint]] = msgspec.field(default_factory=dict)  # by KV transport name
    sustained: SustainedPoint | None = None  # None in profiles before stop 26
