"""The unbiased pass@k estimator against the binomial formula."""

from __future__ import annotations

import math

import pytest

from reasonrl.evaluation.scores import pass_at_k


def _binomial(n: int, c: int, k: int) -> float:
    """pass@k = 1 - C(n - c, k) / C(n, k), straight from the definition (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_pass_at_k_edge_cases() -> None:
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 0, 10) == 0.0
    assert pass_at_k(10, 10, 3) == 1.0
    assert pass_at_k(5, 2, 5) == 1.0  # k = n with a correct sample
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k = 3
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(32, 7, 1) == pytest.approx(7 / 32)  # pass@1 = avg@n


@pytest.mark.parametrize("n", [1, 2, 5, 16, 32, 100])
def test_pass_at_k_matches_binomials(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_binomial(n, c, k), abs=1e-12)


def test_pass_at_k_large_n_is_stable_and_errors() -> None:
    v = pass_at_k(2000, 3, 100)
    assert 0.0 < v < 1.0 and math.isfinite(v)
    with pytest.raises(ValueError):
        pass_at_k(5, 2, 6)
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 2)
    with pytest.raises(ValueError):
        pass_at_k(5, 2, 0)
