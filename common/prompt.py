"""Prompts: the tokenizer, the chat template, and the one rule every prompt must pass (router and engine alike).

Tensor-free: the router tokenizes with it and never loads torch.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

import msgspec

from common.sampling_params import InvalidRequest


_NO_LIMIT = 1 << 62


def load_tokenizer(model: str | Path) -> Any:
    """The checkpoint's tokenizer. A `tokenizer.json` loads as a fast tokenizer without torch (transformers'
    auto classes import it); a checkpoint with only a slow tokenizer goes through AutoTokenizer."""
    if (Path(model) / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model))
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model))
    # A prompt's length is the engine's rule (check_prompt, max_model_len), not the tokenizer's hint, which only
    # warned on every long prompt.
    tokenizer.model_max_length = _NO_LIMIT
    return tokenizer


def encode_prompt(tokenizer: Any, prompt: str, chat: bool = False) -> list[int]:
    """Raw prompts exactly as `tokenizer.encode`; chat prompts through the model's chat template."""
    if not isinstance(prompt, str):
        raise InvalidRequest("prompt", f"must be a string, got {type(prompt).__name__}")
    if chat:
        return encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    return tokenizer.encode(prompt)


def encode_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """A conversation through the model's chat template, ready for the assistant's turn (a chat prompt is its
    one user turn). A template that refuses the conversation raises InvalidRequest naming `messages`."""
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # jinja raises its own errors (a template's raise_exception, a missing role)
        raise InvalidRequest("messages", f"the chat template refused them: {e}") from None
    return tokenizer.encode(text, add_special_tokens=False)


def check_prompt(ids: list[int], max_model_len: int, vocab_size: int) -> None:
    """Raises InvalidRequest naming the problem: an empty prompt, one longer than max_model_len, or a token id that
    is not an integer in [0, vocab_size)."""
    if not ids:
        raise InvalidRequest("prompt", "is empty")
    if len(ids) > max_model_len:
        raise InvalidRequest("prompt", f"has {len(ids)} tokens, more than max_model_len={max_model_len}")
    try:  # one pass at C speed: a prompt may hold a million ids
        msgspec.convert(ids, _token_ids(vocab_size))
    except msgspec.ValidationError:
        raise InvalidRequest("token_ids", f"every token id must be an integer in [0, {vocab_size})") from None


@functools.cache
def _token_ids(vocab_size: int) -> Any:
    """A list of ints in [0, vocab_size), as msgspec checks it (no bool, float or str passes for an int)."""
    return list[Annotated[int, msgspec.Meta(ge=0, lt=vocab_size)]]
