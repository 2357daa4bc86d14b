"""The router's admission (router/admission.py), each prompt's check done once per workload.

Every layout at a load is simulated on the same prompts (the same lists), and the router's check of a prompt (the
engine's prompt rule: every token id in the vocabulary, its length; room for its KV on a decode worker) is a function
of the prompt and of limits every layout of a profile shares. So a check that passed is remembered with all it was
given, and the same prompt under the same limits passes again without walking its tokens. A prompt that failed is
checked again each time (its refusal is the router's, raised as it raises it).
"""
from __future__ import annotations

from router.admission import Admission
from router.config import RouterConfig
from router.placement import Placement
from router.registry import WorkerRegistry

# What a check was given: (the prompt's id, its length, max_model_len, vocab_size, the router's mode, and
# disaggregated, the blocks the prompt needs and the most a decode worker has)
CheckKey = tuple[int, int, int, int, str, int, int]


class CheckedAdmission(Admission):
    """`Admission` whose passed checks are kept in `passed` (shared by every simulation of a workload): the prompt
    list itself by what the check was given, so a key's id always names the list it was made of."""

    def __init__(self, config: RouterConfig, registry: WorkerRegistry, placement: Placement,
                 passed: dict[CheckKey, list[int]]):
        super().__init__(config, registry, placement, text=None)
        self.passed = passed

    def check(self, ids: list[int], max_model_len: int, vocab_size: int) -> None:
        disagg = self.config.mode == "disagg"
        key = (id(ids), len(ids), max_model_len, vocab_size, self.config.mode,
               self.placement.blocks_needed(ids) if disagg else 0,
               self.registry.largest_blocks("decode") if disagg else 0)
        if self.passed.get(key) is ids:
            return
        super().check(ids, max_model_len, vocab_size)
        self.passed[key] = ids
