"""router/detokenizer.py: streamed text pieces that join to the whole completion's text, decoded through the Rust
tokenizer itself where that gives the same text as transformers' decode."""
from __future__ import annotations

import random

import pytest

from common.prompt import load_tokenizer
from router.detokenizer import IncrementalDetokenizer, text_of

TEXT = "Naïve café — 東京タワー, emoji 🙂🚀 and plain words: the cat sat on the mat.\n  indented\tcode()"


@pytest.fixture(scope="module", params=["tiny-qwen3", "smollm2"])
def tokenizer(request, tiny_qwen3_dir, smollm2_dir):
    return load_tokenizer(str(tiny_qwen3_dir if request.param == "tiny-qwen3" else smollm2_dir))


def samples(tokenizer, n: int = 200) -> list[list[int]]:
    """Random windows of a text with multi-byte characters, random ids (special ones among them), and both mixed."""
    rng = random.Random(0)
    ids = tokenizer.encode(TEXT)
    vocab = len(tokenizer)
    out = []
    for _ in range(n):
        i = rng.randrange(len(ids))
        window = ids[i:i + rng.randint(1, 8)]
        noise = [rng.randrange(vocab) for _ in range(rng.randint(0, 4))]
        out.append(rng.choice([window, noise or window, window + noise, noise + window]))
    return out


def test_text_of_is_transformers_decode_without_special_tokens(tokenizer):
    decode = text_of(tokenizer)
    for ids in samples(tokenizer):
        assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=True), ids


@pytest.mark.parametrize("step", [1, 2, 5])
def test_streamed_pieces_join_to_the_whole_text(tokenizer, step):
    rng = random.Random(step)
    ids = tokenizer.encode(TEXT) + [rng.randrange(len(tokenizer)) for _ in range(40)]
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(ids[i:i + step]) for i in range(0, len(ids), step)] + [detok.flush()]
    assert "".join(pieces) == detok.text == tokenizer.decode(ids, skip_special_tokens=True)


def test_a_character_split_across_tokens_is_handed_out_whole(tokenizer):
    ids = tokenizer.encode(TEXT)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add([i]) for i in ids] + [detok.flush()]
    assert "".join(pieces) == TEXT and not any("\ufffd" in piece for piece in pieces)


class CleaningTokenizer:
    """A fast tokenizer whose decode also cleans up spaces: its backend's text is not the text."""

    clean_up_tokenization_spaces = True

    class backend_tokenizer:
        @staticmethod
        def decode(ids, skip_special_tokens=False):
            return "raw"

    def decode(self, ids, skip_special_tokens=False):
        return "clean"


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_transformers():
    assert text_of(CleaningTokenizer())([1, 2]) == "clean"
