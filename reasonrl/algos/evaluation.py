"""Evaluation estimators."""

from __future__ import annotations

__all__ = ["pass_at_k"]


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
