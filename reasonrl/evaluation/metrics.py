"""Evaluation metrics over n samples per problem: avg@n, pass@k, maj@n, with bootstrap CIs.

Inputs are per problem, one list per problem, one entry per sample:

- ``correct[p][j]``: whether sample j of problem p was judged correct;
- ``answers[p][j]``: its extracted final answer (None when it gave none);
- ``ground_truths[p]``: the problem's reference answer.

Every metric is a mean over problems of a per-problem value, so its uncertainty is estimated by a
percentile bootstrap over problems (:func:`bootstrap_ci`). Pure Python, no heavy imports.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from reasonrl.answers import parse_integer, strip_answer

__all__ = [
    "avg_at_n",
    "bootstrap_ci",
    "majority_vote",
    "maj_at_n",
    "pass_at_k",
    "pass_at_k_mean",
    "per_problem_accuracy",
    "per_problem_maj",
    "per_problem_pass_at_k",
    "summarize",
]

EqualFn = Callable[[str, str], bool]


def _check(correct: Sequence[Sequence[bool]]) -> None:
    if len(correct) == 0:
        raise ValueError("no problems: the metric of an empty evaluation is undefined")
    for p, samples in enumerate(correct):
        if len(samples) == 0:
            raise ValueError(f"problem {p} has no samples")


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


# --------------------------------------------------------------------------------------------
# avg@n and pass@k


def per_problem_accuracy(correct: Sequence[Sequence[bool]]) -> list[float]:
    """The fraction of correct samples of each problem."""
    _check(correct)
    return [sum(bool(c) for c in samples) / len(samples) for samples in correct]


def avg_at_n(correct: Sequence[Sequence[bool]]) -> float:
    """avg@n: the mean accuracy over all samples (DAPO's AIME metric; = pass@1 from n samples).

    Computed as the mean over problems of each problem's accuracy, which is the mean over all
    samples when every problem has the same n (and weighs problems equally when they do not).
    """
    return _mean(per_problem_accuracy(correct))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained on
    Code"): the probability that at least one of k samples drawn without replacement from n
    samples, c of them correct, is correct.

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

    computed in the product form (no huge binomials). 1.0 when n - c < k (every k-subset holds a
    correct sample); 0.0 when c = 0. pass@1 = c / n (= avg@n).

    Raises:
        ValueError: k < 1, n < 1, c < 0, k > n or c > n.
    """
    if n < 1 or k < 1 or c < 0:
        raise ValueError(f"need n >= 1, k >= 1, c >= 0; got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"k ({k}) cannot exceed the number of samples n ({n})")
    if c > n:
        raise ValueError(f"c ({c}) cannot exceed the number of samples n ({n})")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def per_problem_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> list[float]:
    """Each problem's unbiased pass@k estimate (k must not exceed any problem's n)."""
    _check(correct)
    out = []
    for p, samples in enumerate(correct):
        n = len(samples)
        if k > n:
            raise ValueError(f"pass@{k} needs at least {k} samples, problem {p} has {n}")
        out.append(pass_at_k(n, sum(bool(c) for c in samples), k))
    return out


def pass_at_k_mean(correct: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k: the mean over problems of the unbiased estimator ``1 - C(n-c,k)/C(n,k)``."""
    return _mean(per_problem_pass_at_k(correct, k))


# --------------------------------------------------------------------------------------------
# maj@n


def _vote_key(answer: str) -> str:
    """Answers that spell the same integer vote together ("025", "25", "$25$")."""
    as_int = parse_integer(answer)
    if as_int is not None:
        return str(as_int)
    return " ".join(strip_answer(answer).split())


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """The most frequent answer (None answers do not vote), None when nobody voted.

    Integers are normalised before counting, so "025" and "25" count as one answer; ties go to
    the answer whose first occurrence comes first. Returns that first occurrence as written.
    """
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    for a in answers:
        if a is None:
            continue
        key = _vote_key(a)
        if not key:
            continue
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, a)
    if not counts:
        return None
    best = max(counts.values())
    winner = next(key for key in first if counts[key] == best)  # dicts keep insertion order
    return first[winner]


def _default_equal(pred: str, ground_truth: str) -> bool:
    """Integers as integers, anything else as normalised strings (no math-verify here)."""
    a, b = parse_integer(pred), parse_integer(ground_truth)
    if a is not None and b is not None:
        return a == b
    return _vote_key(pred) == _vote_key(str(ground_truth))


def per_problem_maj(
    answers: Sequence[Sequence[str | None]],
    ground_truths: Sequence[Any],
    equal: EqualFn | None = None,
) -> list[float]:
    """1.0 for each problem whose majority answer equals its ground truth, else 0.0."""
    if len(answers) != len(ground_truths):
        raise ValueError(f"{len(answers)} problems of answers but {len(ground_truths)} ground truths")
    if len(answers) == 0:
        raise ValueError("no problems: the metric of an empty evaluation is undefined")
    eq = equal or _default_equal
    out = []
    for samples, gt in zip(answers, ground_truths):
        voted = majority_vote(samples)
        out.append(1.0 if voted is not None and eq(voted, str(gt)) else 0.0)
    return out


def maj_at_n(
    answers: Sequence[Sequence[str | None]],
    ground_truths: Sequence[Any],
    equal: EqualFn | None = None,
) -> float:
    """maj@n: the fraction of problems whose majority-voted answer is correct.

    ``equal(voted, ground_truth)`` decides correctness; the default compares integers as integers
    and anything else as normalised strings. Pass ``reasonrl.rewards.answers_equivalent`` for
    math-verify equivalence.
    """
    return _mean(per_problem_maj(answers, ground_truths, equal))


# --------------------------------------------------------------------------------------------
# Confidence intervals and the summary


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of sorted values (numpy's default method)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_ci(
    per_problem_values: Sequence[float],
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``per_problem_values`` (resampling problems).

    Draws ``n_boot`` resamples of the problems with replacement and returns the ``alpha/2`` and
    ``1 - alpha/2`` quantiles of their means. Deterministic for a given ``seed``.
    """
    m = len(per_problem_values)
    if m == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    values = [float(v) for v in per_problem_values]
    rng = random.Random(seed)
    means = sorted(math.fsum(rng.choices(values, k=m)) / m for _ in range(n_boot))
    return _quantile(means, alpha / 2), _quantile(means, 1 - alpha / 2)


def summarize(
    correct: Sequence[Sequence[bool]],
    answers: Sequence[Sequence[str | None]] | None = None,
    ground_truths: Sequence[Any] | None = None,
    ks: Sequence[int] | None = None,
    equal: EqualFn | None = None,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """avg@n, pass@k (each k of ``ks`` with k <= n; default 1, 8, n) and maj@n, with CIs.

    ``n`` is the smallest number of samples of any problem. maj@n needs ``answers`` and
    ``ground_truths``; it is left out without them. Returns, e.g. for n = 32::

        {"avg@32": {"value": 0.41, "ci": [0.30, 0.52]},
         "pass@1": {...}, "pass@8": {...}, "pass@32": {...}, "maj@32": {...}}
    """
    _check(correct)
    n = min(len(samples) for samples in correct)
    wanted = (1, 8, n) if ks is None else tuple(ks)
    valid_ks = sorted({int(k) for k in wanted if 1 <= int(k) <= n})

    def entry(values: list[float]) -> dict[str, Any]:
        lo, hi = bootstrap_ci(values, n_boot=n_boot, alpha=alpha, seed=seed)
        return {"value": _mean(values), "ci": [lo, hi]}

    out: dict[str, dict[str, Any]] = {f"avg@{n}": entry(per_problem_accuracy(correct))}
    for k in valid_ks:
        out[f"pass@{k}"] = entry(per_problem_pass_at_k(correct, k))
    if answers is not None and ground_truths is not None:
        if len(answers) != len(correct):
            raise ValueError(f"{len(answers)} problems of answers but {len(correct)} of correctness")
        out[f"maj@{n}"] = entry(per_problem_maj(answers, ground_truths, equal))
    return out
