"""Reward shaping and sample selection: DAPO's soft overlong punishment (eq. 13) and dynamic
sampling's group filter (eq. 11)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["soft_overlong_punishment", "informative_groups"]


def soft_overlong_punishment(lengths: Tensor | Sequence[int], *, max_len: int, cache_len: int) -> Tensor:
    """Soft overlong punishment R_len(y) (DAPO eq. 13), added to the outcome reward.

                  0                                   |y| <= L_max - L_cache
        R_len  =  ((L_max - L_cache) - |y|) / L_cache  L_max - L_cache < |y| <= L_max
                  -1                                  |y| > L_max

    So the penalty is 0 at |y| = L_max - L_cache, falls linearly to -1 at |y| = L_max, and is -1
    beyond. With cache_len = 0 it is 0 up to max_len and -1 beyond. (Paper: L_max = 20480,
    L_cache = 4096.) Note: a response truncated at the generation cap has |y| = L_max and gets -1.

    Args:
        lengths: response lengths |y| in tokens, Tensor[B] or a sequence of ints.
        max_len: L_max.
        cache_len: L_cache, 0 <= cache_len <= max_len.

    Returns:
        float32 Tensor with the shape of ``lengths``.
    """
    if max_len <= 0 or cache_len < 0 or cache_len > max_len:
        raise ValueError(f"need max_len > 0 and 0 <= cache_len <= max_len, got max_len={max_len}, cache_len={cache_len}")
    y = torch.as_tensor(lengths)
    yf = y.to(torch.float32)
    start = max_len - cache_len
    zero = torch.zeros_like(yf)
    if cache_len > 0:
        ramp = (start - yf) / cache_len
    else:
        ramp = zero  # never selected: the ramp region is empty
    out = torch.where(y <= start, zero, ramp)
    return torch.where(y > max_len, torch.full_like(yf, -1.0), out)


def informative_groups(correct: Tensor) -> Tensor:
    """Groups that carry a learning signal (DAPO dynamic sampling, eq. 11): 0 < #correct < G.

    A group whose responses are all correct or all wrong has identical outcome rewards and
    therefore zero group-relative advantage. Judge this on correctness, never on the shaped reward
    (the overlong penalty makes rewards differ inside an all-correct group).

    Args:
        correct: bool Tensor (groups, G): correct[g, i] = response i to prompt g is correct.

    Returns:
        bool Tensor[groups].

    Raises:
        TypeError: ``correct`` is not bool (a ±1 reward tensor would silently be misread).
        ValueError: ``correct`` is not 2-D.
    """
    if correct.dtype != torch.bool:
        raise TypeError(f"correct must be a bool tensor (groups, G), got dtype {correct.dtype}")
    if correct.dim() != 2:
        raise ValueError(f"correct must be (groups, G), got shape {tuple(correct.shape)}")
    n = correct.sum(dim=-1)
    return (n > 0) & (n < correct.shape[-1])
