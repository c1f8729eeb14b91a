"""Unit tests of the integer-answer transformation: one or more cases per rule and per refusal."""

from __future__ import annotations

import math

import pytest
import sympy

import reasonrl.data.transform as transform
from reasonrl.data import REASONS, RULES, IntegerProblem, Refusal, integerize, to_integer_answer
from reasonrl.data.latex import independent_parse, normalise

P = "Compute the value."


def ok(answer, problem: str = P) -> IntegerProblem:
    out = integerize(problem, answer)
    assert isinstance(out, IntegerProblem), f"{answer!r} refused: {out}"
    return out


@pytest.mark.parametrize(
    "answer, value",
    [
        ("025", 25), ("1,000", 1000), ("-3", -3), ("27.0", 27), (27.0, 27), (12, 12), ("\\boxed{12}", 12),
        ("$540$", 540), ("10,\\!080", 10080), ("11,\\! 111,\\! 111,\\! 100", 11111111100), ("x = 5", 5), ("0", 0),
        (["7"], 7),
    ],
)
def test_integer_answers_pass_unchanged(answer, value):
    out = ok(answer)
    assert (out.rule, out.answer, out.problem, out.sentence) == ("integer", value, P, "")


FRACTION_SENTENCE = "The answer can be written as $\\frac{m}{n}$, where $m$ and $n$ are relatively prime positive integers; find $m+n$."


@pytest.mark.parametrize(
    "answer, form, value",
    [
        ("\\frac{6}{8}", "\\frac{3}{4}", 7),  # not in lowest terms: reduced first
        ("\\dfrac{3}{4}", "\\frac{3}{4}", 7),
        ("\\tfrac{3}{4}", "\\frac{3}{4}", 7),
        ("3/4", "\\frac{3}{4}", 7),
        ("\\frac43", "\\frac{4}{3}", 7),
        ("\\frac 59", "\\frac{5}{9}", 14),
        ("\\frac9{19}", "\\frac{9}{19}", 28),
        ("1\\frac{4}{5}", "\\frac{9}{5}", 14),  # a mixed number, as MATH writes them
        ("\\frac{\\frac{1}{2}}{3}", "\\frac{1}{6}", 7),
        ("\\frac{2016}{2017^{2}}", "\\frac{2016}{4068289}", 4070305),
        ("\\frac{\\sqrt{2}}{\\sqrt{8}}", "\\frac{1}{2}", 3),
    ],
)
def test_fraction(answer, form, value):
    out = ok(answer)
    assert (out.rule, out.form, out.answer) == ("fraction", form, value)
    assert out.sentence == FRACTION_SENTENCE
    assert out.problem == P + "\n\n" + FRACTION_SENTENCE


@pytest.mark.parametrize("answer", ["-\\frac{3}{4}", "\\frac{-3}{4}", "-3/4", "-\\frac{6}{8}"])
def test_negative_fraction_names_the_sign(answer):
    out = ok(answer)
    assert (out.rule, out.answer, out.form) == ("fraction", 7, "-\\frac{3}{4}")
    assert "$-\\frac{m}{n}$" in out.sentence and "positive integers" in out.sentence


