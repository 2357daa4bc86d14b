from __future__ import annotations


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Each step decodes only a short window (from a few tokens back, so merges across token boundaries
    come out right) and holds text back while it ends in an incomplete UTF-8 character. The deltas
    joined equal `tokenizer.decode(all_ids)` for byte-level BPE tokenizers.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
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
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix_offset:self.read_offset], skip_special_tokens=True)
        window = decode(self.ids[self.prefix_offset:], skip_special_tokens=True)
        return window[len(before):].rstrip("\ufffd")

    def flush(self) -> str:
        """At the end: whatever is still held back."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix_offset:self.read_offset], skip_special_tokens=True)
        window = decode(self.ids[self.prefix_offset:], skip_special_tokens=True)
        if len(window) <= len(before) or (window.endswith("\ufffd") and not final):
            return ""
        delta = window[len(before):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta
