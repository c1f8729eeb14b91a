"""Loss aggregation: a per-token loss matrix (B, T) and its mask → one scalar, by mode name
(``AGG_MODES``: token-mean (DAPO eq. 12), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm
(Dr. GRPO))."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from reasonrl.algos.masked import as_bool_mask, masked_sum, pick

__all__ = ["AGG_MODES", "aggregate"]




def _token_mean(loss_mat: Tensor, m: Tensor, max_len: int | None, denominator: float | Tensor | None) -> Tensor:
    total = masked_sum(loss_mat, m)
    if denominator is not None:
        return total / denominator
    return total / m.sum().clamp(min=1).to(total.dtype)


def _seq_reduce(row_vals: Tensor, row_n: Tensor, denominator: float | Tensor | None) -> Tensor:
    """Mean of per-row values over rows with at least one counted token."""
    has = row_n > 0
    total = torch.where(has, row_vals, torch.zeros((), dtype=row_vals.dtype, device=row_vals.device)).sum()
    if denominator is not None:
        return total / denominator
    return total / has.sum().clamp(min=1).to(total.dtype)


def _seq_mean_token_mean(loss_mat: Tensor, m: Tensor, max_len: int | None, denominator: float | Tensor | None) -> Tensor:
    row_n = m.sum(dim=-1)
    row_mean = masked_sum(loss_mat, m, dim=-1) / row_n.clamp(min=1).to(loss_mat.dtype)
    return _seq_reduce(row_mean, row_n, denominator)


def _seq_mean_token_sum_norm(
    loss_mat: Tensor, m: Tensor, max_len: int | None, denominator: float | Tensor | None
) -> Tensor:
    norm = loss_mat.shape[-1] if max_len is None else max_len
    if norm <= 0:
        raise ValueError(f"max_len must be > 0, got {norm}")
    row_n = m.sum(dim=-1)
    return _seq_reduce(masked_sum(loss_mat, m, dim=-1) / norm, row_n, denominator)


AGG_MODES: dict[str, Callable[[Tensor, Tensor, int | None, float | Tensor | None], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
"""Loss aggregation modes, name -> fn(loss_mat, bool mask, max_len, denominator)."""


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    max_len: int | None = None,
    denominator: float | Tensor | None = None,
) -> Tensor:
    """Reduce a per-token loss matrix (B, T) to a scalar.

    Modes (l = loss_mat, M = mask, |o_i| = sum_t M[i, t], rows = responses with |o_i| > 0):

    * ``"token-mean"`` (DAPO eq. 12): sum_i sum_t M l / sum_i |o_i|. Every token weighs the same,
      so a long response weighs more than a short one.
    * ``"seq-mean-token-mean"`` (original GRPO): mean over rows of (sum_t M l / |o_i|). Every
      response weighs the same, so a long response's tokens each weigh less.
    * ``"seq-mean-token-sum-norm"`` (Dr. GRPO): mean over rows of (sum_t M l / max_len), max_len
      a constant (default T, the padded width; pass the generation cap for a batch-independent
      constant).

    Rows with no counted token do not count in the mean over rows. An all-zero mask gives 0.0,
    still connected to the graph (its gradient is 0). Masking uses ``where``: nan/inf on padding
    do not leak.

    Args:
        loss_mat: (B, T) per-token loss.
        mask: (B, T) bool or 0/1.
        mode: a key of ``AGG_MODES``.
        max_len: the constant of "seq-mean-token-sum-norm" (ignored by the other modes).
        denominator: if given, replaces the local count: token-mean divides the token sum by it,
            the seq modes divide the sum of per-row values by it. For gradient accumulation pass
            the count over the whole mini-batch (tokens, or non-empty rows) so that the sum of
            the micro-batch losses equals the mini-batch loss.

    Raises:
        ValueError: unknown mode (the message names the valid modes) or bad shapes.
    """
    fn = pick(AGG_MODES, mode, "loss aggregation mode")
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be (B, T), got shape {tuple(loss_mat.shape)}")
    m = as_bool_mask(mask, loss_mat)
    return fn(loss_mat, m, max_len, denominator)
