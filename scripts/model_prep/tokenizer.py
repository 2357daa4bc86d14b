"""Byte-level BPE tokenizers: the small one a random-weight model gets (every id it can emit decodes, every
string round-trips), and the tokenizer_config.json that goes with a tokenizer.json."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from scripts.model_prep.staging import write_json

CORPUS = Path(__file__).with_name("configs") / "bpe_corpus.txt"
# Three consecutive ids, in Qwen's order (<|endoftext|> = bos = pad, <|im_end|> = eos).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MAX_MERGES = 2000


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others are shifted past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def _pretokenize(text: str) -> list[str]:
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return [piece for piece, _ in pre.pre_tokenize_str(text)]


def learn_merges(text: str, max_merges: int) -> list[tuple[str, str]]:
    """Plain BPE training: repeatedly merge the most frequent adjacent pair (ties broken by the pair itself, so
    the result never depends on the tokenizers version); stop at max_merges or when no pair occurs twice."""
    words = {tuple(w): c for w, c in Counter(_pretokenize(text)).items()}
    merges: list[tuple[str, str]] = []
    while len(merges) < max_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        words = {_merge_word(w, best): c for w, c in words.items()}
    return merges


def _merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def filler_token(token_id: int) -> str:
    """Vocabulary entry for an id past the learned merges: no merge builds it, so encoding never yields it, and
    it decodes to a readable marker of its id (random models emit such ids)."""
    return f"<{token_id}>"


def build_tokenizer_vocab(vocab_size: int, special_start: int,
                          corpus: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary covering every id in [0, vocab_size): 256 bytes, learned merges, fillers, the 3 specials."""
    n_special = len(SPECIAL_TOKENS)
    if vocab_size < 256 + n_special:
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level tokenizer (need >= {256 + n_special})")
    if not 256 <= special_start <= vocab_size - n_special:
        raise ValueError(f"special tokens cannot start at id {special_start} with vocab_size {vocab_size}")
    vocab = {ch: b for b, ch in sorted(_byte_to_unicode().items())}
    merges = learn_merges(corpus, min(MAX_MERGES, special_start - 256))
    for a, b in merges:
        vocab[a + b] = len(vocab)
    specials = {tok: special_start + i for i, tok in enumerate(SPECIAL_TOKENS)}
    special_ids = set(specials.values())
    for token_id in range(len(vocab), vocab_size):
        if token_id not in special_ids:
            vocab[filler_token(token_id)] = token_id
    vocab.update(specials)
    if sorted(vocab.values()) != list(range(vocab_size)):
        raise AssertionError("tokenizer vocabulary does not map onto [0, vocab_size) one to one")
    return vocab, merges


def build_tokenizer(vocab_size: int, special_start: int, corpus: str | None = None) -> Any:
    """A ``tokenizers.Tokenizer``: byte-level BPE with no normalizer, so every string round-trips."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if corpus is None:
        corpus = CORPUS.read_text(encoding="utf-8")
    vocab, merges = build_tokenizer_vocab(vocab_size, special_start, corpus)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # The specials are in the BPE vocabulary too, so they keep their ids when registered as added tokens.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != special_start + i:
            raise AssertionError(f"special token {t} landed on id {tok.token_to_id(t)}")
    return tok


def special_token_ids(config: dict[str, Any]) -> dict[str, int]:
    """Ids of the specials: at the config's bos when its eos is bos + 2 (Qwen's layout), else the last 3 ids."""
    vocab_size = int(config["vocab_size"])
    bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
    if isinstance(bos, int) and eos == bos + 2 and 256 <= bos and eos < vocab_size:
        start = bos
    else:
        start = vocab_size - len(SPECIAL_TOKENS)
    return {"special_start": start, "bos_token_id": start, "pad_token_id": start, "eos_token_id": start + 2}


def tokenizer_config(bos: str | None, eos: str, pad: str | None, unk: str | None, chat_template: str,
                      model_max_length: int) -> dict[str, Any]:
    # PreTrainedTokenizerFast loads tokenizer.json as is in every transformers version (a named class such as
    # Qwen2Tokenizer may rebuild the pipeline in 5.x); the template lives here, not in chat_template.jinja.
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": unk,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": chat_template,
    }


def write_random_tokenizer(out: Path, cfg: dict[str, Any]) -> None:
    start = special_token_ids(cfg)["special_start"]
    build_tokenizer(int(cfg["vocab_size"]), start).save(str(out / "tokenizer.json"))
    endoftext, _, im_end = SPECIAL_TOKENS
    max_len = int(cfg.get("max_position_embeddings", 2048))
    write_json(out / "tokenizer_config.json",
                tokenizer_config(endoftext, im_end, endoftext, None, CHATML_TEMPLATE, max_len))