@pytest.mark.parametrize(
    "answer, rule, form, value",
    [
        ("\\sqrt{12}", "sqrt", "2\\sqrt{3}", 5),  # simplified first: 2*sqrt(3)
        ("11\\sqrt2", "sqrt", "11\\sqrt{2}", 13),
        ("\\sqrt{51}", "sqrt", "\\sqrt{51}", 52),
        ("-\\sqrt{12}", "sqrt", "-2\\sqrt{3}", 5),
        ("\\frac{3\\sqrt{3}}{4}", "sqrt_over", "\\frac{3\\sqrt{3}}{4}", 10),
        ("\\frac{\\sqrt{3}}{3}", "sqrt_over", "\\frac{\\sqrt{3}}{3}", 7),
        ("\\frac{1}{\\sqrt{3}}", "sqrt_over", "\\frac{\\sqrt{3}}{3}", 7),  # rationalised
        ("\\sqrt{\\frac{3}{4}}", "sqrt_over", "\\frac{\\sqrt{3}}{2}", 6),
        ("\\frac{\\sqrt{\\frac{3}{4}}}{2}", "sqrt_over", "\\frac{\\sqrt{3}}{4}", 8),  # nested \frac{\sqrt{..}}{..}
        ("\\frac{9}{32} \\sqrt{2}", "sqrt_over", "\\frac{9\\sqrt{2}}{32}", 43),
        ("\\frac{6\\sqrt{8}}{4}", "sqrt", "3\\sqrt{2}", 5),
    ],
)
def test_radicals(answer, rule, form, value):
    out = ok(answer)
    assert (out.rule, out.form, out.answer) == (rule, form, value)


def test_sqrt_sentences():
    assert ok("2\\sqrt{5}").sentence == (
        "The answer can be written as $a\\sqrt{b}$, where $a$ and $b$ are positive integers and $b$ is not "
        "divisible by the square of any prime; find $a+b$."
    )
    assert "$-a\\sqrt{b}$" in ok("-\\sqrt{3}").sentence
    assert "$a$ and $c$ are relatively prime" in ok("\\frac{\\sqrt{3}}{2}").sentence


@pytest.mark.parametrize(
    "answer, form, letters, value",
    [
        ("\\frac{1+\\sqrt{5}}{2}", "\\frac{1+\\sqrt{5}}{2}", "\\frac{a+\\sqrt{b}}{c}", 8),  # DAPO's (a+sqrt(b))/c
        ("\\frac{2+2\\sqrt{5}}{4}", "\\frac{1+\\sqrt{5}}{2}", "\\frac{a+\\sqrt{b}}{c}", 8),  # not in lowest terms
        ("\\frac{1+\\sqrt{20}}{2}", "\\frac{1+2\\sqrt{5}}{2}", "\\frac{a+b\\sqrt{c}}{d}", 10),
        ("\\frac{3+2\\sqrt{6}}{5}", "\\frac{3+2\\sqrt{6}}{5}", "\\frac{a+b\\sqrt{c}}{d}", 16),
        ("\\frac{6+4\\sqrt{6}}{10}", "\\frac{3+2\\sqrt{6}}{5}", "\\frac{a+b\\sqrt{c}}{d}", 16),
        ("(1+\\sqrt{5})/2", "\\frac{1+\\sqrt{5}}{2}", "\\frac{a+\\sqrt{b}}{c}", 8),
        ("1+2\\sqrt{3}", "1+2\\sqrt{3}", "a+b\\sqrt{c}", 6),
        ("11 \\sqrt{5} + 11", "11+11\\sqrt{5}", "a+b\\sqrt{c}", 27),
        ("\\frac{15-8 \\sqrt{3}}{33}", "\\frac{15-8\\sqrt{3}}{33}", "\\frac{a-b\\sqrt{c}}{d}", 59),
        ("\\frac{-1+\\sqrt{5}}{2}", "\\frac{\\sqrt{5}-1}{2}", "\\frac{\\sqrt{b}-a}{c}", 8),
        ("-\\frac{1+\\sqrt 5}{2}", "-\\frac{1+\\sqrt{5}}{2}", "-\\frac{a+\\sqrt{b}}{c}", 8),
        ("-4-2\\sqrt{3}", "-(4+2\\sqrt{3})", "-(a+b\\sqrt{c})", 9),
    ],
)
def test_sqrt_sum(answer, form, letters, value):
    out = ok(answer)
    assert (out.rule, out.form, out.answer) == ("sqrt_sum", form, value)
    assert f"${letters}$" in out.sentence
    assert out.answer == sum(v for _, v in out.parts)


