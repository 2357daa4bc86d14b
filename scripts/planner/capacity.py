"""The most requests/s a number of engines could serve of a workload, from a cost profile: every engine busy, its
prompt steps full and its decode batches as large as its KV cache, its seat limit and the TPOT SLO let them be.
No layout reaches it (arrivals are uneven, prompts wait, handoffs take time); a plan without --rates simulates
fractions of it, so that its rates fit its GPUs (`default_rates`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from scripts.planner.profile import Profile

RATE_FRACTIONS = (0.5, 0.75, 1.0, 1.25)  # of the capacity: the rates a plan simulates when given none


@dataclass(frozen=True)
class Capacity:
    rate: float  # requests/s the engines could serve at most
    prefill_s: float  # a request's prompt: GPU seconds in full prompt steps, on average
    decode_s: float  # its answer: its share of full decode steps, GPU seconds, on average
    seats: int  # the decode batch that share was taken at


def prompt_seconds(profile: Profile, tokens: int) -> float:
    """A prompt's share of full prompt steps: as many like it as the step budget holds, or its chunks of the budget
    one after another, each after the ones before."""
    budget = profile.max_num_batched_tokens
    if tokens <= budget:
        k = budget // tokens
        return profile.prompt_step(k * tokens, [(tokens, 0)] * k)[0] / k
    return sum(profile.prompt_step(min(budget, tokens - done), [(min(budget, tokens - done), done)])[0]
               for done in range(0, tokens, budget))


def decode_seats(profile: Profile, context: float, slo_tpot: float) -> int:
    """The largest decode batch of sequences of `context` tokens on average that the KV cache and the seat limit
    hold and whose step stays within the TPOT SLO (at least one)."""
    most = max(1, min(profile.max_num_seqs, int(profile.num_kv_blocks * profile.block_size // max(context, 1.0))))
    while most > 1 and profile.decode_cost(most).seconds(most, round(most * context)) > slo_tpot:
        most -= 1
    return most


def capacity(profile: Profile, prompt_lens: list[int], output_lens: list[int], engines: int,
             slo_tpot: float) -> Capacity:
    """What `engines` engines of `profile` could serve of requests like these (their prompt and answer lengths)."""
    n = len(prompt_lens)
    if not n or engines < 1:
        raise ValueError("capacity: needs requests and engines")
    prefill = sum(prompt_seconds(profile, max(1, t)) for t in prompt_lens) / n
    held = sum(p + o for p, o in zip(prompt_lens, output_lens)) / n  # a sequence's KV at its end
    seats = decode_seats(profile, held, slo_tpot)
    mean_context = sum(p + o / 2 for p, o in zip(prompt_lens, output_lens)) / n
    step = profile.decode_cost(seats).seconds(seats, round(seats * mean_context))
    decode = sum(max(o - 1, 0) for o in output_lens) / n * step / seats  # the first token comes with the prompt
    return Capacity(engines / (prefill + decode), prefill, decode, seats)


def default_rates(cap: Capacity, fractions: tuple[float, ...] = RATE_FRACTIONS) -> list[float]:
    """Fractions of the capacity, each rounded to two significant digits."""
    return sorted({_two_digits(f * cap.rate) for f in fractions})


def _two_digits(x: float) -> float:
    return round(x, 1 - math.floor(math.log10(x)))
