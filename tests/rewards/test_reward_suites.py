"""The reward against other graders' test suites: Math-Verify's tests, NeMo-Skills'
``test_math_equal.py`` and hendrycks/math's ``math_equivalence_test.py`` (issue 40).

The cases are facts (an answer, a ground truth, the suite's verdict), kept in
``data/grader_suites.json`` with the source file and line of each; no code of the suites is used.
reasonrl agrees with every case except those whose ``differs`` names a section of docs/rewards.md
("Where we differ and why"): there its verdict is the other one, on purpose. A case that starts to
agree (or one that stops) fails here, so the table and the page stay true.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from reasonrl.rewards import math_reward

_DATA = json.loads((Path(__file__).parent / "data" / "grader_suites.json").read_text(encoding="utf-8"))
_CASES: list[dict[str, Any]] = _DATA["cases"]
_DOC = Path(__file__).resolve().parents[2] / "docs" / "rewards.md"

# The reasons docs/rewards.md gives, by the key the table uses.
REASONS = ("free_text", "decimal_comma", "setting", "separate_boxes", "foreign_words", "suite_pins_a_bug", "list_order", "arithmetic_left_undone")


def _id(i: int, case: dict[str, Any]) -> str:
    return f"{i}-{case['suite']}-{case['source'].rsplit('::', 1)[-1]}"


@pytest.mark.parametrize("case", _CASES, ids=[_id(i, c) for i, c in enumerate(_CASES)])
def test_the_reward_agrees_with_the_suites_except_where_documented(case: dict[str, Any]) -> None:
    credited = math_reward(case["response"], case["ground_truth"]) > 0
    expected = case["suite_verdict"] if case["differs"] is None else not case["suite_verdict"]
    assert credited is expected, (case["source"], case["differs"])


def test_every_difference_has_its_reason_in_the_docs() -> None:
    text = _DOC.read_text(encoding="utf-8")
    used = Counter(c["differs"] for c in _CASES if c["differs"] is not None)
    assert set(used) <= set(REASONS)
    for reason in REASONS:
        assert f"`{reason}`" in text, f"docs/rewards.md does not explain `{reason}`"


def test_the_counts_in_the_docs_are_the_tables() -> None:
    """docs/rewards.md states the cases per suite and how many agree; they are counted here."""
    text = _DOC.read_text(encoding="utf-8")
    for suite in ("math-verify", "nemo-skills", "hendrycks-math"):
        cases = [c for c in _CASES if c["suite"] == suite]
        agree = sum(c["differs"] is None for c in cases)
        assert f"| {suite} | {len(cases)} | {agree} |" in text, suite
    assert f"| all | {len(_CASES)} | {sum(c['differs'] is None for c in _CASES)} |" in text


def test_the_sources_are_named() -> None:
    assert {c["suite"] for c in _CASES} == set(_DATA["sources"])
    for source in _DATA["sources"].values():
        assert source["repo"] and source["commit"] and source["license"]
    assert all(c["source"] and c["response"] and c["ground_truth"] for c in _CASES)
