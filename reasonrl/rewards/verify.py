"""Answer equivalence and the rule-based outcome reward (DAPO eq. 7: +1 correct, -1 otherwise).

Both sides are first normalised (:func:`normalize_answer`): a style command around one letter is the
letter (``\\mathrm{e}`` → ``e``), ``pct`` / ``percentage`` are ``percent``, and ``and`` / ``or``
between two items is a list comma. Then equivalence is decided in three steps:

1. Both sides spell an integer (``reasonrl.answers.parse_integer``: "025", "3,000", "$540$",
   "540 dollars", a closed list of units): compare the integers, and stop. Nearly every
   DAPO-Math-17K item ends here. A comma followed by a space separates a list ("32, 349" is two
   numbers, not 32349).
2. An answer holding words that are not in the ground truth, not units and not math function
   names ("42 and above", "3 or more") is wrong (:func:`unexpected_words`); so is arithmetic left
   undone against an integer ground truth ("2 + 6 + 4 + 1 + 1 + 8" for 22, ``\\frac{50}{2}`` for
   25: :func:`unevaluated_arithmetic`), which a policy learned to write on a task that asks for a
   sum (restating the question).
3. Anything else goes through math-verify (``parse`` + ``verify``), with the answer wrapped in
   ``$...$`` (math-verify's LaTeX extractor ignores bare LaTeX such as ``2\\sqrt{3}``). Its own
   unit removal is off: it drops any trailing word of an open list ("ab", "c", "t", "more") and, in
   0.9.0, cuts ``12 + \\frac{1}{\\mathrm{e}}`` to ``12 + \\frac{1}{``, reading 12; here only the
   closed list of units is removed (:data:`reasonrl.answers.UNIT_WORDS`), and an answer it still
   reads only in part (unbalanced braces in what it read) is not credited.

The functions here call math-verify with its own timeout *disabled*: its timeout is based on
``signal.alarm``, which only works in the main thread of the main interpreter. They therefore run
anywhere (threads included) but can take unbounded time on a pathological answer. For training,
use :class:`reasonrl.rewards.RewardScorer`, which runs the math-verify step in worker processes
with a per-item timeout.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Literal

from reasonrl.answers import DEGREE_MARK, parse_integer
from reasonrl.rewards.extract import extract_answer

__all__ = [
    "CORRECT_REWARD",
    "WRONG_REWARD",
    "Score",
    "ScoreStatus",
    "answers_equivalent",
    "decide_by_rule",
    "unexpected_words",
    "unevaluated_arithmetic",
    "integer_equivalent",
    "math_reward",
    "math_verify_equivalent",
    "normalize_answer",
    "score",
]

CORRECT_REWARD = 1.0
WRONG_REWARD = -1.0

ScoreStatus = Literal["ok", "no_answer", "timeout", "error"]


@dataclass(frozen=True)
class Score:
    """The reward of one response and how it was decided.

    Attributes:
        reward: +1.0 when the extracted answer is equivalent to the ground truth, else -1.0.
        correct: ``reward > 0``; what dynamic sampling and accuracy metrics should use.
        extracted: the extracted final answer, None when the response gives none.
        status: "ok" (decided), "no_answer" (nothing to extract), "timeout" (the verifier ran past
            its time limit), "error" (the verifier raised or its worker process died). Everything
            but "ok" scores -1.
    """

    reward: float
    correct: bool
    extracted: str | None
    status: ScoreStatus = "ok"

    @classmethod
    def decided(cls, extracted: str | None, correct: bool) -> Score:
        return cls(CORRECT_REWARD if correct else WRONG_REWARD, bool(correct), extracted, "ok")

    @classmethod
    def failed(cls, extracted: str | None, status: ScoreStatus) -> Score:
        return cls(WRONG_REWARD, False, extracted, status)


#: Words an answer may hold besides the ground truth's own words and units (``reasonrl.answers.UNIT_WORDS``).
MATH_WORDS = frozenset("sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln lg exp min max gcd lcm mod pmod "
                       "det dim lim inf sup infty infinity".split())
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
# Environment names ("\begin{bmatrix}", "\begin{array}{cc}") are markup, not words.
_ENVIRONMENT = re.compile(r"\\begin\s*\{[a-zA-Z*]*\}(?:\s*\{[lcr|\s]*\})?|\\end\s*\{[a-zA-Z*]*\}")
_WORD = re.compile(r"[a-zA-Z]{2,}")
_LETTER = re.compile(r"[a-zA-Z]")

# A style command around one letter is that letter: "\mathrm{e}" → "e", "\textbf{A}" → "A".
_STYLED_LETTER = re.compile(
    r"\\(?:mathrm|mathit|mathbf|mathsf|mathnormal|boldsymbol|bm|textrm|textit|textbf|textnormal|text|mbox|operatorname)"
    r"\s*\{\s*([a-zA-Z])\s*\}"
)
_PERCENT_WORD = re.compile(r"(?<![a-zA-Z\\])(?:pct|percentage)(?![a-zA-Z])", re.IGNORECASE)
# "and" / "or" between two items (bare or as "\text{ and }"), with a comma before it or not: a list comma.
_LIST_WORD = re.compile(
    r"(?<=[^\s,{])\s*+,?\s*+(?:\\(?:text|textrm|textnormal|mbox|mathrm)\s*\{\s*(?:and|or)\s*\}|(?<![a-zA-Z\\])(?:and|or)(?![a-zA-Z]))\s*+(?=[^\s}])"
)
# A comma followed by blank space between digits: a list ("32, 349"), never a thousands separator.
_LIST_COMMA = re.compile(r"\d\s*,\s+[-+−]?\d")


def normalize_answer(text: str) -> str:
    """``text`` with what reads the same spelled one way: a style command around one letter is the
    letter (``\\mathrm{e}`` → ``e``; math-verify 0.9.0 stops reading at ``\\mathrm{e}``),
    ``pct`` / ``percentage`` are ``percent`` (a unit, like ``\\%``: ``28 pct`` is 28), and
    ``and`` / ``or`` between two items is a list comma (``19, 46, and 82`` → ``19, 46, 82``).

    >>> normalize_answer("1 - \\\\frac{1}{\\\\mathrm{e}}"), normalize_answer("28 pct"), normalize_answer("1 \\\\text{ and } 2")
    ('1 - \\\\frac{1}{e}', '28 percent', '1, 2')
    """
    text = _STYLED_LETTER.sub(r"\1", text)
    text = _PERCENT_WORD.sub("percent", text)
    return _LIST_WORD.sub(", ", text)


def unexpected_words(pred: str, ground_truth: str | int) -> list[str]:
    """Words of ``pred`` (runs of 2+ letters outside LaTeX commands and environment names) that are
    neither in the ground truth, nor units, nor math function names, nor products of the ground
    truth's own letters ("2ba" for "2ab"): "42 and above" → ["and", "above"].

    math-verify alone is lenient here (it accepts "3 or more" for 3, "42 apples" for 42), a
    reward-hacking surface; DAPO's own scorer compares normalised strings and rejects them too.
    """
    from reasonrl.answers import UNIT_WORDS

    def bare(text: str) -> str:
        return _LATEX_COMMAND.sub(" ", _ENVIRONMENT.sub(" ", text))

    gt = bare(str(ground_truth))
    allowed = MATH_WORDS | UNIT_WORDS | {w.lower() for w in _WORD.findall(gt)}
    letters = set(_LETTER.findall(gt))
    return [w for w in _WORD.findall(bare(pred)) if w.lower() not in allowed and not set(w) <= letters]


# An operation left to do: a binary operator between two numbers (or bracketed groups), or a
# command that computes. A sign before a number ("-7", "(-7)") has no number before it.
_OPERATION = re.compile(
    r"[\d)\]}]\s*+(?:[-+*/^×÷·−]|\\(?:times|cdot|div|ast)(?![a-zA-Z]))\s*+[\d(\[{\\]"
    r"|\\[dt]?frac(?![a-zA-Z])|\\sqrt(?![a-zA-Z])|\\binom(?![a-zA-Z])|\\choose(?![a-zA-Z])|\d\s*!"
)
# A degree mark is a unit, not a power: "14^\circ", "14^{\circ}", "14°".
_DEGREES = re.compile(DEGREE_MARK)


def unevaluated_arithmetic(pred: str, ground_truth: str | int) -> bool:
    """True when ``ground_truth`` spells an integer and ``pred`` is arithmetic left to do: what
    follows its last "=" holds an operation between numbers ("2 + 6 + 4 + 1 + 1 + 8" for 22,
    ``\\frac{50}{2}`` or "50/2" for 25, "2^4" for 16, ``\\sqrt{196}`` for 14). math-verify
    evaluates such an answer and credits it; DAPO's scorer compares normalised strings (keeping
    what follows the last "=", Minerva's normalisation) and does not, and on a task whose question
    is a sum, restating the question is then a reward hack that RL finds (the VC-PPO ladder's
    ``value-pretraining`` seed 2 did, 2026-12-07). An equation's result stays an answer: "2 + 9 + 3
    = 14" is 14, as DAPO reads it; a unit's power ("15 \\text{ cm}^2") and a degree mark are no
    operation.

    >>> unevaluated_arithmetic("9 + 2 + 3", 14), unevaluated_arithmetic("9 + 2 + 3 = 14", 14), unevaluated_arithmetic("-14", -14)
    (True, False, False)
    """
    if parse_integer(ground_truth) is None:
        return False  # (a symbolic ground truth is itself an expression: math-verify decides)
    value = _DEGREES.sub(" ", _strip_units(str(pred).split("=")[-1].strip()))
    return bool(_OPERATION.search(value))


def decide_by_rule(pred: str, ground_truth: str | int) -> bool | None:
    """The decision that needs no verifier: integers compare as integers; an answer with words
    the ground truth does not have (:func:`unexpected_words`), or arithmetic left undone against an
    integer ground truth (:func:`unevaluated_arithmetic`), is wrong. None: ask math-verify (also
    when the rule itself fails on an odd string: it never raises, every caller can rely on it)."""
    try:
        pred, ground_truth = normalize_answer(pred), normalize_answer(str(ground_truth))
        as_int = integer_equivalent(pred, ground_truth)
        if as_int is not None:
            return as_int
        if unevaluated_arithmetic(pred, ground_truth):
            return False
        return False if unexpected_words(pred, ground_truth) else None
    except Exception:  # noqa: BLE001 - the verifier pool decides what the rule cannot
        return None


def integer_equivalent(pred: str, ground_truth: str | int) -> bool | None:
    """True/False when both sides spell integers (compared as integers), None otherwise. A comma
    followed by a space separates a list ("32, 349", "1, 300"): not an integer."""
    if _LIST_COMMA.search(str(pred)) or _LIST_COMMA.search(str(ground_truth)):
        return None
    p = parse_integer(pred)
    if p is None:
        return None
    g = parse_integer(ground_truth)
    if g is None:
        return None
    return p == g


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its timeout is disabled; here that is on purpose (module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


_mv_cache: dict[str, Any] = {}


def _math_verify() -> dict[str, Any]:
    """Import math-verify lazily (about a second) and configure it once."""
    if not _mv_cache:
        from latex2sympy2_extended.math_normalization import NormalizationConfig
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
        _mv_cache.update(
            parse=parse,
            verify=verify,
            # math-verify's defaults but units=False: its unit removal drops any trailing word of an
            # open list ("2ab" reads as 2, "x+2c" as x+2) and cuts "\\frac{1}{\\text{e}}" short
            config=[
                LatexExtractionConfig(
                    normalization_config=NormalizationConfig(
                        basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all", equations=False
                    )
                ),
                ExprExtractionConfig(),
            ],
        )
    return _mv_cache


def _as_math(text: str) -> str:
    """``text`` as one inline-math expression ``$...$`` (outer delimiters replaced, not doubled)."""
    s = text.strip()
    if s.endswith(".") and not s.endswith("..."):
        s = s[:-1].rstrip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left) : len(s) - len(right)].strip()
            break
    return f"${_strip_units(s)}$"


def _strip_units(text: str) -> str:
    """``text`` without a trailing unit: a ``\\text{...}`` / ``\\mbox{...}`` group of words at the
    very end (``\\frac{1}{3}\\text{ meters}``, ``15\\mbox{ cm}^2``; an answer's words were checked
    before, :func:`unexpected_words`; a group with digits or math in it, ``42 \\text{43}``, stays), or a unit of the closed list written plainly (``2.5 cm``); a bare
    one-letter unit ("m", "s") stays, it may be a variable. math-verify's own removal (off here) also
    drops words of an open list ("2ab" → 2) and groups that do not end the answer
    (``\\frac{1}{\\text{e}}`` → ``\\frac{1}{``)."""
    for _ in range(2):
        # (only the tail is searched: a unit is short, and the pattern is quadratic on long blank runs)
        head, tail = text[:-_UNIT_TAIL], text[-_UNIT_TAIL:]
        stripped = (head + _units_regex().sub("", tail)).rstrip()
        if not stripped or stripped == text:
            break
        text = stripped
    return text


_UNIT_TAIL = 200


_units_cache: list[re.Pattern[str]] = []


def _units_regex() -> re.Pattern[str]:
    if not _units_cache:
        from reasonrl.answers import UNIT_WORDS

        long_words = "|".join(sorted((w for w in UNIT_WORDS if len(w) > 1), key=len, reverse=True))
        phrase = r"(?:(?:square|sq|cubic)\s+)?(?:{u})\.?(?:\s+per\s+(?:{u})\.?)?".format(u=long_words)
        power = r"(?:\^\{?[23]\}?)?"
        _units_cache.append(re.compile(
            r"(?:\s*\\(?:text|textbf|textit|textrm|textnormal|mbox|mathrm)\s*\{[a-zA-Z\s./]*\}"
            r"|(?<=\s)" + phrase + r"(?![a-zA-Z]))" + power + r"\s*$",
            re.IGNORECASE,
        ))
    return _units_cache[0]


def _read_in_full(parsed: list[Any]) -> bool:
    """False when what math-verify read (the string it returns) has unbalanced braces: it stopped
    reading inside a group, and its value is that of a prefix."""
    return all(s.count("{") == s.count("}") for s in parsed if isinstance(s, str))


def _parse(text: str) -> list[Any]:
    mv = _math_verify()
    text = normalize_answer(text)
    parsed = mv["parse"](_as_math(text), extraction_config=mv["config"], parsing_timeout=None)
    if not parsed:  # e.g. plain text that is not valid LaTeX: let the expression extractor try
        parsed = mv["parse"](text, extraction_config=mv["config"], parsing_timeout=None)
    return list(parsed) if _read_in_full(list(parsed)) else []


def math_verify_equivalent(pred: str, ground_truth: str | int) -> bool:
    """math-verify's judgement of ``pred`` against ``ground_truth``, without any timeout.

    No signal is used, so this works in any thread; it may run for a very long time on a
    pathological answer (see :class:`reasonrl.rewards.RewardScorer` for the bounded version).
    """
    mv = _math_verify()
    gold = _parse(str(ground_truth))
    target = _parse(pred)
    if not gold or not target:
        return False
    return bool(mv["verify"](gold, target, timeout_seconds=None))


def answers_equivalent(pred: str, ground_truth: str | int) -> bool:
    """Whether answer ``pred`` is equivalent to ``ground_truth`` (integers first, then math-verify).

    >>> answers_equivalent("025", "25"), answers_equivalent("3,000", 3000)
    (True, True)
    """
    rule = decide_by_rule(pred, ground_truth)
    if rule is not None:
        return rule
    return math_verify_equivalent(pred, ground_truth)


def score(response: str, ground_truth: str | int) -> Score:
    """Score one response in this process (no timeout: see the module doc)."""
    extracted = extract_answer(response)
    if extracted is None:
        return Score.failed(None, "no_answer")
    try:
        ok = answers_equivalent(extracted, ground_truth)
    except Exception:  # noqa: BLE001 - a verifier crash scores the response as wrong
        logging.getLogger(__name__).debug("verifier error", exc_info=True)
        return Score.failed(extracted, "error")
    return Score.decided(extracted, ok)


def math_reward(response: str, ground_truth: str | int) -> float:
    """DAPO's outcome reward: +1.0 if the response's final answer is equivalent, else -1.0."""
    return score(response, ground_truth).reward
