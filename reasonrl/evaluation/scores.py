"""Evaluation metrics over n samples per problem: avg@n, pass@k, maj@n, with bootstrap CIs.

Inputs are per problem, one list per problem, one entry per sample:

- ``correct[p][j]``: whether sample j of problem p was judged correct;
- ``answers[p][j]``: its extracted final answer (None when it gave none);
- ``ground_truths[p]``: the problem's reference answer.

Every metric is a mean over problems of a per-problem value, so its uncertainty is estimated by a
percentile bootstrap over problems (:func:`bootstrap_ci`). A problem is one distinct problem:
``reasonrl eval`` merges replicated rows before sampling.

maj@n groups votes with the reward's equivalence (``equal``, :data:`EqualFn`). Pure Python; the
default ``equal`` (:func:`reward_equal`) imports math-verify on first use and runs it in this
process, no worker process is started by this module.
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
    "majority_votes",
    "maj_at_n",
    "pass_at_k",
    "pass_at_k_mean",
    "per_problem_accuracy",
    "per_problem_maj",
    "per_problem_pass_at_k",
    "per_problem_values",
    "reward_equal",
    "vote_classes",
    "with_cis",
    "metrics_by_source",
    "flat_metrics",
    "paired_difference",
]

Pair = tuple[str, str]
EqualFn = Callable[[Sequence[Pair]], Sequence["bool | None"]]
"""Decides a batch of answer pairs ``(a, b)``: True (equivalent), False, or None (undecided: a
verifier timeout or error), one verdict per pair, in order. Batched so that a caller can run the
comparisons in a process pool (``RewardScorer.equivalent`` has this signature)."""


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


def reward_equal(pairs: Sequence[Pair]) -> list[bool | None]:
    """The default ``equal``: the reward's notion of "the same answer", in this process.

    ``reasonrl.rewards.answers_equivalent`` for each pair (integers as integers, anything else
    through math-verify); a verifier error is None (undecided). No time limit: ``reasonrl eval``
    passes the reward scorer's pool-backed ``RewardScorer.equivalent`` (same rule, a per-pair
    timeout) instead. math-verify is imported on the first call that needs it.
    """
    from reasonrl.rewards.verify import answers_equivalent

    out: list[bool | None] = []
    for a, b in pairs:
        try:
            out.append(answers_equivalent(a, b))
        except Exception:  # noqa: BLE001 - a verifier crash decides nothing
            out.append(None)
    return out


def _vote_key(answer: str) -> str:
    """Answers that spell the same integer or the same text are one vote from the start."""
    as_int = parse_integer(answer)
    if as_int is not None:
        return str(as_int)
    return " ".join(strip_answer(answer).split())


def vote_classes(answers: Sequence[Sequence[str | None]], equal: EqualFn | None = None) -> list[list[tuple[str, int]]]:
    """Each problem's votes grouped into equivalence classes: ``(representative, votes)`` per class,
    in the order of each class's first vote.

    A vote is an answer that is not None and not blank. Answers that spell the same integer
    ("025", "25", "$25$") or the same text (up to ``$`` delimiters and whitespace) are one vote
    from the start. Then each distinct answer, in the order of its first vote, joins the first
    class whose representative (the class's first vote, as written) ``equal`` finds equivalent to
    it (asked as ``(answer, representative)``; None counts as not equivalent), or opens a new
    class. ``equal`` is asked one round at a time, for every problem at once: the next distinct
    answer of each problem against each of that problem's classes.
    """
    eq = equal or reward_equal
    todo: list[list[tuple[str, int]]] = []
    for samples in answers:
        distinct: dict[str, list[Any]] = {}
        for a in samples:
            key = "" if a is None else _vote_key(a)
            if key:
                distinct.setdefault(key, [a, 0])[1] += 1
        todo.append([(a, votes) for a, votes in distinct.values()])
    classes: list[list[list[Any]]] = [[] for _ in todo]
    for r in range(max(map(len, todo), default=0)):
        asks = [(p, c) for p, t in enumerate(todo) if r < len(t) for c in range(len(classes[p]))]
        verdicts = list(eq([(todo[p][r][0], classes[p][c][0]) for p, c in asks])) if asks else []
        if len(verdicts) != len(asks):
            raise ValueError(f"equal answered {len(verdicts)} of {len(asks)} pairs")
        joined: dict[int, int] = {}
        for (p, c), same in zip(asks, verdicts):
            if same is True:
                joined.setdefault(p, c)
        for p, t in enumerate(todo):
            if r < len(t):
                if p in joined:
                    classes[p][joined[p]][1] += t[r][1]
                else:
                    classes[p].append(list(t[r]))
    return [[(rep, votes) for rep, votes in cls] for cls in classes]


def majority_votes(answers: Sequence[Sequence[str | None]], equal: EqualFn | None = None) -> list[str | None]:
    """Each problem's majority answer (:func:`majority_vote`), ``equal`` asked in batches over all problems."""
    return [max(cls, key=lambda c: c[1])[0] if cls else None for cls in vote_classes(answers, equal)]


def majority_vote(answers: Sequence[str | None], equal: EqualFn | None = None) -> str | None:
    """The answer of the largest equivalence class of votes (:func:`vote_classes`), None when
    nobody voted.

    Equivalence is the reward's (``equal``, default :func:`reward_equal`): "0.5", "1/2" and
    "\\frac{1}{2}" are one class. Ties go to the class whose first vote came first. Returns the
    winning class's first vote as written.
    """
    return majority_votes([answers], equal)[0]


def per_problem_maj(
    answers: Sequence[Sequence[str | None]],
    ground_truths: Sequence[Any],
    equal: EqualFn | None = None,
) -> list[float]:
    """1.0 for each problem whose majority answer ``equal`` finds equivalent to its ground truth, else 0.0."""
    if len(answers) != len(ground_truths):
        raise ValueError(f"{len(answers)} problems of answers but {len(ground_truths)} ground truths")
    if len(answers) == 0:
        raise ValueError("no problems: the metric of an empty evaluation is undefined")
    eq = equal or reward_equal
    voted = majority_votes(answers, eq)
    asks = [p for p, v in enumerate(voted) if v is not None]
    verdicts = dict(zip(asks, eq([(voted[p], str(ground_truths[p])) for p in asks]))) if asks else {}
    return [1.0 if verdicts.get(p) is True else 0.0 for p in range(len(answers))]


def per_problem_maj_by_reward(
    correct: Sequence[Sequence[bool]],
    answers: Sequence[Sequence[str | None]],
    equal: EqualFn | None = None,
) -> list[float]:
    """maj@n under a reward plug-in (``--reward FILE.py:FUNCTION``), whose ground truth need not be
    an answer to compare: the votes are the extracted answers as always (:func:`majority_votes`),
    and a problem scores 1.0 when the first response that voted for the winning answer is correct
    (its reward > 0); 0.0 when nobody voted."""
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} problems of answers but {len(correct)} of correctness")
    voted = majority_votes(answers, equal or reward_equal)
    return [0.0 if v is None else float(bool(c[list(a).index(v)])) for c, a, v in zip(correct, answers, voted)]


