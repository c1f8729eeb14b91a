"""Evaluation metrics over n samples per problem: avg@n, pass@k, maj@n, with bootstrap CIs.

Inputs are per problem, one list per problem, one entry per sample:

- ``correct[p][j]``: whether sample j of problem p was judged correct;
- ``answers[p][j]``: its extracted final answer (None when it gave none);
- ``ground_truths[p]``: the problem's reference answer.

Every metric is a mean over problems of a per-problem value, so its uncertainty is estimated by a
percentile bootstrap over problems (:func:`bootstrap_ci`). A problem is one distinct problem:
``reasonrl eval`` merges replicated rows before sampling. Over several training runs (seeds) scored
on the same problems, a crossed design (``reasonrl ablate``), :func:`crossed_mean_ci` is the
interval whose coverage is checked for that design (``tests/evaluation/test_interval_coverage.py``).

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
    "crossed_mean_ci",
    "crossed_variance",
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
    "student_t_quantile",
    "two_level_bootstrap_ci",
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

    For the *nested* design only: each run scored on its own draw of problems.
    ``per_run_values[s][p]`` is run s's value on problem p (the runs may hold different problems).
    When every run is scored on the same problems (a crossed design, ``reasonrl ablate``'s), a
    problem's difficulty is shared by all the runs, and drawing the problems afresh for each run
    averages that shared part away: the interval is too narrow (76.5–87.0% coverage at a nominal 95%
    in ``bench/interval_coverage.py``'s simulation); use :func:`crossed_mean_ci` there.
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


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for i in range(1, 1000):
        m2 = 2 * i
        for num in (i * (b - i) * x / ((a + m2 - 1.0) * (a + m2)), -(a + i) * (a + b + i) * x / ((a + m2) * (a + m2 + 1.0))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t distribution with ``df`` degrees of freedom (``df`` need not be
    an integer: Satterthwaite's are not). Pure Python: the CDF from the regularized incomplete beta
    function, ``P(T <= t) = 1 - I_{df/(df+t²)}(df/2, 1/2) / 2`` for t >= 0, inverted by bisection
    to about 1e-12 relative. ``df = inf`` gives the normal quantile.

    Raises:
        ValueError: q not in (0, 1) or df <= 0.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    if math.isinf(df):
        from statistics import NormalDist

        return NormalDist().inv_cdf(q)
    if q < 0.5:
        return -student_t_quantile(1.0 - q, df)
    tail = 1.0 - q  # P(T > t) = I_{df/(df+t²)}(df/2, 1/2) / 2

    def upper(t: float) -> float:
        return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))

    lo, hi = 0.0, 1.0
    while upper(hi) > tail:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if upper(mid) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def _matrix(values: Sequence[Sequence[float]], name: str) -> list[list[float]]:
    rows = [[float(v) for v in r] for r in values]
    if not rows or not rows[0]:
        raise ValueError(f"{name} needs at least one run with at least one value")
    if any(len(r) != len(rows[0]) for r in rows):
        raise ValueError(f"{name} needs every run scored on the same problems: {sorted({len(r) for r in rows})} values per run")
    return rows


def crossed_variance(values: Sequence[Sequence[float]]) -> tuple[float, float]:
    """The estimated variance of the grand mean of a crossed design, and its degrees of freedom.

    The design: ``values[s][p]`` is run (seed) s's value on problem p, every run scored on the same
    m problems (k runs), both drawn at random from their populations. The model is the two-way
    crossed random-effects one, ``y_sp = μ + a_s + b_p + e_sp`` (run, problem, and their
    interaction confounded with the cell's sampling noise), under which the grand mean
    ``ȳ = mean_s mean_p y_sp`` has

        Var(ȳ) = σ²_a / k + σ²_b / m + σ²_e / (k m).

    With the two-way ANOVA mean squares MS_A = m Σ_s (ȳ_s· − ȳ)² / (k−1) (runs),
    MS_B = k Σ_p (ȳ_·p − ȳ)² / (m−1) (problems) and MS_E = Σ (y_sp − ȳ_s· − ȳ_·p + ȳ)² /
    ((k−1)(m−1)), whose expectations are m σ²_a + σ²_e, k σ²_b + σ²_e and σ²_e,

        V = (MS_A + MS_B − MS_E) / (k m)

    is unbiased for Var(ȳ) (the variance of the mean in generalizability theory's p × s design:
    Brennan 2001, "Generalizability Theory", ch. 5; Searle, Casella & McCulloch 1992, "Variance
    Components", §4). Its degrees of freedom are Satterthwaite's (1946),
    ``V² / Σ_i (c_i MS_i)² / df_i``. V is floored at MS_E / (k m), the interaction's share, which
    the true variance never falls below (it can come out below when MS_A + MS_B < 2 MS_E); the
    degrees of freedom are then MS_E's. With one run (k = 1) the runs' spread cannot be estimated:
    V = MS_B / m over the problems (df m − 1), the run taken as fixed; with one problem (m = 1),
    V = MS_A / k (df k − 1). One value in all: (NaN, NaN).

    Unlike a bootstrap that draws each run's problems afresh (:func:`two_level_bootstrap_ci`,
    which fits the nested design), the problems' main effect enters once, as σ²_b / m, shared by
    all the runs. Unlike the two-way ("pigeonhole") bootstrap (Owen 2007, "The pigeonhole
    bootstrap", Ann. Appl. Stat. 1(2)), which resamples the runs and one shared draw of the problems,
    it does not rest on k draws of the runs' spread: with k = 3 the percentile interval of a
    bootstrap over runs is about the range of the 3 runs, which covers the mean of a
    run-dominated design about 75% of the time; the t quantile with Satterthwaite's df (about
    k − 1 then) widens it (``bench/interval_coverage.py``).
    """
    y = _matrix(values, "crossed_variance")
    k, m = len(y), len(y[0])
    grand = math.fsum(x for r in y for x in r) / (k * m)
    if k * m == 1:
        return math.nan, math.nan
    rm = [math.fsum(r) / m for r in y]
    cm = [math.fsum(y[s][p] for s in range(k)) / k for p in range(m)]
    if k == 1:
        ms_b = k * math.fsum((c - grand) ** 2 for c in cm) / (m - 1)
        return ms_b / (k * m), float(m - 1)
    ms_a = m * math.fsum((r - grand) ** 2 for r in rm) / (k - 1)
    if m == 1:
        return ms_a / (k * m), float(k - 1)
    ms_b = k * math.fsum((c - grand) ** 2 for c in cm) / (m - 1)
    ms_e = math.fsum((y[s][p] - rm[s] - cm[p] + grand) ** 2 for s in range(k) for p in range(m)) / ((k - 1) * (m - 1))
    terms = [(ms_a / (k * m), k - 1), (ms_b / (k * m), m - 1), (-ms_e / (k * m), (k - 1) * (m - 1))]
    v = math.fsum(c for c, _ in terms)
    floor = ms_e / (k * m)
    if v <= floor:
        return floor, float((k - 1) * (m - 1))
    return v, v * v / math.fsum(c * c / d for c, d in terms)


def crossed_mean_ci(
    values: Sequence[Sequence[float]],
    alpha: float = 0.05,
    bounds: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """A (1 − alpha) interval for the mean over runs and problems of a crossed design: every run
    (seed) scored on the same problems, ``values[s][p]`` (``reasonrl ablate``'s rung accuracy).

    ``ȳ ± t_{1−alpha/2, ν} √V`` with V and ν from :func:`crossed_variance` (the two-way
    random-effects variance of the grand mean, Satterthwaite's degrees of freedom), clipped to
    ``bounds`` (e.g. (0, 1) for an accuracy: the truth lies there, so clipping loses no coverage).
    For a paired difference between two ladders' rungs, pass the differences ``after[s][p] −
    before[s][p]`` (paired by run and problem) with bounds (−1, 1): the same design, the
    problems' and the runs' shared parts cancelled. Coverage checked by simulation of the crossed
    design with binary outcomes (``tests/evaluation/test_interval_coverage.py``,
    ``bench/interval_coverage.py``). No resampling: deterministic. With one value in all, the
    interval is ``bounds`` (or infinite): it says nothing.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    y = _matrix(values, "crossed_mean_ci")
    mean = math.fsum(x for r in y for x in r) / (len(y) * len(y[0]))
    v, df = crossed_variance(y)
    if math.isnan(v):
        lo, hi = -math.inf, math.inf
    else:
        h = student_t_quantile(1.0 - alpha / 2.0, df) * math.sqrt(v) if v > 0 else 0.0
        lo, hi = mean - h, mean + h
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return lo, hi


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
