"""Prompts: the tokenizer, the chat template, and the one rule every prompt must pass (router and engine alike).

Tensor-free: the router tokenizes with it and never loads torch.
"""
from __future__ import annotations

import functools
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Annotated, Any

import msgspec

from common.config import ConfigError
from common.sampling_params import InvalidRequest


_NO_LIMIT = 1 << 62


def load_tokenizer(model: str | Path) -> Any:
    """The checkpoint's tokenizer. A `tokenizer.json` loads as a fast tokenizer without torch (transformers'
    auto classes import it); a checkpoint with only a slow tokenizer goes through AutoTokenizer."""
    try:
        if (Path(model) / "tokenizer.json").is_file():
            from transformers import PreTrainedTokenizerFast

            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model))
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model))
    except (OSError, ValueError) as e:  # missing or unreadable files, a malformed tokenizer.json
        raise _unloadable(model, e) from None
    # A prompt's length is the engine's rule (check_prompt, max_model_len), not the tokenizer's hint, which only
    # warned on every long prompt.
    tokenizer.model_max_length = _NO_LIMIT
    return tokenizer


def tokenizer_loading(model: str | Path) -> Future:
    """`load_tokenizer` on a thread of its own, for a caller with other slow work to do meanwhile (`serve` starts
    Ray): the tokenizer, or what stopped it, once the future is done. A daemon thread: a process that fails first
    does not wait for it. A malformed `tokenizer.json` is refused here, before the thread: the Rust tokenizer reads
    it in a fraction of a second, while the load's imports take seconds."""
    if (path := Path(model) / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust tokenizer's own errors derive from Exception alone
            raise _unloadable(model, e) from None
    future: Future = Future()

    def load() -> None:
        try:
            future.set_result(load_tokenizer(model))
        except BaseException as e:
            future.set_exception(e)

    threading.Thread(target=load, name="tokenizer", daemon=True).start()
    return future


def _unloadable(model: str | Path, why: Exception) -> ConfigError:
    return ConfigError(f"tokenizer: cannot load {model}'s tokenizer: {why}")


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