def test_sqrt_sum_states_the_gcd_condition_only_when_needed():
    assert "\\gcd(a,b,d)=1" in ok("\\frac{3+2\\sqrt{6}}{5}").sentence
    assert "gcd" not in ok("\\frac{1+\\sqrt{5}}{2}").sentence  # unique without it
    assert "gcd" not in ok("1+2\\sqrt{3}").sentence


@pytest.mark.parametrize(
    "answer, rule, value",
    [
        ("288 \\pi", "pi_multiple", 288), ("\\pi", "pi_multiple", 1), ("-3\\pi", "pi_multiple", -3),
        ("\\frac{5\\pi}{3}", "pi_fraction", 8), ("\\frac{\\pi}{2}", "pi_fraction", 3), ("-\\frac{\\pi}{6}", "pi_fraction", 7),
    ],
)
def test_pi(answer, rule, value):
    out = ok(answer)
    assert (out.rule, out.answer) == (rule, value)
    if value < 0 or answer.startswith("-\\frac"):
        assert "-" in out.form


@pytest.mark.parametrize(
    "answer, rule, value",
    [
        ("90^\\circ", "degrees", 90), ("90^{\\circ}", "degrees", 90), ("90°", "degrees", 90), ("90\\text{ degrees}", "degrees", 90),
        ("25\\%", "percent", 25), ("12.0\\%", "percent", 12),
        ("5\\text{ cm}", "units", 5), ("\\$36", "units", 36), ("864 \\mbox{ inches}^2", "units", 864), ("540 dollars", "units", 540),
        ("2^{10}", "integer_expression", 1024), ("\\sqrt{16}", "integer_expression", 4), ("2021 \\cdot 5", "integer_expression", 10105),
    ],
)
def test_numbers_with_units_and_integer_expressions(answer, rule, value):
    out = ok(answer)
    assert (out.rule, out.answer) == (rule, value)
    assert out.problem.startswith(P + "\n\n") and out.sentence


def test_fraction_of_degrees_keeps_the_fraction_rule():
    out = ok("\\frac{270}7\\text{ degrees}")
    assert (out.rule, out.answer) == ("fraction", 277)


@pytest.mark.parametrize(
    "answer, reason",
    [
        ("(1,2)", "tuple"), ("\\left( 3, \\frac{\\pi}{2} \\right)", "tuple"),
        ("[0,1)", "interval"), ("(3,4]", "interval"), ("(0,9) \\cup (9,36)", "interval"), ("x \\in [-2,7]", "interval"),
        ("x^2+1", "variable"), ("2k", "variable"), ("y = 2x + 3", "variable"), ("\\cot x", "variable"), ("\\alpha", "variable"),
        ("\\infty", "infinity"), ("(2,\\infty)", "infinity"),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "matrix"),
        ("\\text{Evelyn}", "text"), ("\\text{(C)}", "text"), ("ellipse", "text"),
        ("2.5", "decimal"), (2.5, "decimal"), (".35625", "decimal"), ("4.5e33", "decimal"), ("5.4 \\text{ cents}", "decimal"),
        ("1 \\pm \\sqrt{19}", "plus_minus"),
        ("1,-2", "multiple_answers"), ("3, 5, 7", "multiple_answers"), (["1", "2"], "multiple_answers"),
        ("52_8", "base"), ("4210_{5}", "base"),
        ("6 - 5i", "complex"), ("\\sqrt{-4}", "complex"),
        ("\\{1,2\\}", "set"),
        ("f(x)=x", "equation"), ("k \\geqslant 2", "equation"),
        ("18+2\\pi", "unsupported_form"), ("\\frac{20000}{\\pi}", "unsupported_form"), ("\\sqrt[3]{2}", "unsupported_form"),
        ("\\sqrt{2}+\\sqrt{3}", "unsupported_form"), ("\\sqrt{2+\\sqrt{3}}", "unsupported_form"), ("\\binom{5}{2}", "unsupported_form"),
        ("2^{1009}", "too_large"), ("(2^{4096})^{4096}", "too_large"), ("1" * 1500, "too_large"),
        ("", "empty"), (None, "empty"), ([], "empty"),
        ("\\frac{1}{0}", "unparseable"), ("3 + ", "unparseable"), ("\\frac{100!}{2^{50}}", "unparseable"),
        ("-1./3", "verification_failed"),  # our parser reads "1." as 1, the independent parser does not
    ],
)
def test_refusals(answer, reason):
    out = integerize(P, answer)
    assert isinstance(out, Refusal), out
    assert out.reason == reason
    assert reason in REASONS
    assert to_integer_answer(P, answer) is None


