"""DAPO's soft overlong punishment (eq. 13), added to the outcome reward."""

from __future__ import annotations

__all__ = ["overlong_penalty"]


def overlong_penalty(length: int, max_length: int, cache_length: int) -> float:
    """Length penalty of a response of ``length`` tokens (DAPO eq. 13).

    With ``L_max = max_length`` (the generation cap) and ``L_cache = cache_length`` (the
    punishment buffer; paper: 20480 and 4096):

    - 0 when ``length <= L_max - L_cache``;
    - ``((L_max - L_cache) - length) / L_cache`` (from 0 down to -1) when
      ``L_max - L_cache < length <= L_max``;
    - -1 when ``length > L_max``.

    >>> overlong_penalty(16384, 20480, 4096), overlong_penalty(18432, 20480, 4096)
    (0.0, -0.5)
    """
    if cache_length < 0 or cache_length > max_length:
        raise ValueError(f"cache_length must be in [0, max_length={max_length}], got {cache_length}")
    import torch

    from reasonrl.algos import overlong_penalty as batched  # the one implementation of eq. 13

    return float(batched(torch.tensor([length]), max_len=max_length, cache_len=cache_length)[0])
