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
        # an integer written as an expression is arithmetic left undone (DAPO's scorer refuses it
        # too); symbolic answers that are not integers
        ("\\frac{50}{2}", "25", False),
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
        # Minerva's format, and a final box after a line that mentions "answer:" (issue 40, item 8)
        ("...\nFinal Answer: The final answer is 17. I hope it is correct.", "17", 1.0),
        ("...\nFinal Answer: The final answer is $28 \\%$. I hope it is correct.", "28", 1.0),
        ("The answer: first we find x.\nSo $\\boxed{17}$.", "17", 1.0),
        ("Answer: 16\nwait, that is wrong: $\\boxed{17}$", "16", -1.0),
        # boxes in a row are one list: right for a list, never credit for one of two answers
        ("so $\\boxed{1}, \\boxed{2}$", "1, 2", 1.0),
        ("so $\\boxed{1}, \\boxed{2}$", "2", -1.0),
        ("so $\\boxed{1}, \\boxed{2}$", "1", -1.0),
    ],
)
def test_math_reward(response: str, gt: str, reward: float) -> None:
    assert math_reward(response, gt) == reward


@pytest.mark.parametrize(
    ("pred", "gt", "expected"),
    [
        # arithmetic left undone against an integer: the hack a policy found by restating the question
        ("2 + 6 + 4 + 1 + 1 + 8", "22", False),
        ("9+2+3", "14", False),
        ("(6 + 8 + 3 + 9) + 2", "28", False),
        ("\\dfrac{28}{2}", "14", False),
        ("28/2", "14", False),
        ("2^4", "16", False),
        ("2^{4}", "16", False),
        ("7 \\times 2", "14", False),
        ("7 \\cdot 2", "14", False),
        ("7*2", "14", False),
        ("\\sqrt{196}", "14", False),
        ("4!", "24", False),
        ("20 − 6", "14", False),
        # still answers: an equation's result (as DAPO's normalisation reads it), signs, degrees,
        # a unit's power, decimals, separators
        ("2 + 9 + 3 = 14", "14", True),
        ("x = 14", "14", True),
        ("-14", "-14", True),
        ("−14", "-14", True),
        ("(-14)", "-14", True),
        ("14^\\circ", "14", True),
        ("14^{\\circ}", "14", True),
        ("14^{ \\circ }", "14", True),
        ("14°", "14", True),
        ("15 \\text{ cm}^2", "15", True),
        ("14.0", "14", True),
        ("1,000,000", "1000000", True),
        # a symbolic ground truth is an expression itself: math-verify decides
        ("\\frac{2}{4}", "\\frac{1}{2}", True),
        ("2\\sqrt{3}", "\\sqrt{12}", True),
    ],
)
def test_arithmetic_left_undone_is_not_an_integer_answer(pred: str, gt: str, expected: bool) -> None:
    assert answers_equivalent(pred, gt) is expected


def test_the_scorer_pool_decides_the_same() -> None:
    from reasonrl.rewards import RewardScorer

    cases = [("Answer: 42 and above", "42", -1.0), ("Answer: 3 or more", "3", -1.0), ("**Final Answer:** 42", "42", 1.0),
             ("Answer: \\frac{1}{2}", "0.5", 1.0), ("Answer: 2 + 6 + 4 + 1 + 1 + 8", "22", -1.0)]
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


@pytest.mark.parametrize(
    ("pred", "gt", "expected"),
    [
        # math-verify 0.9.0 stops reading at an inner \mathrm{}/\text{} ("12 + \frac{1}{" is all it
        # reads of the first) and drops a trailing "unit" from its open list ("ab", "c", "t", "more"),
        # so these scored +1 while wrong, or -1 while right (issue 40, item 5).
        ("12 + \\frac{1}{\\mathrm{e}}", "12", False),
        ("12+\\frac{1}{\\text{e}}", "12", False),
        ("1", "1 - \\frac{1}{\\mathrm{e}}", False),
        ("1 - \\frac{1}{e}", "1 - \\frac{1}{\\mathrm{e}}", True),
        ("1 + \\frac{1}{\\mathrm{e}}", "1 - \\frac{1}{\\mathrm{e}}", False),
        ("2\\mathrm{e}", "2", False),
        ("x+2c", "x+2", False),
        ("2ab", "2", False),
        ("2", "2ab", False),
        ("5t", "5", False),
        # what stays as it was: real units, styled single letters
        ("\\frac{1}{3}\\text{ meters}", "\\frac{1}{3}", True),
        ("\\frac{1}{3} \\textbf{meters}", "1/3", True),
        ("\\mathrm{E}", "E", True),
        ("\\textbf{A}", "A", True),
        ("\\mathrm{E}*2", "E", False),
    ],
)
def test_an_answer_read_in_part_is_not_credited(pred: str, gt: str, expected: bool) -> None:
    assert answers_equivalent(pred, gt) is expected


@pytest.mark.parametrize(
    ("pred", "gt", "expected"),
    [
        # percent spelled out: a unit like "percent" and "\%", so the number is the answer (issue 40, item 6)
        ("28 pct", "28", True),
        ("28 percentage", "28", True),
        ("28 pct", "28\\%", True),
        ("28 pct", "0.28", False),
        # "and" / "or" between solutions is a list separator, not a word
        ("19, 46, \\text{ and } 82", "19, 46, 82", True),
        ("19, 46, and 82", "19, 46, 82", True),
        ("1 and 2", "1, 2", True),
        ("x = 1 \\text{ or } x = 2", "x = 1, x = 2", True),
        # matrix environments are not words
        ("\\begin{bmatrix} 0 & 0 \\\\ 0 & 1 \\end{bmatrix}", "\\begin{pmatrix}0&0\\\\0&1\\end{pmatrix}", True),
        ("\\left[\\begin{array}{cc}1 & 2 \\\\3 & 4\\end{array}\\right]", "\\begin{pmatrix}1 & 2 \\\\3 & 4\\end{pmatrix}", True),
        ("\\begin{bmatrix} 0 & 0 \\\\ 0 & 1 \\end{bmatrix}", "\\begin{pmatrix}0&0\\\\0&2\\end{pmatrix}", False),
        # products of the ground truth's own letters are not words
        ("2ba", "2ab", True),
        ("a^2+2ab+b^2", "(a+b)^2", True),
        ("a^2+2ab+b^2", "(a-b)^2", False),
        # what the guard is for still holds
        ("42 and above", "42", False),
        ("3 or more", "3", False),
        ("42 and 43", "42", False),
        ("42 or 43", "42", False),
        ("17\\text{ any text}", "17", False),
        ("42 apples", "42", False),
        ("2 and", "2", False),
    ],
)
def test_the_word_guard_knows_lists_matrices_products_and_percent(pred: str, gt: str, expected: bool) -> None:
    assert answers_equivalent(pred, gt) is expected


@pytest.mark.parametrize(
    ("pred", "gt", "expected"),
    [
        # a comma followed by a space separates list items; it is not a thousands separator (issue 40, item 7)
        ("32, 349", "32349", False),
        ("1, 300", "1300", False),
        ("32349", "32, 349", False),
        ("32, 349", "32, 349", True),
        ("$1, 300$", 1300, False),
        # thousands separators as they are written
        ("32,349", "32349", True),
        ("3,000", 3000, True),
        ("11,\\! 111,\\! 111,\\! 100", "11111111100", True),
        ("1{,}300", "1300", True),
        ("1\\,300", "1300", True),
    ],
)
def test_a_comma_and_a_space_separate_a_list(pred: str, gt: str | int, expected: bool) -> None:
    assert answers_equivalent(pred, gt) is expected


def test_normalisation_is_linear_time() -> None:
    """The rule step runs in the training process without a timeout: its patterns scan long blank
    runs and long lists once. (No timing is asserted: a quadratic scan would make this test
    visibly slow, not fail.)"""
    from reasonrl.rewards.verify import decide_by_rule, normalize_answer

    assert normalize_answer("1" + " " * 100_000 + "and 2") == "1, 2"
    assert normalize_answer("1 and " * 20_000 + "2").count(",") == 20_000
    assert decide_by_rule("1" + " " * 100_000 + "x", "12") is None
    assert decide_by_rule("\\text{" * 20_000, "12") is None
    assert decide_by_rule("\\begin{array}{" + "c" * 100_000, "12") is False  # an unclosed column spec: a word


@pytest.mark.parametrize(
    "response",
    [
        # a second answer after the right one, in each form the reading rules of issue 40 touch
        "Answer: The final answer is 42. I hope it is correct. Or 43",
        "Answer: 42 \\text{43}",
        "Answer: 42 \\mbox{43}",
        "Answer: 42\\text{ and 43}",
        "Answer: 42\\text{ or }",
        "Answer: 42 or 43",
        "Answer: 43 or 42",
        "Answer: 42 \\text{ or } 43",
        "\\boxed{42}, \\boxed{43}",
        "\\boxed{43} \\quad \\text{or} \\quad \\boxed{42}",
        "Answer: 42 pct or 43",
        "Answer: 42\\text{ cm or 43}",
    ],
)
def test_two_answers_are_never_credited(response: str) -> None:
    assert math_reward(response, "42") == -1.0
    assert math_reward(response.replace("42", "\\frac{1}{2}").replace("43", "\\frac{1}{3}"), "\\frac{1}{2}") == -1.0
