"""avg@n, pass@k, maj@n and bootstrap CIs against hand-computed values."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterator
from math import comb

import pytest

from reasonrl.evaluation.scores import (
    pass_at_k,
    _quantile,
    avg_at_n,
    bootstrap_ci,
    maj_at_n,
    majority_vote,
    pass_at_k_mean,
    per_problem_maj,
    per_problem_values,
    with_cis,
    vote_classes,
)
from reasonrl.rewards import RewardScorer, ScoreStats

T, F = True, False


@pytest.fixture(scope="module")
def scorer() -> Iterator[RewardScorer]:
    with RewardScorer(num_workers=1, timeout_s=30) as s:
        yield s

# problem 0: 1 of 4 correct; problem 1: 2 of 4 correct
CORRECT = [[T, F, F, F], [T, T, F, F]]


def test_avg_at_n() -> None:
    assert avg_at_n(CORRECT) == pytest.approx(0.375)  # (1/4 + 2/4) / 2 = 3/8 of all samples
    assert avg_at_n([[T] * 32, [F] * 32]) == 0.5


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 1, 1, 0.25),  # pass@1 = c/n
        (4, 0, 2, 0.0),
        (4, 4, 1, 1.0),
        (3, 1, 3, 1.0),  # n - c = 2 < k = 3: every 3-subset holds the correct one
        (32, 3, 8, 1 - comb(29, 8) / comb(32, 8)),
    ],
)
def test_pass_at_k_estimator(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_mean() -> None:
    # problem 0: 1 - C(3,2)/C(4,2) = 1/2; problem 1: 1 - C(2,2)/C(4,2) = 5/6; mean 2/3
    assert pass_at_k_mean(CORRECT, 2) == pytest.approx(2 / 3)
    assert pass_at_k_mean(CORRECT, 1) == pytest.approx(avg_at_n(CORRECT))
    assert pass_at_k_mean(CORRECT, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k_mean(CORRECT, 5)


def test_majority_vote() -> None:
    assert majority_vote(["025", "25", "7", None]) == "025"  # "025" and "25" vote together
    assert majority_vote(["3", "4", "4", "3"]) == "3"  # tie: first occurrence wins
    assert majority_vote(["4", "3", "3", "4"]) == "4"
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None
    assert majority_vote(["$\\frac{1}{2}$", "\\frac{1}{2}", "0.5"]) == "$\\frac{1}{2}$"


def test_maj_at_n() -> None:
    answers = [["025", "25", "7", None], ["3", "4", "4", "3"], [None, None], ["1/2", "0.5", "1/2"]]
    gts = ["25", "3", "1", "1/2"]
    assert per_problem_maj(answers, gts) == [1.0, 1.0, 0.0, 1.0]
    assert maj_at_n(answers, gts) == 0.75
    # the default equivalence is the reward's (math-verify): 0.5 is right against \frac{1}{2}
    assert maj_at_n([["0.5", "0.5", "1/2"]], ["\\frac{1}{2}"]) == 1.0
    # a custom equivalence decides both the classes and correctness: plain string equality here
    def same_string(pairs):
        return [a == b for a, b in pairs]

    assert maj_at_n([["0.5", "0.5", "1/2"]], ["\\frac{1}{2}"], equal=same_string) == 0.0
    assert maj_at_n([["0.5", "0.5", "1/2"]], ["0.5"], equal=same_string) == 1.0


# Mostly right by equivalence: three spellings of 1/2 against two votes for 3. String voting
# elects "3" (2 votes against 1 each) and scores maj@5 = 0 although 3 of 5 samples are right.
HALVES = ["0.5", "3", "1/2", "\\frac{1}{2}", "3"]


def test_equivalent_answers_vote_together() -> None:
    assert vote_classes([HALVES]) == [[("0.5", 3), ("3", 2)]]
    assert majority_vote(HALVES) == "0.5"
    assert per_problem_maj([HALVES], ["1/2"]) == [1.0]
    assert maj_at_n([HALVES, ["7", "7", "1/2"]], ["\\frac12", "1/2"]) == 0.5


def test_pool_backed_equivalence_votes_the_same(scorer) -> None:
    stats = ScoreStats()
    equal = functools.partial(scorer.equivalent, stats=stats)
    assert vote_classes([HALVES, ["025", "25", "2\\sqrt{3}", "\\sqrt{12}"]], equal) == [
        [("0.5", 3), ("3", 2)], [("025", 2), ("2\\sqrt{3}", 2)]]
    assert maj_at_n([HALVES], ["1/2"], equal=equal) == 1.0
    assert stats.verified > 0 and stats.timeouts == 0 and stats.errors == 0


def test_tie_goes_to_the_class_whose_first_vote_came_first() -> None:
    # two classes of two votes each: {3, 3} and {1/2, 0.5}
    assert majority_vote(["3", "1/2", "0.5", "3"]) == "3"
    assert majority_vote(["1/2", "3", "3", "0.5"]) == "1/2"
    # the winner is the class's first vote as written, whichever spelling later votes used
    assert majority_vote(["$\\frac{1}{2}$", "7", "0.5", "7", "1/2"]) == "$\\frac{1}{2}$"
    assert maj_at_n([["3", "1/2", "0.5", "3"], ["1/2", "3", "3", "0.5"]], ["3", "3"]) == 0.5


def test_equal_is_asked_in_rounds_over_all_problems() -> None:
    calls: list[list[tuple[str, str]]] = []

    def same_letter(pairs):
        calls.append(list(pairs))
        return [a.lower() == b.lower() for a, b in pairs]

    got = vote_classes([["a", "$a$", "b", "B"], ["x", "y", "y"], [None, ""]], same_letter)
    assert got == [[("a", 2), ("b", 2)], [("x", 1), ("y", 2)], []]  # "a" and "$a$" are one vote from the start
    # round 1: each problem's second distinct answer against its one class; round 2: "B" against both classes
    assert calls == [[("b", "a"), ("y", "x")], [("B", "a"), ("B", "b")]]


def test_quantile_matches_numpy_linear() -> None:
    assert _quantile([0.0, 1.0, 2.0, 3.0], 0.5) == 1.5
    assert _quantile([0.0, 1.0, 2.0, 3.0], 0.25) == 0.75
    assert _quantile([5.0], 0.9) == 5.0


def test_bootstrap_ci() -> None:
    assert bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    # two problems scoring 0 and 1: resampled means are 0, 0.5, 1 with probability 1/4, 1/2, 1/4,
    # so the 2.5% and 97.5% quantiles of 1000 resamples are 0 and 1.
    assert bootstrap_ci([0.0, 1.0], n_boot=1000) == (0.0, 1.0)
    values = [float(i % 3 == 0) for i in range(30)]
    lo, hi = bootstrap_ci(values, seed=1)
    assert lo < sum(values) / 30 < hi
    assert bootstrap_ci(values, seed=1) == (lo, hi)  # deterministic
    lo90, hi90 = bootstrap_ci(values, alpha=0.10, seed=1)
    assert lo <= lo90 <= hi90 <= hi
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_per_problem_values_with_cis() -> None:
    answers = [["5", "6", "6", "6"], ["1", "2", "2", None]]
    out = with_cis(per_problem_values(CORRECT, answers, ["5", "2"]))
    assert list(out) == ["avg@4", "pass@1", "pass@4", "maj@4"]  # k = 8 > n = 4 is skipped
    assert out["avg@4"]["value"] == pytest.approx(0.375)
    assert out["pass@1"]["value"] == pytest.approx(0.375)
    assert out["pass@4"]["value"] == 1.0 and out["pass@4"]["ci"] == [1.0, 1.0]
    assert out["maj@4"]["value"] == 0.5  # problem 0 votes 6 (wrong), problem 1 votes 2 (right)
    lo, hi = out["avg@4"]["ci"]
    assert 0.25 <= lo <= 0.375 <= hi <= 0.5  # per-problem values are 0.25 and 0.5
    custom = with_cis(per_problem_values(CORRECT, ks=(2,)))
    assert list(custom) == ["avg@4", "pass@2"]
    assert custom["pass@2"]["value"] == pytest.approx(2 / 3)


def test_empty_inputs_raise() -> None:
    with pytest.raises(ValueError):
        avg_at_n([])
    with pytest.raises(ValueError):
        avg_at_n([[]])
    with pytest.raises(ValueError):
        maj_at_n([["1"]], [])


def test_paired_difference_resamples_pairs() -> None:
    from reasonrl.evaluation.scores import bootstrap_ci, paired_difference

    before = [0.0, 0.25, 0.5, 0.75, 1.0, 0.0, 0.5, 1.0]
    after = [b + 0.25 if b < 1 else b for b in before]  # every problem gains (or is already solved)
    d = paired_difference(after, before, n_boot=500, seed=1)
    assert d["problems"] == 8 and abs(d["value"] - sum(a - b for a, b in zip(after, before)) / 8) < 1e-12
    assert d["ci"][0] > 0  # a consistent gain is beyond noise when paired ...
    lo_b, hi_b = bootstrap_ci(before, n_boot=500, seed=1)
    lo_a, hi_a = bootstrap_ci(after, n_boot=500, seed=1)
    assert lo_a < hi_b  # ... though the two separate intervals overlap
    with pytest.raises(ValueError, match="same problems"):
        paired_difference([1.0], [1.0, 0.0])


def test_two_level_bootstrap_carries_the_spread_between_runs() -> None:
    """Runs that disagree (a training seed that collapsed) widen the interval; the pooled bootstrap
    takes the runs as fixed and stays narrow. Runs that agree give about the pooled width."""
    from reasonrl.evaluation.scores import bootstrap_ci, two_level_bootstrap_ci

    problems = 48
    disagree = [[float(p % 10 < k) for p in range(problems)] for k in (1, 2, 6)]  # 10%, 20%, 60% of the problems
    lo, hi = two_level_bootstrap_ci(disagree, seed=0)
    plo, phi = bootstrap_ci([x for r in disagree for x in r], seed=0)
    assert lo < plo and hi > phi and (hi - lo) > 2 * (phi - plo)
    assert lo <= 0.1 + 0.05 and hi >= 0.6 - 0.05  # about the lowest and highest run's means
    agree = [[float((p + s) % 3 == 0) for p in range(problems)] for s in range(3)]  # each run a third
    lo, hi = two_level_bootstrap_ci(agree, seed=0)
    plo, phi = bootstrap_ci([x for r in agree for x in r], seed=0)
    assert lo < 1 / 3 < hi and (hi - lo) < 1.5 * (phi - plo)
    # one run: the bootstrap over its problems (the same statistic, another random stream)
    one = [[float(p % 4 == 0) for p in range(problems)]]
    assert two_level_bootstrap_ci(one, seed=0) == two_level_bootstrap_ci(one, seed=0)  # deterministic
    lo1, hi1 = two_level_bootstrap_ci(one, n_boot=4000, seed=0)
    blo, bhi = bootstrap_ci(one[0], n_boot=4000, seed=0)
    assert abs(lo1 - blo) <= 0.05 and abs(hi1 - bhi) <= 0.05
    assert two_level_bootstrap_ci([[0.5, 0.5], [0.5]]) == (0.5, 0.5)  # runs may hold different problem counts
    with pytest.raises(ValueError):
        two_level_bootstrap_ci([[1.0], []])
    with pytest.raises(ValueError):
        two_level_bootstrap_ci([])


def _t_quantile_slow(q: float, df: float) -> float:
    """Slow reference: Student's t density integrated by Simpson's rule from 0, inverted by bisection."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float, n: int = 4000) -> float:
        h = t / n
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return (lo + hi) / 2


