"""Overlong punishment (DAPO eq. 13) and the dynamic-sampling group filter."""

from __future__ import annotations


import pytest
import torch

from reasonrl.algos import informative_groups, soft_overlong_punishment
from reasonrl.algos import reference as ref


def test_soft_overlong_punishment_three_regions_and_boundaries() -> None:
    L, C = 20480, 4096  # the paper's setting: punishment starts past 16384 tokens
    lengths = [0, 100, 16383, 16384, 16385, 18432, 20479, 20480, 20481, 30000]
    got = soft_overlong_punishment(torch.tensor(lengths), max_len=L, cache_len=C)
    want = [0.0, 0.0, 0.0, 0.0, -1 / 4096, -0.5, -4095 / 4096, -1.0, -1.0, -1.0]
    torch.testing.assert_close(got, torch.tensor(want))
    assert got.dtype == torch.float32


@pytest.mark.parametrize("max_len,cache_len", [(10, 4), (10, 10), (7, 1), (5, 0)])
def test_soft_overlong_punishment_matches_reference(max_len: int, cache_len: int) -> None:
    lengths = list(range(0, max_len + 4))
    got = soft_overlong_punishment(lengths, max_len=max_len, cache_len=cache_len)
    want = [ref.soft_overlong_punishment(n, max_len, cache_len) for n in lengths] if cache_len else [
        0.0 if n <= max_len else -1.0 for n in lengths
    ]
    torch.testing.assert_close(got, torch.tensor(want))


def test_soft_overlong_punishment_cache_zero_and_errors() -> None:
    got = soft_overlong_punishment([9, 10, 11], max_len=10, cache_len=0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -1.0]))
    for bad in ({"max_len": 10, "cache_len": 11}, {"max_len": 10, "cache_len": -1}, {"max_len": 0, "cache_len": 0}):
        with pytest.raises(ValueError):
            soft_overlong_punishment([1], **bad)


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