def maj_at_n(
    answers: Sequence[Sequence[str | None]],
    ground_truths: Sequence[Any],
    equal: EqualFn | None = None,
) -> float:
    """maj@n: the fraction of problems whose majority-voted answer is correct.

    Votes are grouped and the winner judged with one notion of "the same answer", ``equal``: by
    default the reward's (:func:`reward_equal`: integers as integers, else math-verify), the one
    avg@n and pass@k are scored with.
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


def two_level_bootstrap_ci(
    per_run_values: Sequence[Sequence[float]],
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over runs of each run's mean over problems, resampling
    at both levels: the runs (seeds) with replacement, then each drawn run's problems.

    ``per_run_values[s][p]`` is run s's value on problem p (the runs may hold different problems).
    The statistic is ``mean_s mean_p``; each resample draws k runs of the k, then for each drawn run
    its m_s problems of the m_s. Unlike :func:`bootstrap_ci` over the pooled (run, problem) values,
    the interval carries the spread between training runs, not only the problems' (with 3 runs it
    still rests on 3 draws: read the per-run values beside it). Deterministic for a given ``seed``.
    """
    runs = [[float(v) for v in r] for r in per_run_values]
    if not runs or any(not r for r in runs):
        raise ValueError("two_level_bootstrap_ci needs at least one run, each with at least one value")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rng = random.Random(seed)
    k = len(runs)
    means = []
    for _ in range(n_boot):
        drawn = rng.choices(runs, k=k)
        means.append(math.fsum(math.fsum(rng.choices(r, k=len(r))) / len(r) for r in drawn) / k)
    means.sort()
    return _quantile(means, alpha / 2), _quantile(means, 1 - alpha / 2)


