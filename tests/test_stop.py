"""router/stop.py: stop strings matched on the detokenized completion, with streamed text held back."""
from __future__ import annotations

import pytest

from common.prompt import load_tokenizer
from router.detokenizer import IncrementalDetokenizer
from router.stop import CompletionText


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir):
    return load_tokenizer(str(tiny_qwen3_dir))


def feed(tokenizer, text: str, stops: list[str], step: int = 1) -> tuple[str, int, CompletionText]:
    """Streams `text`'s tokens `step` at a time; (the pieces joined, the tokens kept, the state)."""
    ids = tokenizer.encode(text)
    out, kept = [], 0
    c = CompletionText(IncrementalDetokenizer(tokenizer), stops)
    for i in range(0, len(ids), step):
        piece, n = c.add(ids[i:i + step])
        out.append(piece)
        kept += n
        if c.stopped:
            break
    out.append(c.flush())
    return "".join(out), kept, c


@pytest.mark.parametrize("step", [1, 3])
def test_text_ends_before_the_first_stop_string_and_tokens_at_the_one_completing_it(tokenizer, step):
    text = "the cat sat on the mat. And then it slept"
    joined, kept, c = feed(tokenizer, text, ["mat.", "slept"], step)
    assert c.stopped and joined == c.text == "the cat sat on the "
    ids = tokenizer.encode(text)
    # the tokens kept are the shortest prefix whose text holds the stop string
    assert "mat." in tokenizer.decode(ids[:kept]) and "mat." not in tokenizer.decode(ids[:kept - 1])


def test_without_a_match_everything_comes_out_once_flushed(tokenizer):
    text = "no stop string appears in this one"
    joined, kept, c = feed(tokenizer, text, ["zebra", "xylophone"])
    assert not c.stopped and joined == text and kept == len(tokenizer.encode(text))


def test_streamed_pieces_hold_back_what_could_start_a_stop_string(tokenizer):
    c = CompletionText(IncrementalDetokenizer(tokenizer), ["STOPNOW"])
    pieces = [c.add([t])[0] for t in tokenizer.encode("hello world STOP")]
    assert "STOP" not in "".join(pieces)  # might still become STOPNOW
    assert "".join(pieces) + c.flush() == "hello world STOP"


def test_no_stop_strings_hand_out_text_at_once(tokenizer):
    c = CompletionText(IncrementalDetokenizer(tokenizer))
    assert "".join(c.add([t])[0] for t in tokenizer.encode("abc def")) == "abc def"


class PieceTokenizer:
    """Token ids are pieces of bytes: a UTF-8 character may span tokens, and a token may end inside one (as in
    byte-level BPE)."""

    PIECES = [b"a", b"X\xe2", b"\x82", b"\xac", b"b"]  # "X" then the first byte of the euro sign, in one token

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return b"".join(self.PIECES[i] for i in ids).decode("utf-8", errors="replace")


def test_a_stop_string_before_an_incomplete_character_is_found_at_once():
    c = CompletionText(IncrementalDetokenizer(PieceTokenizer()), ["X"])
    assert c.add([0]) == ("a", 1)
    # the detokenizer holds "X\ufffd" back; the stop string is whole all the same
    assert c.add([1, 2, 3]) == ("", 1) and c.stopped
    assert c.flush() == "" and c.text == "a"


def test_held_back_text_is_not_cut_without_a_stop():
    c = CompletionText(IncrementalDetokenizer(PieceTokenizer()), ["zz"])
    pieces = [c.add([t])[0] for t in [0, 1, 2, 3, 4]]
    assert "".join(pieces) + c.flush() == "aX€b" and not c.stopped
