"""In-process equivalence and reward: integers as integers, the rest through real math-verify."""

from __future__ import annotations

import threading

import pytest

from reasonrl.rewards import (
    Score,
    answers_equivalent,
    integer_equivalent,
    math_reward,
    score,
)


@pytest.mark.parametrize(
    ("pred", "gt", "expected"),
    [
        ("025", "25", True),
        ("3,000", "3000", True),
        ("$540$", "540", True),
        ("540 dollars", "540", True),
        ("27.0", "27", True),
        ("-7", "-7", True),
        ("-7", "7", False),
        ("24", "25", False),
        ("\\frac{1}{2}", "25", None),  # not an integer: math-verify decides
    ],
)
def test_integer_fast_path(pred: str, gt: str, expected: bool | None) -> None:
    assert integer_equivalent(pred, gt) is expected


@pytest.mark.parametrize(
    ("pred", "gt", "expected"),
    [
        # fractions, decimals, slashes
        ("\\frac{1}{2}", "0.5", True),
        ("0.5", "\\frac{1}{2}", True),
        ("1/2", "\\frac{1}{2}", True),
        ("\\dfrac{1}{2}", "1/2", True),
        ("\\frac12", "0.5", True),
        ("$\\frac{1}{2}$", "0.5", True),
        ("\\frac{1}{3}", "0.5", False),
        # radicals
        ("2\\sqrt{3}", "\\sqrt{12}", True),
        ("\\sqrt{12}", "2\\sqrt{3}", True),
        ("3\\sqrt{2}", "\\sqrt{12}", False),
        # an integer written as an expression, and symbolic answers that are not integers
        ("\\frac{50}{2}", "25", True),
        ("3\\pi", "3", False),
        ("\\pi", "\\pi", True),
        ("-\\frac{3}{4}", "-0.75", True),
        ("-\\frac{3}{4}", "0.75", False),
    ],
)
def test_math_verify_equivalence(pred: str, gt: str, expected: bool) -> None:
    assert answers_equivalent(pred, gt) is expected


@pytest.mark.parametrize(
    ("response", "gt", "reward"),
    [
        ("blah\nAnswer: 025", "25", 1.0),
        ("blah\nAnswer: $3,000$", "3000", 1.0),
        ("blah\nAnswer: 540 dollars", "540", 1.0),
        ("blah\nAnswer: -12", "-12", 1.0),
        ("blah\nAnswer: 12", "-12", -1.0),
        ("thus \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("thus \\boxed{2\\sqrt{3}}", "\\sqrt{12}", 1.0),
        ("Answer: 5\nAnswer: 6", "5", -1.0),  # several answers: the last one counts
        ("\\boxed{5} ... \\boxed{6}", "6", 1.0),
        ("I give up.", "5", -1.0),
        # what the paper's scorer accepts, and the hacks it refuses
        ("so\n**Final Answer:** 42", "42", 1.0),
        ("Final Answer: 10 square feet", "10", 1.0),
        ("Answer: 42 and above", "42", -1.0),
        ("Answer: 3 or more", "3", -1.0),
        ("Answer: 42 apples", "42", -1.0),
        ("Answer: \\text{Evelyn}", "\\text{Evelyn}", 1.0),
    ],
)
def test_math_reward(response: str, gt: str, reward: float) -> None:
    assert math_reward(response, gt) == reward


def test_the_scorer_pool_decides_the_same() -> None:
    from reasonrl.rewards import RewardScorer

    cases = [("Answer: 42 and above", "42", -1.0), ("Answer: 3 or more", "3", -1.0), ("**Final Answer:** 42", "42", 1.0),
             ("Answer: \\frac{1}{2}", "0.5", 1.0)]
    with RewardScorer(num_workers=1) as scorer:
        scores, stats = scorer.score_batch([c[0] for c in cases], [c[1] for c in cases])
    assert [s.reward for s in scores] == [c[2] for c in cases]
    assert stats.verified == 1  # only the fraction needed math-verify


def test_score_fields() -> None:
    assert score("Answer: 025", "25") == Score(1.0, True, "025", "ok")
    assert score("Answer: 7", 8) == Score(-1.0, False, "7", "ok")
    assert score("nothing here", "1") == Score(-1.0, False, None, "no_answer")


def test_in_process_reward_works_in_a_thread() -> None:
    """math-verify's own signal-based timeout is off: no 'signal only works in main thread'."""
    out: list[float] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            out.append(math_reward("Answer: \\frac{1}{2}", "0.5"))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=target)
    t.start()
    t.join(60)
    assert not errors and out == [1.0]
