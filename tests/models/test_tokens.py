"""The character bound that lets a stage skip an over-long prompt without tokenising it (issue 20,
item 14): sound (a text of more characters never has N tokens or fewer) on tokenizers of each kind
it is computed for, and absent on the kinds where no such bound holds."""

from __future__ import annotations

import random
import unicodedata

import pytest

from reasonrl.models.tokens import NORMALIZER_SHRINK, byte_chars, char_bound, fitting_ids
from toyhelp import CountingTokenizer

CORPUS = [f"What is {a} + {b}? Answer: {a + b}. Solve the following math problem step by step." for a in range(40) for b in range(40)]


def _fast(tok, **special):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def byte_level_bpe(normalizer=None, split=False, alphabet=None):
    """GPT-2 / SmolLM style; with NFC and a Split before a regex-less ByteLevel: Qwen style."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if normalizer:
        tok.normalizer = getattr(normalizers, normalizer)()
    if split:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\s+|\w+|[^\s\w]+"), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if alphabet is None else alphabet
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|im_end|>", "<|im_start|>"], initial_alphabet=alphabet,
                                  limit_alphabet=len(alphabet), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return _fast(tok, eos_token="<|im_end|>")


def metaspace_bpe():
    """Llama 2 / Mistral style: '▁' for a space, byte fallback."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<unk>", "</s>", *bytes_], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return _fast(tok, eos_token="</s>", unk_token="<unk>")


def adversarial_texts(tok) -> list[str]:
    """Texts that make a token stand for as many characters as possible, or drop characters."""
    vocab = tok.backend_tokenizer.get_vocab(with_added_tokens=True)
    longest = sorted(vocab, key=len)[-5:]
    rng = random.Random(0)
    return [
        "Solve the following math problem step by step. " * 200,
        " " * 5000, "\n" * 5000, "\t \n" * 2000,
        "".join(rng.choice(longest) for _ in range(500)),
        "<|im_end|>" * 500 + "</s>" * 500,
        "e\u0301" * 2000, "\u1100\u1161\u11a8" * 2000,  # NFC: 2 and 3 characters into one
        "数学问题" * 1000, "🙂🧮" * 1000, "\ufdfa" * 100,
        "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(5000)),
        "".join(chr(rng.randrange(0, 0x20)) for _ in range(5000)),
        "a\x04b\x06" * 1000,
    ]


def assert_sound(tok):
    bound = char_bound(tok)
    assert bound is not None
    for text in adversarial_texts(tok):
        n = len(tok(text, add_special_tokens=False)["input_ids"])
        kept = len(text) - sum(text.count(c) for c in bound.dropped)
        assert kept <= bound.per_token * n, (text[:40], kept, n, bound)
        assert bound.may_fit(text, n), text[:40]  # a text never reads as too long for its own token count


@pytest.mark.parametrize("make", [
    lambda: byte_level_bpe(),
    lambda: byte_level_bpe(normalizer="NFC", split=True),
    lambda: byte_level_bpe(normalizer="NFKC"),
    metaspace_bpe,
], ids=["byte-level", "qwen-style-nfc", "nfkc", "metaspace-byte-fallback"])
def test_the_bound_holds_for_each_kind_of_tokenizer(make):
    assert_sound(make())


def test_the_bound_holds_for_the_tiny_model(tiny_model):
    from reasonrl.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model)
    assert_sound(tok)
    assert char_bound(tok).per_token == max(len(s) for s in tok.get_vocab())  # byte-level, no normaliser: K = 1


def test_bytes_missing_from_a_byte_level_vocabulary_are_not_counted():
    """SmolLM2's vocabulary lacks some control bytes (U+0004 gets no token): a text of them has no
    tokens at all, so they cannot count toward the bound."""
    missing = {0x04, 0x06, 0x13}
    tok = byte_level_bpe(alphabet=[ch for b, ch in byte_chars().items() if b not in missing])
    bound = char_bound(tok)
    assert set(bound.dropped) == {chr(b) for b in missing}
    assert tok("\x04" * 1000, add_special_tokens=False)["input_ids"] == []
    assert bound.may_fit("\x04" * 10**6, 1)
    assert_sound(tok)


def test_tokenizers_that_drop_or_fold_text_get_no_bound():
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

    def word_level(pre=None, norm=None):
        tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre or pre_tokenizers.Whitespace()
        if norm:
            tok.normalizer = norm
        return _fast(tok, unk_token="[UNK]")

    whitespace = word_level()
    assert len(whitespace("a" + " " * 1000 + "b", add_special_tokens=False)["input_ids"]) == 2  # 1002 characters, 2 tokens
    assert char_bound(whitespace) is None
    assert char_bound(byte_level_bpe(normalizer="Strip")) is None
    assert char_bound(byte_level_bpe(normalizer="StripAccents")) is None
    fused = Tokenizer(models.BPE({"a": 0, "<unk>": 1}, [], unk_token="<unk>", fuse_unk=True))
    fused.pre_tokenizer = pre_tokenizers.Metaspace()
    assert len(_fast(fused, unk_token="<unk>")("x" * 1000, add_special_tokens=False)["input_ids"]) <= 2  # a run folded into one [UNK]
    assert char_bound(_fast(fused, unk_token="<unk>")) is None
    rstrip = byte_level_bpe()
    rstrip.add_special_tokens({"additional_special_tokens": [AddedToken("<|end|>", rstrip=True)]})
    assert char_bound(rstrip) is None
    assert char_bound(object()) is None  # a slow tokenizer: no Rust backend to read


def test_the_normaliser_factors_cover_unicode():
    """NFC folds at most the longest canonical decomposition into one character, NFKC the longest
    compatibility decomposition (NFC(x) decomposes back to NFD(x), whose length is at least x's)."""
    longest = {form: max(len(unicodedata.normalize(form, chr(c))) for c in range(0x110000)) for form in ("NFD", "NFKD")}
    assert NORMALIZER_SHRINK["NFC"] >= longest["NFD"] and NORMALIZER_SHRINK["NFKC"] >= longest["NFKD"]


def test_fitting_ids_never_tokenises_a_text_beyond_the_bound(tiny_model):
    from reasonrl.models.loading import load_tokenizer

    tok = CountingTokenizer(load_tokenizer(tiny_model))
    per = char_bound(tok).per_token
    assert fitting_ids("What is 1 + 1?", tok, 100) == tok.tok("What is 1 + 1?", add_special_tokens=False)["input_ids"]
    assert fitting_ids("1" * (per * 100 + 1), tok, 100) is None
    assert len("What is 1 + 1? " * 50) <= per * 100
    assert fitting_ids("What is 1 + 1? " * 50, tok, 100) is None  # within the bound: tokenised, then too long
    assert tok.calls == [14, 15 * 50]
