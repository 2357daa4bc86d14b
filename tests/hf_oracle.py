"""HF transformers as the correctness oracle: greedy continuation with no EOS stop."""
from __future__ import annotations

import functools

import torch
from transformers import AutoModelForCausalLM


@functools.lru_cache(maxsize=4)
def hf_model(path: str):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def hf_greedy(path: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    model = hf_model(str(path))
    out = model(torch.tensor([prompt_ids]), use_cache=True)
    tokens = []
    for _ in range(max_new_tokens):
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
        out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens
