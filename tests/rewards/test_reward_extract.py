"""extract_answer: DAPO's `Answer:` line first, then the last \\boxed{} / \\fbox{}."""

from __future__ import annotations

import pytest

from reasonrl.rewards import extract_answer, find_boxed


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Let me think.\n2 + 3 = 5.\nAnswer: 5", "5"),
        ("...\nAnswer: 025\n", "025"),
        ("...\nAnswer:42", "42"),
        ("...\n  Answer:   $\\frac{1}{2}$  ", "$\\frac{1}{2}$"),
        ("...\n**Answer:** 540", "540"),
        ("...\n**Answer: 540**", "540"),
        ("...\n## Answer: 12", "12"),
        ("...\n> *Answer*: 7", "7"),
        ("...\nANSWER: -3", "-3"),
        ("...\nanswer: 3,000", "3,000"),
        ("...\nAnswer: 540 dollars.", "540 dollars."),
        # the paper's scorer reads "Answer:" anywhere in a line, with markdown around it
        ("...\n**Final Answer:** 42", "42"),
        ("...\nFinal Answer: 42", "42"),
        ("...\n### Final answer: $7$", "$7$"),
        ("...\nThus the final **answer**: 12.", "12."),
        # A box on the Answer line is unwrapped.
        ("...\nAnswer: $\\boxed{\\frac{3}{4}}$", "\\frac{3}{4}"),
    ],
)
def test_answer_line(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        # Minerva's format (and lm-eval's minerva_math): the answer is between the two phrases (issue 40, item 8)
        ("...\nFinal Answer: The final answer is 17. I hope it is correct.", "17"),
        ("...\nFinal Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.", "$\\frac{1}{2}$"),
        ("...\nFinal Answer: The final answer is 7.78. I hope it is correct.<|im_end|>", "7.78"),
        # more text after the closing phrase: the line is a sentence (the word guard scores it -1)
        ("...\nFinal Answer: The final answer is 42. I hope it is correct. Or 43",
         "The final answer is 42. I hope it is correct. Or 43"),
        ("...\nFinal Answer: The final answer is 16386.16.", "16386.16"),
        ("...\nFinal Answer: the final answer is $x-2y+z-1=0$. I hope it is correct.<|im_start|>user", "$x-2y+z-1=0$"),
        ("...\nAnswer: The answer is 5", "5"),
        ("...\nAnswer: The answer is: 5.", "5"),
        ("...\nAnswer: The final answer is\nAnswer: 3", "3"),
        ("Answer: 4\nFinal Answer: The final answer is . I hope it is correct.", "4"),
        # the last final answer wins, line or box, whichever comes later
        ("Answer: 12\nso maybe \\boxed{13}", "13"),
        ("The answer: we need the area first.\nThe area is $\\boxed{17}$.", "17"),
        ("\\boxed{13} was wrong.\nAnswer: 12", "12"),
        ("Answer: $\\boxed{12}$ and that is it", "12"),
        ("Let me check the answer: 3\n\\boxed{4}\nAnswer: 5", "5"),
        ("Answer: 12\n\\boxed{}", "12"),  # an empty box is no answer
        ("Answer: 12\n\\boxed{13", "12"),  # nor an unclosed one
    ],
)
def test_minerva_phrasing_and_the_last_final_answer(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


def test_several_answer_lines_last_wins() -> None:
    assert extract_answer("Answer: 1\nwait, that is wrong.\nAnswer: 2\nmore text") == "2"


def test_empty_answer_line_is_skipped() -> None:
    assert extract_answer("Answer: 7\nthinking again\nAnswer:\n") == "7"
    assert extract_answer("so \\boxed{9}\nAnswer:   ") == "9"
    assert extract_answer("Answer: **") is None


def test_answer_inside_a_sentence_takes_the_rest_of_the_line() -> None:
    assert extract_answer("so the final Answer: 3\nthanks") == "3"
    assert extract_answer("The Answer: 3 is wrong, so \\boxed{4}") == "4"  # a box in the rest wins
    assert extract_answer("the answer is 5") is None  # no "answer:"


def test_extraction_is_linear_time() -> None:
    """20,000 unclosed boxes took 113 s with per-box scanning; one pass is milliseconds. (No
    timing is asserted: a quadratic scan would make this test visibly slow, not fail.)"""
    assert extract_answer("\\boxed{" * 20_000) is None
    assert extract_answer("answer" + " *" * 50_000) is None
    assert find_boxed("\\boxed{1}" * 5_000)[-1] == "1"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("so the result is \\boxed{42}.", "42"),
        ("$\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}} done", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed {7}", "7"),
        ("\\fbox{8}", "8"),
        ("first \\boxed{1}, then \\boxed{2}, finally \\boxed{-3}", "-3"),
        ("set \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{\\boxed{5}}", "5"),
        # an unclosed (truncated) last box is ignored; the previous one counts
        ("\\boxed{10} and then \\boxed{\\frac{1}{", "10"),
        ("\\boxed{} and \\boxed{3}", "3"),
    ],
)
def test_boxed(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    "response",
    ["", "I do not know.", "the answer is 5", "\\boxed{}", "\\boxed{unclosed", "\\boxed 5"],
)
def test_no_answer(response: str) -> None:
    assert extract_answer(response) is None


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        # boxes in a row, on one line, with only commas, "and"/"or" or spacing between them are one list
        ("\\boxed{1},\\boxed{2},\\boxed{3}", "1, 2, 3"),
        ("so \\[ \\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}. \\]", "-2, 1"),
        ("$\\boxed{1}$ and $\\boxed{2}$", "1, 2"),
        ("\\boxed{(1, 2)}, \\boxed{(2, 1)}", "(1, 2), (2, 1)"),
        # anything else between them: the last box alone
        ("first \\boxed{1}, then \\boxed{2}", "2"),
        ("\\boxed{5}\n\\boxed{6}", "6"),
        ("\\boxed{(3, 3)} \\text{ for part (a) and } \\boxed{(1, 1)}", "(1, 1)"),
        ("\\boxed{\\boxed{5}}", "5"),
    ],
)
def test_boxes_in_a_row_are_one_list(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


def test_find_boxed_order_and_nesting() -> None:
    assert find_boxed("\\boxed{a} x \\fbox{b{c}} \\boxed{") == ["a", "b{c}"]
