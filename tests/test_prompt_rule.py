"""common/prompt.py's `check_prompt`: the one rule every prompt passes at the router and at the engine."""
from __future__ import annotations

import pytest

from common.prompt import check_prompt
from common.sampling_params import InvalidRequest

VOCAB = 1000


@pytest.mark.parametrize("ids", [[0], [VOCAB - 1], list(range(VOCAB)), [5] * 10])
def test_ids_in_the_vocabulary_pass(ids):
    check_prompt(ids, max_model_len=VOCAB, vocab_size=VOCAB)


@pytest.mark.parametrize("bad", [-1, VOCAB, 2**31, 2**70, -(2**70), True, False, 1.0, 2.5, "7", None, b"1", [1]])
def test_anything_but_an_int_in_the_vocabulary_is_refused_naming_token_ids(bad):
    """At any position: an id out of range (however large), or any other type (a bool, a float that holds an int)
    is not a token id."""
    for ids in ([bad], [1, 2, bad], [bad] + [4] * 50):
        with pytest.raises(InvalidRequest) as e:
            check_prompt(ids, max_model_len=VOCAB, vocab_size=VOCAB)
        assert e.value.field == "token_ids" and f"[0, {VOCAB})" in str(e.value)


def test_an_empty_or_too_long_prompt_is_refused_naming_the_prompt():
    with pytest.raises(InvalidRequest, match="empty") as e:
        check_prompt([], max_model_len=8, vocab_size=VOCAB)
    assert e.value.field == "prompt"
    with pytest.raises(InvalidRequest, match="9 tokens, more than max_model_len=8") as e:
        check_prompt([1] * 9, max_model_len=8, vocab_size=VOCAB)
    assert e.value.field == "prompt"


def test_each_vocabulary_size_has_its_own_bound():
    check_prompt([99], max_model_len=8, vocab_size=100)
    with pytest.raises(InvalidRequest):
        check_prompt([100], max_model_len=8, vocab_size=100)
    check_prompt([100], max_model_len=8, vocab_size=101)
