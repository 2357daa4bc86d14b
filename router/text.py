"""The router's text: its checkpoint's tokenizer, which may still be loading while `serve` starts Ray (its imports
take seconds), the prompts it tokenizes and the token ids it turns into a completion's text."""
from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from common.prompt import load_tokenizer
from router.detokenizer import IncrementalDetokenizer, text_of
from router.stop import CompletionText


class RouterText:
    def __init__(self, tokenizer: Future):
        self._tokenizer = tokenizer

    @classmethod
    def load(cls, model: str | Path) -> RouterText:
        """The tokenizer loaded now (any error raised here)."""
        loaded: Future = Future()
        loaded.set_result(load_tokenizer(model))
        return cls(loaded)

    @functools.cached_property
    def tokenizer(self) -> Any:
        """Waits for it while it loads; raises what stopped it loading. Kept once loaded: every prompt given as text
        and every new completion reads it on the router's loop."""
        return self._tokenizer.result()

    @functools.cached_property
    def decode(self) -> Callable[[list[int]], str]:
        """Token ids -> text, as the tokenizer decodes them."""
        return text_of(self.tokenizer)

    def completion(self, stops: list[str] | tuple[str, ...]) -> CompletionText:
        """A new completion's text, streamed as its tokens come and cut before the first of `stops`."""
        return CompletionText(IncrementalDetokenizer(self.tokenizer, self.decode), stops)
