from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from common.sampling_params import SamplingParams

from common.engine.layers.fusion import fused_kernels


@dataclass
class SamplingBatch:
    """Per-row sampling settings of one step, as device tensors (built once per step)."""

    temperatures: torch.Tensor  # [B] float32; 0 = greedy
    top_ks: torch.Tensor | None  # [B] int64, vocab size where disabled; None if no row uses top-k
    top_ps: torch.Tensor | None  # [B] float32; None if no row uses top-p
    generators: list[torch.Generator | None]  # per row: a generator seeded for this draw, or None
    all_greedy: bool
    seeds: torch.Tensor | None = None  # [B] int64 Philox seeds: set exactly when the fused sampler runs

    @classmethod
    def build(cls, params: list[SamplingParams], generators: list[torch.Generator | None], vocab_size: int,
              device: torch.device, positions: list[int] | None = None,
              upload: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None) -> SamplingBatch:
        """`upload` moves host tensors to `device` (default: one `.to` each); `positions` (each row's token count)
        seed the fused CUDA sampler, so that a request with a seed draws the same tokens on every run."""
        host = cls.on_host(params, generators, vocab_size, device, positions)
        return host.uploaded((upload or (lambda ts: [t.to(device) for t in ts]))(host.tensors()))

    @classmethod
    def on_host(cls, params: list[SamplingParams], generators: list[torch.Generator | None], vocab_size: int,
                device: torch.device, positions: list[int] | None = None) -> SamplingBatch:
        """The batch with its tensors still on the host, for a caller that uploads them with its own (`tensors`,
        then `uploaded`); `device` is where it will sample."""
        temps = [p.temperature for p in params]
        all_greedy = all(t == 0.0 for t in temps)
        use_k = any(0 < p.top_k < vocab_size for p in params)
        use_p = any(p.top_p < 1.0 for p in params)
        use_fused = (device.type == "cuda" and positions is not None and not (all_greedy or use_k or use_p)
                     and fused_kernels() is not None)
        return cls(
            temperatures=torch.tensor(temps, dtype=torch.float32),
            top_ks=torch.tensor([p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params])
            if use_k else None,
            top_ps=torch.tensor([p.top_p for p in params], dtype=torch.float32) if use_p else None,
            generators=generators,
            all_greedy=all_greedy,
            seeds=torch.tensor(_philox_seeds(params, positions)) if use_fused else None,
        )

    @property
    def one_pass(self) -> bool:
        """Every row greedy or drawn by the fused Gumbel-max kernel (`seeds` set): no top-k, top-p or torch
        generator, so one kernel over the logits samples the batch (the sampler a decode graph captures)."""
        return self.top_ks is None and self.top_ps is None and (self.all_greedy or self.seeds is not None)

    def tensors(self) -> list[torch.Tensor]:
        """Its tensors, in the order `uploaded` takes them back."""
        return [t for t in (self.temperatures, self.top_ks, self.top_ps, self.seeds) if t is not None]

    def uploaded(self, tensors: list[torch.Tensor]) -> SamplingBatch:
        """This batch with `tensors` (its own, moved: `tensors()`'s order) in their places."""
        moved = iter(tensors)
        return replace(self, **{name: next(moved) for name in ("temperatures", "top_ks", "top_ps", "seeds")
                                if getattr(self, name) is not None})


def position_seed(seed: int, position: int) -> int:
    """The seed of a seeded request's draw for the token at `position` (its token count then). Every draw of a
    seeded request is a function of (seed, position) alone, on every path, so the same token is drawn wherever
    and whenever it is sampled: a request moved to another worker mid-stream (prompt and streamed tokens
    prefilled again) goes on exactly as it would have."""
    return (seed * 1_000_003 + position) % 2**63


def seeded_generators(params: list[SamplingParams], positions: list[int],
                      device: torch.device) -> list[torch.Generator | None]:
    """Per row: a generator seeded for this draw (`position_seed`) where the request has a seed, else None."""
    return [None if p.seed is None else torch.Generator(device).manual_seed(position_seed(p.seed, pos))
            for p, pos in zip(params, positions)]


def _philox_seeds(params: list[SamplingParams], positions: list[int]) -> list[int]:
    base = int(torch.randint(0, 2**31 - 1, ()))  # the process RNG: unseeded rows differ every step
    return [position_seed(p.seed, pos) % 2**31 if p.seed is not None else (base + i * 7919) % 2**31
            for i, (p, pos) in enumerate(zip(params, positions))]


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Greedy rows take the argmax; the others the Gumbel-max trick: argmax(p / E) with E ~ Exp(1)."""
    if batch.seeds is not None:
        return fused_kernels().gumbel_argmax(logits, batch.temperatures, batch.seeds)
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if batch.all_greedy:
        return greedy
    temps = batch.temperatures
    scaled = logits / torch.where(temps > 0, temps, 1.0).unsqueeze(1)
    if batch.top_ks is not None or batch.top_ps is not None:
        scaled = _mask_top_k_top_p(scaled, batch.top_ks, batch.top_ps)
    probs = scaled.softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_()
    for i, gen in enumerate(batch.generators):
        if gen is not None:
            noise[i].exponential_(generator=gen)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(temps == 0, greedy, sampled)


def _mask_top_k_top_p(logits: torch.Tensor, top_ks: torch.Tensor | None, top_ps: torch.Tensor | None) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_ks is not None:
        drop |= torch.arange(vocab, device=logits.device).unsqueeze(0) >= top_ks.unsqueeze(1)
    if top_ps is not None:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        # Mass strictly before each token: the token that crosses top_p is kept.
        before = probs.cumsum(dim=-1) - probs
        drop |= before >= top_ps.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
