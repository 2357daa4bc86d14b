"""A machine's cost profile for the planner: fitted cost models of one model on one GPU kind (tensor-free).

    prefill step seconds = base + per_token * max(tokens, min_tokens)
                           + per a chunk of n tokens after c: per_token_context * max(n, context_min_tokens) * c
                                                              + per_chunk_pair * n * n / 2
    decode step seconds  = base + per_seq * batch + per_seq_context * batch * mean_context
                           (a second line for the few-sequence steps of the skinny GEMMs: decode_skinny)
    handoff seconds      = base + bytes / bytes_per_s                      (one model per KV transport)
    host launch seconds  = the host's work per engine step, added to every step
    mixed step seconds   = added to a step that has both prompt tokens and decodes (its decodes run eagerly)

`tokens` are the prompt tokens a step computes, a chunk a prompt's share of them, `context` the tokens before it (a
cached prefix, or earlier chunks): attention grows with both, so four prompts of 1,000 tokens cost less than one of
4,000. Two floors bend the lines where a GPU is not yet full: a step's GEMMs read every weight whatever its tokens
(`min_tokens`), and a short chunk has too few query tiles to stream its context at the GPU's pace
(`context_min_tokens`). A profile names the machine and the model it was measured on;
`pdcluster profile` measures one on this machine (scripts/planner/measure/), and scripts/planner/profiles/ holds
an example.
"""
from __future__ import annotations

import bisect
import math
from pathlib import Path

import msgspec

from common.engine.step_sizes import padded_tokens
from scripts.planner.points import MeasuredPoints


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the field."""


class _Cost(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    def check(self, where: str) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ProfileError(f"{where}.{name}: must be a finite number >= 0, got {value!r}")


class PrefillCost(_Cost):
    base_s: float
    per_token_s: float
    per_token_context_s: float = 0.0
    # A chunk's attention over its own tokens, a causal square: n * n / 2 pairs of n tokens. Profiles fitted before
    # it have 0, and their per_token_s holds an average of it.
    per_chunk_pair_s: float = 0.0
    # A step of fewer tokens costs as many: its GEMMs wait on reading the weights, not on the math.
    min_tokens: int = 0
    # A chunk of fewer tokens attends its context as slowly as this many would: too few query tiles fill the GPU.
    context_min_tokens: int = 0

    def seconds(self, tokens: int, context: int = 0) -> float:
        """A step of one prompt chunk of `tokens` after `context` tokens."""
        return self.step_seconds(tokens, [(tokens, context)])

    def step_seconds(self, tokens: int, chunks: list[tuple[int, int]]) -> float:
        """A step that runs `tokens` prompt tokens (padded, as the engine runs them) for these chunks: (tokens,
        context before them) each."""
        if tokens <= 0:
            return 0.0
        gemm_tokens, context_pairs, chunk_pairs = step_work(tokens, chunks, self.min_tokens, self.context_min_tokens)
        return (self.base_s + self.per_token_s * gemm_tokens + self.per_token_context_s * context_pairs
                + self.per_chunk_pair_s * chunk_pairs)


def step_work(tokens: int, chunks: list[tuple[int, int]], min_tokens: int = 0, context_min_tokens: int = 0
              ) -> tuple[int, float, float]:
    """What a prompt step's cost counts, for `tokens` over these (tokens, context) chunks: the tokens its GEMMs run
    (at least `min_tokens`), its chunks' pairs with their context (each chunk counted as at least
    `context_min_tokens`) and among their own tokens (n * n / 2)."""
    return (max(tokens, min_tokens), float(sum(max(n, context_min_tokens) * c for n, c in chunks)),
            sum(n * n / 2 for n, _ in chunks))


class DecodeCost(_Cost):
    base_s: float
    per_seq_s: float
    per_seq_context_s: float = 0.0

    def seconds(self, batch: int, total_context: int) -> float:
        """A step of `batch` sequences whose contexts add up to `total_context` (batch * mean context)."""
        if batch <= 0:
            return 0.0
        return self.base_s + self.per_seq_s * batch + self.per_seq_context_s * total_context


class HandoffCost(_Cost):
    base_s: float
    bytes_per_s: float

    def seconds(self, num_bytes: int) -> float:
        return self.base_s + num_bytes / self.bytes_per_s

    def check(self, where: str) -> None:
        super().check(where)
        if self.bytes_per_s <= 0:
            raise ProfileError(f"{where}.bytes_per_s: must be > 0")


class MpsCost(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A role's steps as an MPS client at its share of the SMs (scripts/planner/gpu.py), against its costs here."""

    # A step alone takes this times its cost (the cap's: the profile run as an MPS client at the share, over this one)
    alone: float = 1.0
    # Its GPU-bound work takes (1 + beside) times as long for each other engine's step in flight on its GPU (0: no
    # slowdown; 1: as time-sliced). Fitted to served runs (docs/planner.md): a profile runs one process.
    beside: float = 1.0
    # Or, where given, that c by the longest prompt of the pair's prompt step (its own, or the other engine's):
    # points (tokens, c), read linearly between them and held beyond their ends. Measured from served runs' step
    # times (`python -m scripts.timeline DIR --mps-points`): a long prompt slows a decode step beside it more than a
    # short one does, and a short prompt beside decode slows more than a long one.
    beside_by_prompt: list[tuple[int, float]] = msgspec.field(default_factory=list)
    # And a factor on that c by the rows of the pair's decode step (its own, or the other engine's): points (rows,
    # factor), read the same way; none: 1. Measured the same way: a prompt step slows more beside a larger decode batch.
    beside_by_rows: list[tuple[int, float]] = msgspec.field(default_factory=list)

    @property
    def by_step(self) -> bool:
        """Whether c depends on the pair of steps (`contention`), not only on `beside`."""
        return bool(self.beside_by_prompt or self.beside_by_rows)

    def contention(self, longest: int, rows: int = 0) -> float:
        """Its c beside another engine's step, where the pair's longest prompt has `longest` tokens and its decode
        step `rows` rows."""
        c = _read(self.beside_by_prompt, longest) if self.beside_by_prompt else self.beside
        return c * _read(self.beside_by_rows, rows) if self.beside_by_rows else c

    def step_seconds(self, seconds: float, host: float) -> float:
        """A step of `seconds` alone on a GPU of its own, `host` of them launch-bound: its time alone at the share."""
        if self.alone == 1.0:
            return seconds
        host = min(host, seconds)
        return host + (seconds - host) * self.alone

    def check(self, where: str) -> None:
        if not (math.isfinite(self.alone) and self.alone > 0):
            raise ProfileError(f"{where}.alone: must be a finite number > 0, got {self.alone!r}")
        if not (math.isfinite(self.beside) and self.beside >= 0):
            raise ProfileError(f"{where}.beside: must be a finite number >= 0, got {self.beside!r}")
        for name, x_name, y_name, low in (("beside_by_prompt", "tokens", "c", 1),
                                          ("beside_by_rows", "rows", "factor", 0)):
            points = getattr(self, name)
            xs = [x for x, _ in points]
            if any(x < low for x in xs) or xs != sorted(set(xs)):
                raise ProfileError(f"{where}.{name}: {x_name} must rise from >= {low}, got {xs}")
            if not all(math.isfinite(y) and y >= 0 for _, y in points):
                raise ProfileError(f"{where}.{name}: each {y_name} must be a finite number >= 0")


def _read(points: list[tuple[int, float]], x: int) -> float:
    """`points` (x, y) at `x`: linear between them, held beyond their ends."""
    i = bisect.bisect_left(points, x, key=lambda point: point[0])
    if i == 0 or i == len(points):
        return points[min(i, len(points) - 1)][1]
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


TIME_SLICED = MpsCost()  # engines taking a shared GPU in turns: each at its pace alone, slowed as much by the other


class Profile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    machine: str  # e.g. "1x NVIDIA H200"
    model: str  # e.g. "Qwen3-8B"
    tp: int = 1  # GPUs per engine
    # "cpu": the engine computes a step within its launch (no overlap with the next step's scheduling to speak of)
    device: str = "cuda"
    note: str = ""  # where the figures come from ("example, not a measurement" for the shipped example)
    block_size: int  # tokens per KV block
    num_kv_blocks: int  # KV blocks one engine holds
    kv_bytes_per_token: int  # across all layers, K and V
    max_num_batched_tokens: int = 8192  # an engine step's token budget
    max_num_seqs: int = 256  # most sequences one engine runs at a time
    host_launch_s: float = 0.0
    # The host's time to schedule and launch a decode step as the engine's launch clock takes it (LaunchClock.prep_s):
    # late launch schedules the next step 1.25x this (+ a tenth of the step) before a decode step ends, and the worker
    # reads no message meanwhile. 0: not measured (profiles before stop 20), host_launch_s stands in.
    launch_prep_s: float = 0.0
    # A step that mixes prompt tokens with decodes replays no decode CUDA graph: what its eager decodes add (a decode
    # worker prefilling prompts itself, --disagg-policy never/auto; colocated replicas).
    mixed_step_s: float = 0.0
    prefill: PrefillCost
    # A prompt step run back to back with others takes this many times its time alone, as the points were timed: the
    # GPU holds a lower clock under its power limit. The simulator scales a prompt step by it as far as its engine
    # has run prompt steps of late (scripts/planner/engine.py, SUSTAIN_S). 1: not measured (profiles before stop 26).
    sustained_prefill_factor: float = 1.0
    # Prompt steps padded past this many tokens run eagerly, at `prefill_eager`'s cost, their floor the host launching
    # kernels; those up to it replay a CUDA graph (common/engine/prefill_graph.py) at `prefill`'s. 0 and None: one
    # cost for every prompt step, and each an eager launch (profiles measured before prompt graphs).
    prefill_graph_max_tokens: int = 0
    prefill_eager: PrefillCost | None = None
    decode: DecodeCost
    handoff: dict[str, HandoffCost]  # by KV transport name
    # Decode steps of up to this many sequences run the skinny GEMMs (common/engine/layers/gemv.py), at
    # `decode_skinny`'s cost: far below the line through larger batches. 0 and None: one decode cost for every
    # batch (profiles measured before them).
    decode_skinny_max_batch: int = 0
    decode_skinny: DecodeCost | None = None
    # What the costs above were fitted to (`pdcluster profile` since stop 25): a changed model refits them without a
    # GPU (`pdcluster refit-profile`). None in profiles before, and in those written by hand.
    points: MeasuredPoints | None = None
    # Each role's steps on a GPU shared under MPS (`serve --mps`); a role not given: MpsCost()
    mps: dict[str, MpsCost] = msgspec.field(default_factory=dict)

    def prefill_cost(self, padded: int) -> tuple[PrefillCost, bool]:
        """The cost of a prompt step of `padded` tokens (its tokens as the engine pads them, `Profile.padded`), and
        whether it replays a graph."""
        if padded <= self.prefill_graph_max_tokens:
            return self.prefill, True
        return self.prefill_eager or self.prefill, False

    def slower(self, share: float) -> Profile:
        """This profile on GPUs `share` slower in every step (prompt, decode, mixed), the host's work (the eager
        prompt line's base is its launch floor) and the KV handoffs as they were: machines of one kind differ by a
        few percent (docs/planner.md, "One kind, many machines")."""
        factor = 1 + share

        def scaled(cost: _Cost | None, host: tuple[str, ...] = ()) -> _Cost | None:
            if cost is None:
                return None
            return msgspec.structs.replace(cost, **{name: getattr(cost, name) * factor for name in
                                                    cost.__struct_fields__ if name.endswith("_s") and name not in host})

        return msgspec.structs.replace(self, prefill=scaled(self.prefill),
                                       prefill_eager=scaled(self.prefill_eager, host=("base_s",)),
                                       decode=scaled(self.decode), decode_skinny=scaled(self.decode_skinny),
                                       mixed_step_s=self.mixed_step_s * factor)

    def padded(self, tokens: int) -> int:
        """A step's prompt tokens as the engine runs them (step_sizes.padded_tokens). A profile of an engine before
        prompt graphs was fitted to unpadded counts."""
        if not self.prefill_graph_max_tokens:
            return tokens
        return padded_tokens(tokens, self.max_num_batched_tokens)

    def prompt_step(self, tokens: int, chunks: list[tuple[int, int]] | None = None) -> tuple[float, float]:
        """A step of `tokens` prompt tokens and nothing else, alone on its GPU: (its seconds, its launch-bound floor:
        the host's part, which goes at the host's pace). `chunks`: its prompts' (tokens, context before them), one
        fresh prompt by default."""
        padded = self.padded(tokens)
        cost, _ = self.prefill_cost(padded)
        return self.host_launch_s + cost.step_seconds(padded, chunks or [(tokens, 0)]), self.prompt_launch(tokens)

    def prompt_launch(self, tokens: int) -> float:
        """A prompt step's launch-bound floor alone (`prompt_step`'s second figure)."""
        cost, graphed = self.prefill_cost(self.padded(tokens))
        return self.host_launch_s + (0.0 if graphed else cost.base_s)

    def mps_cost(self, role: str) -> MpsCost:
        return self.mps.get(role) or TIME_SLICED

    def decode_cost(self, batch: int) -> DecodeCost:
        """The cost of a decode step of `batch` sequences."""
        return decode_cost(batch, self.decode, self.decode_skinny, self.decode_skinny_max_batch)

    def check(self) -> None:
        for name in ("tp", "block_size", "num_kv_blocks", "kv_bytes_per_token", "max_num_batched_tokens",
                     "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ProfileError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.sustained_prefill_factor) and self.sustained_prefill_factor >= 1):
            raise ProfileError(f"sustained_prefill_factor: must be a finite number >= 1, got "
                               f"{self.sustained_prefill_factor!r}")
        for name in ("host_launch_s", "launch_prep_s", "mixed_step_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ProfileError(f"{name}: must be a finite number >= 0, got {value!r}")
        for role, cost in self.mps.items():
            if role not in ("prefill", "decode", "colocated"):
                raise ProfileError(f"mps: {role!r} is not a role (prefill, decode, colocated)")
            cost.check(f"mps.{role}")
        if not self.handoff:
            raise ProfileError("handoff: needs at least one transport")
        self.prefill.check("prefill")
        if self.prefill_graph_max_tokens < 0:
            raise ProfileError(f"prefill_graph_max_tokens: must be >= 0, got {self.prefill_graph_max_tokens}")
        if self.prefill_eager is not None:
            self.prefill_eager.check("prefill_eager")
        self.decode.check("decode")
        if self.decode_skinny_max_batch < 0:
            raise ProfileError(f"decode_skinny_max_batch: must be >= 0, got {self.decode_skinny_max_batch}")
        if self.decode_skinny is not None:
            self.decode_skinny.check("decode_skinny")
        for name, cost in self.handoff.items():
            cost.check(f"handoff.{name}")

    @property
    def transport(self) -> str:
        """The fastest transport for a typical handoff (what the router's `auto` would pick on this machine)."""
        return min(self.handoff, key=lambda t: self.handoff[t].seconds(1024 * self.kv_bytes_per_token))

    def cost_transport(self, transport: str | None) -> str:
        """The transport whose measured cost stands for a handoff over `transport`: itself where the profile has it,
        else (and for None) the fastest (a profile measured on one GPU has no nccl)."""
        return transport if transport in self.handoff else self.transport

    def handoff_seconds(self, tokens: int, transport: str | None = None) -> float:
        return self.handoff[self.cost_transport(transport)].seconds(tokens * self.kv_bytes_per_token)


def decode_cost(batch: int, decode: DecodeCost, skinny: DecodeCost | None, skinny_max_batch: int) -> DecodeCost:
    """`skinny` for a step of at most `skinny_max_batch` sequences (where there is one), else `decode`."""
    return skinny if skinny is not None and batch <= skinny_max_batch else decode


def load_profile(path: str | Path) -> Profile:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ProfileError(f"profile {str(path)!r}: cannot read: {e.strerror}") from None
    try:
        profile = msgspec.json.decode(data, type=Profile)
        profile.check()
    except (msgspec.ValidationError, msgspec.DecodeError, ProfileError) as e:
        raise ProfileError(f"profile {str(path)!r}: {e}") from None
    return profile


def save_profile(profile: Profile, path: str | Path) -> None:
    profile.check()
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(profile), indent=2) + b"\n")