def test_student_t_quantile() -> None:
    """Tabled values (df 1, 2, 5, 30; the normal's at df = inf), the slow reference at non-integer
    df (Satterthwaite's), symmetry, and bad input."""
    from reasonrl.evaluation.scores import student_t_quantile

    for df, t in ((1, 12.706204736), (2, 4.302652730), (5, 2.570581836), (30, 2.042272456), (math.inf, 1.959963985)):
        assert student_t_quantile(0.975, df) == pytest.approx(t, rel=1e-8)
    for q, df in ((0.975, 2.37), (0.9, 7.5), (0.995, 1.6), (0.6, 40.2)):
        assert student_t_quantile(q, df) == pytest.approx(_t_quantile_slow(q, df), rel=1e-6)
    assert student_t_quantile(0.025, 3.3) == pytest.approx(-student_t_quantile(0.975, 3.3))
    assert student_t_quantile(0.5, 4) == pytest.approx(0.0, abs=1e-9)
    for q, df in ((0.0, 3), (1.0, 3), (0.5, 0.0)):
        with pytest.raises(ValueError):
            student_t_quantile(q, df)


def _crossed_variance_slow(y: list[list[float]]) -> float:
    """Slow reference: the variance components one by one (σ²_e, then σ²_a and σ²_b from their mean
    squares), combined as σ²_a / k + σ²_b / m + σ²_e / (k m), and not below σ²_e / (k m)."""
    k, m = len(y), len(y[0])
    g = sum(sum(r) for r in y) / (k * m)
    rm = [sum(r) / m for r in y]
    cm = [sum(y[s][p] for s in range(k)) / k for p in range(m)]
    sse = 0.0
    for s in range(k):
        for p in range(m):
            sse += (y[s][p] - rm[s] - cm[p] + g) ** 2
    s2e = sse / ((k - 1) * (m - 1))
    s2a = (m * sum((r - g) ** 2 for r in rm) / (k - 1) - s2e) / m
    s2b = (k * sum((c - g) ** 2 for c in cm) / (m - 1) - s2e) / k
    return max(s2a / k + s2b / m + s2e / (k * m), s2e / (k * m))


