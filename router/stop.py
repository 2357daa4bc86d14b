"""A completion's text as its client sees it: the detokenizer's pieces, cut before the first stop string.

The router owns stop strings (the engine sees only token ids): tokens are fed one at a time while a request has
stop strings, so the completion ends at exactly the token that completed one. A streamed piece holds back the
last `longest stop - 1` characters until more text shows they start no stop string (or the request ends).
"""
from __future__ import annotations

from router.detokenizer import IncrementalDetokenizer


class CompletionText:
    def __init__(self, detok: IncrementalDetokenizer, stops: list[str] | tuple[str, ...] = ()):
        self.detok = detok
        self.stops = list(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1  # characters that may start a stop string
        self.sent = 0  # characters of the detokenized text handed out
        self.cut: int | None = None  # where the first stop string begins, once one appeared
        self._seen = ""  # the text the stop string was found in

    @property
    def stopped(self) -> bool:
        return self.cut is not None

    @property
    def text(self) -> str:
        """Everything handed out (the whole completion once flushed)."""
        return (self._seen if self.stopped else self.detok.text)[:self.sent]

    def add(self, token_ids: list[int]) -> tuple[str, int]:
        """(the text to hand out now, how many of `token_ids` belong to the completion): all of them, or those up to
        and including the one that completed a stop string."""
        if not self.stops:
            self.detok.add(token_ids)
            return self._release(final=False), len(token_ids)
        for n, token in enumerate(token_ids, 1):
            self.detok.add([token])
            if self._find_stop():
                return self._release(final=True), n
        return self._release(final=False), len(token_ids)

    def flush(self) -> str:
        """At the end: the text still held back (none after a stop string)."""
        if not self.stopped:
            self.detok.flush()
        return self._release(final=True)

    def _find_stop(self) -> bool:
        # A stop string cannot begin before `sent`: text is handed out only once it cannot start one. The text the
        # detokenizer holds back for an incomplete character counts: a stop string before that character is whole.
        text = self.detok.text + self.detok.pending()
        found = [i for i in (text.find(s, self.sent) for s in self.stops) if i >= 0]
        if found:
            self.cut, self._seen = min(found), text
        return self.stopped

    def _release(self, final: bool) -> str:
        text = self._seen if self.stopped else self.detok.text
        end = self.cut if self.cut is not None else len(text) if final else len(text) - self.hold
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent:end], end
        return piece