def test_interval_or_tuple_follows_the_problem():
    assert integerize("Give the answer in interval notation.", "(1,2)").reason == "interval"
    assert integerize("Find the point.", "(1,2)").reason == "tuple"


def test_verification_failure_refuses(monkeypatch):
    monkeypatch.setattr(transform, "independent_parse", lambda core: sympy.Rational(1, 3))
    assert integerize(P, "\\frac{3}{4}") == Refusal("verification_failed", "\\frac{3}{4} != \\frac{3}{4}")
    monkeypatch.setattr(transform, "independent_parse", lambda core: None)
    assert integerize(P, "2\\sqrt{3}").reason == "verification_failed"
    # integers need no parse: still kept
    assert integerize(P, "12").rule == "integer"


def test_rewriter_rephrases_the_sentence_only():
    calls = []

    def rewriter(problem, rule, sentence):
        calls.append((problem, rule, sentence))
        return "Find m+n for the reduced fraction m/n."

    out = integerize(P, "\\frac{6}{8}", rewriter=rewriter)
    assert out.answer == 7 and out.rule == "fraction"
    assert out.problem == P + "\n\nFind m+n for the reduced fraction m/n."
    assert calls == [(P, "fraction", FRACTION_SENTENCE)]
    assert integerize(P, "12", rewriter=rewriter).problem == P and len(calls) == 1  # not called for integers
    assert integerize(P, "\\frac{6}{8}", rewriter=lambda *a: "  ").sentence == FRACTION_SENTENCE  # empty: template


def test_deterministic_and_rules_listed():
    a, b = integerize(P, "\\frac{3+2\\sqrt{6}}{5}"), integerize(P, "\\frac{3+2\\sqrt{6}}{5}")
    assert a == b
    for answer in ["1", "\\frac12", "\\sqrt2", "\\frac{\\sqrt2}{3}", "1+\\sqrt2", "\\pi", "\\frac{\\pi}{3}", "5^\\circ", "5\\%", "5 cm", "2^3"]:
        assert ok(answer).rule in RULES


def test_forms_rebuild_the_original_answer():
    """Property check over many shapes: the canonical form equals the original, the answer is the parts' sum."""
    answers = [
        "\\frac{6}{8}", "-\\frac{35}{9}", "\\sqrt{12}", "\\frac{3\\sqrt{3}}{4}", "\\frac{2+2\\sqrt{5}}{4}", "\\frac{15-8\\sqrt{3}}{33}",
        "-\\frac{1+\\sqrt 5}{2}", "6\\sqrt{2}-2", "\\frac{5\\pi}{3}", "\\frac{1}{\\sqrt{3}}", "\\frac{2}{7} \\sqrt{53}",
    ]
    for answer in answers:
        out = ok(answer)
        original = independent_parse(normalise(answer).core)
        rebuilt = independent_parse(out.form)
        assert original is not None and rebuilt is not None
        assert sympy.simplify(original - rebuilt) == 0, (answer, out.form)
        if out.rule not in ("pi_multiple",):
            assert out.answer == sum(v for _, v in out.parts)
        if out.rule == "fraction":
            m, n = dict(out.parts)["m"], dict(out.parts)["n"]
            assert math.gcd(m, n) == 1
