"""Answer equivalence and the rule-based outcome reward (DAPO eq. 7: +1 correct, -1 otherwise).

Equivalence is decided in three steps:

1. Both sides spell an integer (``reasonrl.answers.parse_integer``: "025", "3,000", "$540$",
   "540 dollars", a closed list of units): compare the integers, and stop. Nearly every
   DAPO-Math-17K item ends here.
2. An answer holding words that are not in the ground truth, not units and not math function
   names ("42 and above", "3 or more") is wrong (:func:`unexpected_words`).
3. Anything else goes through math-verify (``parse`` + ``verify``), with the answer wrapped in
   ``$...$`` (math-verify's LaTeX extractor ignores bare LaTeX such as ``2\\sqrt{3}``).

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

from reasonrl.answers import parse_integer
from reasonrl.rewards.extract import extract_answer

__all__ = [
    "CORRECT_REWARD",
    "WRONG_REWARD",
    "Score",
    "ScoreStatus",
    "answers_equivalent",
    "decide_by_rule",
    "unexpected_words",
    "integer_equivalent",
    "math_reward",
    "math_verify_equivalent",
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
_WORD = re.compile(r"[a-zA-Z]{2,}")


def unexpected_words(pred: str, ground_truth: str | int) -> list[str]:
    """Words of ``pred`` (runs of 2+ letters outside LaTeX commands) that are neither in the ground
    truth, nor units, nor math function names: "42 and above" → ["and", "above"].

    math-verify alone is lenient here (it accepts "3 or more" for 3, "42 apples" for 42), a
    reward-hacking surface; DAPO's own scorer compares normalised strings and rejects them too.
    """
    from reasonrl.answers import UNIT_WORDS

    allowed = MATH_WORDS | UNIT_WORDS | {w.lower() for w in _WORD.findall(str(ground_truth))}
    return [w for w in _WORD.findall(_LATEX_COMMAND.sub(" ", pred)) if w.lower() not in allowed]


def decide_by_rule(pred: str, ground_truth: str | int) -> bool | None:
    """The decision that needs no verifier: integers compare as integers; an answer with words
    the ground truth does not have (:func:`unexpected_words`) is wrong. None: ask math-verify
    (also when the rule itself fails on an odd string: it never raises, every caller can rely on it)."""
    try:
        as_int = integer_equivalent(pred, ground_truth)
        if as_int is not None:
            return as_int
        return False if unexpected_words(pred, ground_truth) else None
    except Exception:  # noqa: BLE001 - the verifier pool decides what the rule cannot
        return None


def integer_equivalent(pred: str, ground_truth: str | int) -> bool | None:
    """True/False when both sides spell integers (compared as integers), None otherwise."""
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
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
        _mv_cache.update(
            parse=parse,
            verify=verify,
            config=[LatexExtractionConfig(), ExprExtractionConfig()],
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
    return f"${s}$"


def _parse(text: str) -> list[Any]:
    mv = _math_verify()
    parsed = mv["parse"](_as_math(text), extraction_config=mv["config"], parsing_timeout=None)
    if not parsed:  # e.g. plain text that is not valid LaTeX: let the expression extractor try
        parsed = mv["parse"](text, extraction_config=mv["config"], parsing_timeout=None)
    return list(parsed)


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
