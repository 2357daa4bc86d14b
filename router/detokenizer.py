from __future__ import annotations

from collections.abc import Callable


def text_of(tokenizer) -> Callable[[list[int]], str]:
    """`tokenizer.decode(ids, skip_special_tokens=True)`, through the Rust tokenizer itself where that gives the same
    text (a fast tokenizer that cleans up no spaces). A streamed token takes two decodes, and transformers' Python
    around each costs more than the decode."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Each step decodes only a short window (from a few tokens back, so merges across token boundaries
    come out right) and holds text back while it ends in an incomplete UTF-8 character. The deltas
    joined equal `tokenizer.decode(all_ids)` for byte-level BPE tokenizers.
    """

    def __init__(self, tokenizer, decode: Callable[[list[int]], str] | None = None):
        self.decode = decode or text_of(tokenizer)
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the window
        self.read_offset = 0  # tokens before this are already emitted
        self.text = ""

    def add(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        return self._advance(final=False)

    def pending(self) -> str:
        """The text of the tokens held back, up to the incomplete character that holds them (not yet in `text`)."""
        if self.read_offset == len(self.ids):
            return ""
        before = self.decode(self.ids[self.prefix_offset:self.read_offset])
        window = self.decode(self.ids[self.prefix_offset:])
        return window[len(before):].rstrip("\ufffd")

    def flush(self) -> str:
        """At the end: whatever is still held back."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        before = self.decode(self.ids[self.prefix_offset:self.read_offset])
        window = self.decode(self.ids[self.prefix_offset:])
        if len(window) <= len(before) or (window.endswith("\ufffd") and not final):
            return ""
        delta = window[len(before):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta
