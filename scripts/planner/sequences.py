"""A simulated request as an engine holds it (scripts/planner/engine.py): its sampling, and its sequence, whose
tokens are stand-ins where the engine has no prefix cache."""
from __future__ import annotations

import functools

from common.engine.sequence import Sequence
from common.sampling_params import SamplingParams

TOKEN = 1  # every sampled token: no end of sequence, each request runs to its output length


@functools.cache
def sampling(output_len: int) -> SamplingParams:
    """A simulated request's sampling: its output length, never an end of sequence. Frozen, so one per length serves
    every request and engine, checked once."""
    return SamplingParams(max_tokens=output_len, ignore_eos=True)


def sequence(rid: str, prompt: list[int], output_len: int, prefill_only: bool, prefix_caching: bool) -> Sequence:
    """The engine's sequence of a prompt. Without a prefix cache the engine reads how many tokens a prompt has, never
    which (common/engine/scheduler.py looks only for PENDING): the sequence holds as many stand-ins, made in place,
    cheaper to make and to free than a copy of the prompt's own ids."""
    if prefix_caching:
        return Sequence(rid, prompt, sampling(output_len), prefill_only=prefill_only)
    seq = Sequence(rid, (), sampling(output_len), prefill_only=prefill_only)
    seq.token_ids, seq.num_prompt_tokens = [TOKEN] * len(prompt), len(prompt)
    return seq