def test_crossed_variance_values() -> None:
    """The crossed design's variance of the grand mean: hand-worked cases, the slow reference, and
    unbiasedness under the two-way random-effects model (the mean of V over many draws is
    σ²_a / k + σ²_b / m + σ²_e / (k m))."""
    import random

    from reasonrl.evaluation.scores import crossed_mean_ci, crossed_variance, student_t_quantile

    # the runs differ, every problem alike: V = MS_A / (k m) = 1.5 / 6, one df
    assert crossed_variance([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]) == pytest.approx((0.25, 1.0))
    # the problems differ, the runs alike: V = MS_B / (k m) = (2/3) / 8, m − 1 = 3 df
    assert crossed_variance([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0]]) == pytest.approx((1 / 12, 3.0))
    lo, hi = crossed_mean_ci([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0]])
    h = student_t_quantile(0.975, 3) * math.sqrt(1 / 12)
    assert (lo, hi) == pytest.approx((0.5 - h, 0.5 + h))
    assert crossed_mean_ci([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0]], bounds=(0.0, 1.0)) == (0.0, 1.0)  # clipped to what an accuracy can be
    rng = random.Random(5)
    for k, m, spread in ((3, 48, 0.0), (5, 24, 0.0), (2, 7, 0.0), (3, 48, 0.4), (5, 24, 0.3), (2, 7, 0.5)):
        a, b = [rng.uniform(-spread, spread) for _ in range(k)], [rng.uniform(-0.5, 0.5) for _ in range(m)]
        y = [[min(1.0, max(0.0, 0.5 + a[s] + b[p] + rng.choice((-0.25, 0.0, 0.25)))) for p in range(m)] for s in range(k)]
        v, df = crossed_variance(y)
        assert v == pytest.approx(_crossed_variance_slow(y), rel=1e-12) and 1.0 <= df <= (k - 1) * (m - 1)
    # only interaction: MS_A = MS_B = 0, MS_E = 1, so V = −1/4 is floored at MS_E / (k m) = 1/4, with MS_E's 1 df
    assert crossed_variance([[0.0, 1.0], [1.0, 0.0]]) == pytest.approx((0.25, 1.0))
    assert _crossed_variance_slow([[0.0, 1.0], [1.0, 0.0]]) == pytest.approx(0.25)
    # unbiased: 4000 draws of a 3 × 8 design with σ_a 0.5, σ_b 1, σ_e 0.7
    k, m, sa, sb, se = 3, 8, 0.5, 1.0, 0.7
    vs = []
    for _ in range(4000):
        a, b = [rng.gauss(0, sa) for _ in range(k)], [rng.gauss(0, sb) for _ in range(m)]
        vs.append(_crossed_variance_slow([[a[s] + b[p] + rng.gauss(0, se) for p in range(m)] for s in range(k)]))
    true = sa**2 / k + sb**2 / m + se**2 / (k * m)
    assert sum(vs) / len(vs) == pytest.approx(true, rel=0.06)
    # one run: the t interval over its problems (the run taken as fixed); one problem: over the runs
    one = [[0.0, 1.0, 1.0, 0.0, 1.0]]
    v, df = crossed_variance(one)
    assert v == pytest.approx(statistics.variance(one[0]) / 5) and df == 4
    assert crossed_variance([[0.2], [0.4], [0.9]]) == pytest.approx((statistics.variance([0.2, 0.4, 0.9]) / 3, 2.0))
    assert math.isnan(crossed_variance([[0.5]])[0]) and crossed_mean_ci([[0.5]], bounds=(0.0, 1.0)) == (0.0, 1.0)
    assert crossed_mean_ci([[0.5, 0.5], [0.5, 0.5]]) == (0.5, 0.5)
    with pytest.raises(ValueError, match="same problems"):
        crossed_mean_ci([[0.5, 0.5], [0.5]])
    with pytest.raises(ValueError):
        crossed_mean_ci([])


def test_crossed_interval_counts_a_shared_problem_difficulty_once_per_problem() -> None:
    """Seeds that agree on which problems are hard: the problems' spread is σ²_b / m, not σ²_b / (k m)
    as if each seed had its own problems; the two-level bootstrap (nested design) is narrower, by
    about √k, and the crossed interval matches the bootstrap over the problems' means over seeds."""
    from reasonrl.evaluation.scores import bootstrap_ci, crossed_mean_ci, two_level_bootstrap_ci

    m = 48
    y = [[float(p % 3 == 0) for p in range(m)] for _ in range(5)]  # 5 seeds, each solving the same third
    lo, hi = crossed_mean_ci(y)
    olo, ohi = two_level_bootstrap_ci(y, n_boot=2000, seed=0)
    blo, bhi = bootstrap_ci([sum(y[s][p] for s in range(5)) / 5 for p in range(m)], n_boot=2000, seed=0)
    assert (hi - lo) > 1.8 * (ohi - olo)
    assert (hi - lo) == pytest.approx(bhi - blo, rel=0.15)
