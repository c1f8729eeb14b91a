"""How many characters a text of at most N tokens can have: prompts longer than that are skipped
without being tokenised (a 50 MB problem took 68 s and 9.7 GB to be tokenised and skipped; a 1 GB
one aborted in the Rust tokenizer).

The bound, :func:`char_bound`'s characters per token × N, is sound for the tokenizers it is
computed for: a text of more characters has more than N tokens. Each token of a tokenizer's output stands for a piece of
its pre-tokenised text: for byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) the token's vocabulary
string has one character per byte of the piece, and a character is at least one byte; for
SentencePiece-style BPE (Metaspace, ``▁`` for a space; Llama 2, Mistral, Gemma) one character per
character of the piece, and a byte-fallback token ``<0xNN>`` (6 characters) stands for at most one.
So a token stands for at most as many characters of the normalised text as its vocabulary string
(or added token) has, the longest of which is ``M``; and a normaliser shrinks the text at most by
a known factor ``K`` (NFC at most 4 characters into one: the longest canonical decomposition; NFKC
18: U+FDFA's). Hence characters <= K × M × tokens, not counting the characters the tokenizer
drops (a byte-level vocabulary without some control bytes, as SmolLM2's, gives U+0004 no token).

That needs a tokenizer that drops no character and never folds an unbounded run into one token;
:func:`char_bound` returns None (no bound: the text is tokenised in full, as before) for the
others: a pre-tokeniser that removes text (Whitespace, BERT's, a ``Split`` with behaviour
``Removed``), a normaliser that deletes or collapses (Strip, StripAccents, BERT's, SentencePiece's
precompiled maps, a regex ``Replace``), an unknown token that can fuse a run of characters (a BPE
or Unigram model without byte fallback whose alphabet may miss a character), an added token that
swallows the whitespace beside it (``lstrip`` / ``rstrip``), and slow (non-Rust) tokenizers.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any

# How many characters of its input a normaliser may fold into one (None: it may delete characters).
NORMALIZER_SHRINK = {"NFD": 1, "NFKD": 1, "NFC": 4, "NFKC": 18, "Lowercase": 1, "Prepend": 1, "ByteLevel": 1}
# Pre-tokenisers that keep every character (Split and Punctuation unless their behaviour is "Removed").
KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split", "Punctuation"}

_cache: "weakref.WeakKeyDictionary[Any, CharBound | None]" = weakref.WeakKeyDictionary()


def _shrink(norm: dict[str, Any] | None) -> int | None:
    if norm is None:
        return 1
    kind = norm.get("type")
    if kind == "Sequence":
        factor = 1
        for part in norm.get("normalizers", []):
            f = _shrink(part)
            if f is None:
                return None
            factor *= f
        return factor
    if kind == "Replace":  # a literal replaced by a text at least as long (Llama 2: " " -> "▁")
        pattern, content = norm.get("pattern", {}), norm.get("content", "")
        literal = pattern.get("String") if isinstance(pattern, dict) else None
        return 1 if isinstance(literal, str) and literal and len(content) >= len(literal) else None
    return NORMALIZER_SHRINK.get(kind)


def _keeps(pre: dict[str, Any] | None) -> bool:
    if pre is None:
        return True
    kind = pre.get("type")
    if kind == "Sequence":
        return all(_keeps(p) for p in pre.get("pretokenizers", []))
    return kind in KEEPING_PRE_TOKENIZERS and pre.get("behavior") != "Removed"


def _has_type(spec: dict[str, Any] | None, kind: str) -> bool:
    if spec is None:
        return False
    if spec.get("type") == kind:
        return True
    return any(_has_type(p, kind) for p in spec.get("pretokenizers", spec.get("normalizers", [])) if isinstance(p, dict))


def byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: byte -> the character standing for it in the vocabulary."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b], extra = chr(256 + extra), extra + 1
    return out


def _dropped(model: dict[str, Any], vocab: dict[str, int], byte_level: bool) -> str | None:
    """The characters the model drops (it gives them no token), or None when a character can be
    lost in another way (folded with others into one unknown token)."""
    if model.get("type") not in ("BPE", "Unigram"):
        return None  # WordPiece's [UNK] stands for a whole word; WordLevel's for a whole piece
    if byte_level:  # a byte missing from the vocabulary is dropped: a character goes only if all its bytes do
        missing = [b for b, ch in byte_chars().items() if ch not in vocab]
        if not any(0x80 <= b < 0xC0 for b in missing):  # every multi-byte character keeps its continuation bytes
            return "".join(chr(b) for b in sorted(missing) if b < 0x80)
    if model.get("byte_fallback") and all(f"<0x{b:02X}>" in vocab for b in range(256)):
        return ""
    # BPE without fusing: one unknown token per unknown character (Unigram always fuses them)
    return "" if model.get("type") == "BPE" and model.get("unk_token") is not None and not model.get("fuse_unk") else None


@dataclass(frozen=True)
class CharBound:
    """A text has at most ``per_token`` characters per token, not counting the ``dropped``
    characters (a byte-level vocabulary without some control bytes gives them no token)."""

    per_token: int
    dropped: str = ""

    def may_fit(self, text: str, max_tokens: int) -> bool:
        """False when ``text`` has more than ``max_tokens`` tokens for sure."""
        limit = self.per_token * max_tokens
        return len(text) <= limit or len(text) - sum(text.count(c) for c in self.dropped) <= limit


def _compute(tokenizer: Any) -> CharBound | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        spec = json.loads(backend.to_str())
    except Exception:  # noqa: BLE001 - a backend that cannot describe itself gets no bound
        return None
    shrink = _shrink(spec.get("normalizer"))
    if shrink is None or not _keeps(spec.get("pre_tokenizer")):
        return None
    if any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens", [])):
        return None
    vocab = backend.get_vocab(with_added_tokens=True)
    byte_level = _has_type(spec.get("pre_tokenizer"), "ByteLevel") or _has_type(spec.get("normalizer"), "ByteLevel")
    dropped = _dropped(spec.get("model", {}), vocab, byte_level) if vocab else None
    if dropped is None:
        return None
    return CharBound(shrink * max(len(s) for s in vocab), dropped)


def char_bound(tokenizer: Any) -> CharBound | None:
    """``tokenizer``'s :class:`CharBound` (K × M characters per token, see the module's
    docstring); None when it has no such bound. Computed once per tokenizer."""
    try:
        return _cache[tokenizer]
    except KeyError:
        value = _cache[tokenizer] = _compute(tokenizer)
        return value
    except TypeError:  # not weakly referenceable or not hashable: computed each time
        return _compute(tokenizer)


def fitting_ids(text: str, tokenizer: Any, max_tokens: int) -> list[int] | None:
    """``text``'s token ids (no special tokens added) when there are at most ``max_tokens``, else
    None; a text too long for ``max_tokens`` tokens by :func:`char_bound` is not tokenised at all."""
    bound = char_bound(tokenizer)
    if bound is not None and not bound.may_fit(text, max_tokens):
        return None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids if len(ids) <= max_tokens else None
