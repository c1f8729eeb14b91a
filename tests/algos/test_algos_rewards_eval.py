"""Overlong punishment (DAPO eq. 13), dynamic-sampling group filter, pass@k."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algos import informative_groups, overlong_penalty, pass_at_k
from reasonrl.algos import reference as ref


def test_overlong_penalty_three_regions_and_boundaries() -> None:
    L, C = 20480, 4096  # the paper's setting: punishment starts past 16384 tokens
    lengths = [0, 100, 16383, 16384, 16385, 18432, 20479, 20480, 20481, 30000]
    got = overlong_penalty(torch.tensor(lengths), max_len=L, cache_len=C)
    want = [0.0, 0.0, 0.0, 0.0, -1 / 4096, -0.5, -4095 / 4096, -1.0, -1.0, -1.0]
    torch.testing.assert_close(got, torch.tensor(want))
    assert got.dtype == torch.float32


@pytest.mark.parametrize("max_len,cache_len", [(10, 4), (10, 10), (7, 1), (5, 0)])
def test_overlong_penalty_matches_reference(max_len: int, cache_len: int) -> None:
    lengths = list(range(0, max_len + 4))
    got = overlong_penalty(lengths, max_len=max_len, cache_len=cache_len)
    want = [ref.overlong_penalty(n, max_len, cache_len) for n in lengths] if cache_len else [
        0.0 if n <= max_len else -1.0 for n in lengths
    ]
    torch.testing.assert_close(got, torch.tensor(want))


def test_overlong_penalty_cache_zero_and_errors() -> None:
    got = overlong_penalty([9, 10, 11], max_len=10, cache_len=0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -1.0]))
    for bad in ({"max_len": 10, "cache_len": 11}, {"max_len": 10, "cache_len": -1}, {"max_len": 0, "cache_len": 0}):
        with pytest.raises(ValueError):
            overlong_penalty([1], **bad)


def test_informative_groups() -> None:
    correct = torch.tensor(
        [[True, True, True, True], [False, False, False, False], [True, False, False, False], [False, True, True, True]]
    )
    assert informative_groups(correct).tolist() == [False, False, True, True]
    assert informative_groups(torch.tensor([[True], [False]])).tolist() == [False, False]
    with pytest.raises(TypeError):
        informative_groups(torch.tensor([[1.0, -1.0]]))
    with pytest.raises(ValueError):
        informative_groups(torch.tensor([True, False]))


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
            assert pass_at_k(n, c, k) == pytest.approx(ref.pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_large_n_is_stable_and_errors() -> None:
    v = pass_at_k(2000, 3, 100)
    assert 0.0 < v < 1.0 and math.isfinite(v)
    with pytest.raises(ValueError):
        pass_at_k(5, 2, 6)
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 2)
    with pytest.raises(ValueError):
        pass_at_k(5, 2, 0)
