"""Duplicate and contamination checks on normalised problem text.

Normalised text: lower case, every run of characters other than ``a-z0-9`` replaced by one space
(so ``$\\frac{1}{2}$`` and ``\\frac{1}{2}`` normalise alike).

A training problem is contaminated by an evaluation problem when they share word n-grams
(default n = 13, as in GPT-3's decontamination) covering at least ``min_overlap`` (default 0.3)
of the n-grams of the shorter of the two; problems shorter than n words are compared whole (equal
normalised texts). Stock phrases do not count: an n-gram found in ``COMMON_DF`` (3) or more
problems of the evaluation sets is ignored. Both rules are needed because competition problems
share stock phrases: "... can be written as m/n, where m and n are relatively prime positive
integers. Find m+n." is 15 words, so with "any shared 13-gram" a quarter of AMC 2023 counts as
contaminated by AIME 2024 although no problem is shared. A copy shares (nearly) all its n-grams,
a copy with a few numbers changed most of them; a reworded problem (DAPO's version of AIME 2024's
torus problem shares 12% of its 13-grams) is not caught, by n-grams or at any safe threshold.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Iterable


def normalise_text(text: str) -> str:
    """Lower-case words and numbers only, separated by single spaces."""
    s = unicodedata.normalize("NFKC", text).lower()
    return re.sub(r"[^0-9a-z]+", " ", s).strip()


def ngrams(words: list[str], n: int) -> Iterable[str]:
    for i in range(len(words) - n + 1):
        yield " ".join(words[i : i + n])


COMMON_DF = 3


class EvalIndex:
    """The n-grams of one or more evaluation sets, to find training problems that overlap them."""

    def __init__(self, n: int = 13, min_overlap: float = 0.3):
        self.n = n
        self.min_overlap = min_overlap
        self._whole: dict[str, str] = {}
        self._problems: list[tuple[str, set[str]]] = []  # (set name, n-grams)
        self._grams: dict[str, list[int]] | None = None  # built on the first match
        self._common: set[str] = set()
        self._sizes: list[int] = []
        self.sizes: dict[str, int] = {}

    def add(self, name: str, problems: Iterable[str]) -> None:
        count = 0
        for text in problems:
            norm = normalise_text(text)
            if not norm or norm in self._whole:
                continue
            count += 1
            self._whole[norm] = name
            self._problems.append((name, set(ngrams(norm.split(), self.n))))
        self.sizes[name] = self.sizes.get(name, 0) + count
        self._grams = None

    def _build(self) -> dict[str, list[int]]:
        df = Counter(g for _, grams in self._problems for g in grams)
        self._common = {g for g, c in df.items() if c >= COMMON_DF}
        index: dict[str, list[int]] = {}
        self._sizes = []
        for pid, (_, grams) in enumerate(self._problems):
            kept = grams - self._common
            self._sizes.append(len(kept))
            for g in kept:
                index.setdefault(g, []).append(pid)
        self._grams = index
        return index

    def match(self, text: str) -> str | None:
        """The name of the evaluation set ``text`` is contaminated by, or None."""
        norm = normalise_text(text)
        if not norm:
            return None
        hit = self._whole.get(norm)
        if hit is not None:
            return hit
        index = self._grams if self._grams is not None else self._build()
        grams = set(ngrams(norm.split(), self.n)) - self._common
        shared: Counter = Counter()
        for g in grams:
            for pid in index.get(g, ()):
                shared[pid] += 1
        best: tuple[float, str] | None = None
        for pid, c in shared.items():
            frac = c / max(1, min(self._sizes[pid], len(grams)))
            if frac >= self.min_overlap and (best is None or frac > best[0]):
                best = (frac, self._problems[pid][0])
        return best[1] if best else None