def per_problem_values(
    correct: Sequence[Sequence[bool]],
    answers: Sequence[Sequence[str | None]] | None = None,
    ground_truths: Sequence[Any] | None = None,
    ks: Sequence[int] | None = None,
    equal: EqualFn | None = None,
    maj_by_reward: bool = False,
) -> dict[str, list[float]]:
    """Each metric's value per problem: avg@n, pass@k (each k of ``ks`` with k <= n; default 1, 8,
    n) and maj@n (only with ``answers`` and ``ground_truths``), in that order. ``maj_by_reward``
    (a reward plug-in): the winning answer is judged by its response's reward
    (:func:`per_problem_maj_by_reward`), not by equivalence to the ground truth.

    ``n`` is the smallest number of samples of any problem.
    """
    _check(correct)
    n = min(len(samples) for samples in correct)
    wanted = (1, 8, n) if ks is None else tuple(ks)
    out = {f"avg@{n}": per_problem_accuracy(correct)}
    for k in sorted({int(k) for k in wanted if 1 <= int(k) <= n}):
        out[f"pass@{k}"] = per_problem_pass_at_k(correct, k)
    if answers is not None and ground_truths is not None:
        if len(answers) != len(correct):
            raise ValueError(f"{len(answers)} problems of answers but {len(correct)} of correctness")
        out[f"maj@{n}"] = (per_problem_maj_by_reward(correct, answers, equal) if maj_by_reward
                           else per_problem_maj(answers, ground_truths, equal))
    return out


def with_cis(
    values: dict[str, Sequence[float]],
    problems: Sequence[int] | None = None,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Each metric's mean over problems with its bootstrap CI (over those problems):
    ``{"avg@32": {"value": 0.41, "ci": [0.30, 0.52]}, ...}``.

    ``values`` comes from :func:`per_problem_values`; ``problems`` picks a subset of the problems
    by index (a data source, say), all of them when None.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, per_problem in values.items():
        v = [float(per_problem[i]) for i in problems] if problems is not None else [float(x) for x in per_problem]
        lo, hi = bootstrap_ci(v, n_boot=n_boot, alpha=alpha, seed=seed)
        out[name] = {"value": _mean(v), "ci": [lo, hi]}
    return out


def metrics_by_source(
    values: dict[str, Sequence[float]],
    sources: Sequence[str],
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Each metric with its bootstrap CI over all problems, and the same per data source
    (``sources[p]``: problem p's source): ``(metrics, {source: {"problems": k, "metrics": ...}})``."""
    by: dict[str, list[int]] = {}
    for i, src in enumerate(sources):
        by.setdefault(src, []).append(i)
    overall = with_cis(values, n_boot=n_boot, seed=seed)
    return overall, {src: {"problems": len(idx), "metrics": with_cis(values, idx, n_boot=n_boot, seed=seed)} for src, idx in sorted(by.items())}


def flat_metrics(metrics: dict[str, dict[str, Any]], by_source: dict[str, dict[str, Any]] | None = None, prefix: str = "val") -> dict[str, float]:
    """Scalars for metrics.jsonl and the trackers: ``<prefix>/<metric>`` with ``_ci_low`` /
    ``_ci_high``, and ``<prefix>/<source>/<metric>`` per data source."""
    out: dict[str, float] = {}
    for pre, ms in [(prefix, metrics)] + [(f"{prefix}/{src}", m.get("metrics", m)) for src, m in (by_source or {}).items()]:
        for k, v in ms.items():
            out[f"{pre}/{k}"] = v["value"]
            out[f"{pre}/{k}_ci_low"], out[f"{pre}/{k}_ci_high"] = v["ci"]
    return out


def paired_difference(after: Sequence[float], before: Sequence[float], n_boot: int = 1000, alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """The mean over problems of ``after[p] − before[p]`` (two evaluations of the same problems)
    with its percentile-bootstrap interval: the problems are resampled, each keeping its pair, so
    the problems' difficulty cancels (far narrower than comparing two separate intervals)."""
    if len(after) != len(before) or not after:
        raise ValueError(f"a paired difference needs the same problems: {len(after)} vs {len(before)}")
    d = [float(a) - float(b) for a, b in zip(after, before)]
    lo, hi = bootstrap_ci(d, n_boot=n_boot, alpha=alpha, seed=seed)
    return {"value": _mean(d), "ci": [lo, hi], "problems": len(d)}
