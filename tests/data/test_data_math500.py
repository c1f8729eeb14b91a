"""The transformation on MATH-500 (../shared/data/math500.jsonl): what is kept, what is refused."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from reasonrl.data import IntegerProblem, integerize


@pytest.fixture(scope="module")
def math500(shared):
    rows = [json.loads(line) for line in (shared / "math500.jsonl").read_text(encoding="utf-8").splitlines()]
    return [(r, integerize(r["problem"], r["answer"])) for r in rows]


def _plain_integer(answer: str) -> int | None:
    """The README's 313 integers: digits with an optional sign, or thousands groups ("10,\\!080")."""
    s = answer.strip()
    if re.fullmatch(r"-?\d+|\d{1,3}(?:,(?:\\!)?\d{3})+", s):
        return int(re.sub(r"[^\d-]", "", s))
    return None


def test_every_integer_answer_is_kept_unchanged(math500):
    integers = [(r, out) for r, out in math500 if _plain_integer(r["answer"]) is not None]
    assert len(integers) == 313
    for r, out in integers:
        assert isinstance(out, IntegerProblem), (r["answer"], out)
        assert (out.rule, out.answer, out.problem) == ("integer", _plain_integer(r["answer"]), r["problem"])


def test_fraction_and_radical_answers_become_integers(math500):
    # answers made only of numbers, \frac and \sqrt (no letters, tuples, \pm, ...)
    pure = [
        (r, out)
        for r, out in math500
        if re.search(r"\\(?:[dt]?frac|sqrt)", r["answer"]) and not re.sub(r"\\(?:[dt]?frac|sqrt)|[\d{}+\- ]", "", r["answer"])
    ]
    assert len(pure) == 78
    kept = [out for _, out in pure if isinstance(out, IntegerProblem)]
    assert len(kept) == len(pure)
    assert {out.rule for out in kept} == {"fraction", "sqrt", "sqrt_over", "sqrt_sum"}


def test_counts_per_rule_and_reason(math500):
    rules = Counter(out.rule for _, out in math500 if isinstance(out, IntegerProblem))
    reasons = Counter(out.reason for _, out in math500 if not isinstance(out, IntegerProblem))
    print("\nMATH-500 rules:", dict(rules.most_common()), "\nMATH-500 refusals:", dict(reasons.most_common()))
    assert dict(rules) == {
        "integer": 315, "fraction": 59, "degrees": 14, "sqrt": 14, "pi_multiple": 5, "sqrt_over": 4, "units": 4,
        "sqrt_sum": 2, "pi_fraction": 1,
    }
    assert sum(reasons.values()) == 82
    assert reasons["verification_failed"] == 0
    # answers that are not one real number are refused, never guessed
    for reason in ("tuple", "interval", "matrix", "text", "variable", "complex", "infinity", "plus_minus"):
        assert reasons[reason] > 0, reason


def test_rewritten_problems_keep_the_original_text(math500):
    for r, out in math500:
        if isinstance(out, IntegerProblem) and out.rule != "integer":
            assert out.problem == r["problem"].rstrip() + "\n\n" + out.sentence
