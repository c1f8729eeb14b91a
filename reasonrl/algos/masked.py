"""Masked reductions over (B, T) token tensors.

Conventions shared by the whole ``reasonrl.algos`` package:

* ``mask`` is a bool or 0/1 tensor broadcastable to ``x``; 1 marks a token that counts.
* Masking uses :func:`torch.where`, never ``x * mask``, so ``nan``/``inf`` sitting on padding
  cannot leak into a result (``nan * 0`` is ``nan``).
* A reduction over zero counted elements returns 0 (a tensor, connected to the graph), never nan.
"""

from __future__ import annotations

from typing import Mapping, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")

__all__ = ["as_bool_mask", "masked_sum", "masked_mean", "masked_var", "masked_whiten", "LOG_RATIO_CLAMP", "pick"]

LOG_RATIO_CLAMP = 20.0
"""log-ratios are clamped to [-20, 20] before ``exp`` (ratio in [2e-9, 4.9e8]): no inf/nan."""


def as_bool_mask(mask: Tensor, like: Tensor | None = None) -> Tensor:
    """``mask`` as a bool tensor (nonzero = counted), broadcast to ``like``'s shape if given."""
    m = mask if mask.dtype == torch.bool else mask != 0
    if like is not None and m.shape != like.shape:
        m = m.expand_as(like)
    return m


def masked_sum(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Sum of ``x`` over counted elements (over all elements, or along ``dim``)."""
    m = as_bool_mask(mask, x)
    z = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return z.sum() if dim is None else z.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Mean of ``x`` over counted elements; 0 where nothing is counted.

    Shapes: ``x`` (..., ), ``mask`` broadcastable to ``x``. With ``dim=None`` a scalar, else ``x``
    reduced along ``dim``.
    """
    m = as_bool_mask(mask, x)
    total = masked_sum(x, m, dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return total / count.clamp(min=1).to(total.dtype)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over all counted elements (scalar).

    ``unbiased=True`` uses Bessel's correction (n - 1); with fewer than 2 counted elements the
    result is 0 (not nan).
    """
    m = as_bool_mask(mask, x)
    n = m.sum()
    mean = masked_mean(x, m)
    sq = masked_sum((x - mean) ** 2, m)
    denom = (n - 1) if unbiased else n
    var = sq / denom.clamp(min=1).to(sq.dtype)
    return torch.where(n >= (2 if unbiased else 1), var, torch.zeros_like(var))


def masked_whiten(x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalise ``x`` to zero mean, unit variance over counted elements (PPO advantage whitening).

        x_w = (x - mean) / sqrt(var + eps)          (shift_mean=True)
        x_w = (x - mean) / sqrt(var + eps) + mean   (shift_mean=False: the mean is kept, as verl)

    mean and var (Bessel-corrected) are taken over all counted elements of the batch. Positions
    outside the mask are returned as 0. Optional: :func:`reasonrl.algos.gae` never whitens.
    """
    m = as_bool_mask(mask, x)
    mean = masked_mean(x, m)
    var = masked_var(x, m, unbiased=True)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))


def pick(registry: Mapping[str, T], name: str, what: str) -> T:
    """``registry[name]``; an unknown name is a ValueError naming ``what`` and the valid names."""
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {what} '{name}'; valid: {', '.join(registry)}") from None
