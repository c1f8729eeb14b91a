"""Diagnostics the trainer logs: clip fraction by token probability (DAPO fig. 3a), means by
token position (VC-PPO's value/advantage bias picture) and explained variance of the critic.

All helpers take (B, T) tensors plus a mask, run without gradient and return python floats.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.algos.masked import as_bool_mask

__all__ = ["clip_by_prob_bucket", "mean_by_position", "explained_variance", "DEFAULT_PROB_EDGES", "add_clip_counts", "clip_fractions_from_counts"]

DEFAULT_PROB_EDGES: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))
"""(0.0, 0.1, ..., 1.0): ten probability buckets."""


@torch.no_grad()
def clip_by_prob_bucket(
    logp_old: Tensor,
    clip_upper: Tensor,
    clip_lower: Tensor,
    mask: Tensor,
    edges: tuple[float, ...] | list[float] = DEFAULT_PROB_EDGES,
) -> dict[str, float]:
    """Clip fractions by the sampling probability p = exp(logp_old) of the token (DAPO fig. 3a:
    the upper clip mostly hits low-probability tokens, which is what Clip-Higher relaxes), from the
    clip masks a policy loss returns (``PolicyLossOutput.clip_upper`` / ``clip_lower``, (B, T) bool),
    so the buckets show what the loss itself clipped, whatever the variant.

    Buckets are [edges[j], edges[j+1]), the last one closed.

    Returns:
        for each bucket, with ``b = f"p{lo:.1f}-{hi:.1f}"`` (e.g. "p0.0-0.1"):
        ``clip_upper/{b}`` share of the bucket's counted tokens that are upper-clipped,
        ``clip_lower/{b}`` the same for the lower clip, ``clip_upper_share/{b}`` share of all
        upper-clipped tokens that fall in the bucket, ``tokens/{b}`` the bucket's token count.
        Plus ``clip_upper/max_prob`` and ``clip_upper/mean_prob``: the largest and mean sampling
        probability among upper-clipped tokens (fig. 3a's quantity; 0.0 when none).
    """
    m = as_bool_mask(mask, logp_old)
    p = torch.exp(logp_old.detach().float())
    upper, lower = clip_upper & m, clip_lower & m
    e = [float(x) for x in edges]
    if len(e) < 2 or any(e[i] >= e[i + 1] for i in range(len(e) - 1)):
        raise ValueError(f"edges must be increasing with at least two values, got {edges}")
    stats: list[Tensor] = []
    keys: list[str] = []
    n_upper = upper.sum()
    for j in range(len(e) - 1):
        lo, hi = e[j], e[j + 1]
        inb = (p >= lo) & ((p <= hi) if j == len(e) - 2 else (p < hi))
        cnt = (m & inb).sum()
        b = f"p{lo:.1f}-{hi:.1f}"
        denom = cnt.clamp(min=1).float()
        stats += [
            (upper & inb).sum() / denom,
            (lower & inb).sum() / denom,
            (upper & inb).sum() / n_upper.clamp(min=1).float(),
            cnt.float(),
        ]
        keys += [f"clip_upper/{b}", f"clip_lower/{b}", f"clip_upper_share/{b}", f"tokens/{b}"]
    zero = torch.zeros((), device=p.device)
    pu = torch.where(upper, p, zero)
    stats += [pu.amax() if pu.numel() else zero, pu.sum() / n_upper.clamp(min=1).float()]
    keys += ["clip_upper/max_prob", "clip_upper/mean_prob"]
    return dict(zip(keys, torch.stack([s.float() for s in stats]).tolist()))


@torch.no_grad()
def mean_by_position(x: Tensor, mask: Tensor, n_bins: int | None = 32) -> list[float]:
    """Mean of ``x`` at each token position over valid tokens, binned for long responses.

    Positions run from 0 to L - 1, L = 1 + the last position any row has a valid token at
    (positions past every response's end are dropped). If n_bins is None or L <= n_bins the
    result has one entry per position; otherwise n_bins entries, bin k covering positions
    [floor(k L / n_bins), floor((k+1) L / n_bins)), each the mean over all valid tokens in it.
    An entry with no valid token (only possible with non-prefix masks) is nan. Empty mask: [].

    Used for VC-PPO's picture of values and advantages by token position (with lam < 1 and an
    untrained critic, early-token advantages are biased positive).

    Args:
        x: (B, T) values, advantages, ...
        mask: (B, T) valid tokens.
        n_bins: maximum number of entries (None: no binning).
    """
    if x.dim() != 2:
        raise ValueError(f"x must be (B, T), got shape {tuple(x.shape)}")
    if n_bins is not None and n_bins < 1:
        raise ValueError(f"n_bins must be >= 1 or None, got {n_bins}")
    m = as_bool_mask(mask, x)
    xf = torch.where(m, x.detach().double(), torch.zeros((), dtype=torch.float64, device=x.device))
    sums = xf.sum(dim=0)
    cnts = m.sum(dim=0).double()
    valid_pos = torch.nonzero(cnts > 0)
    if valid_pos.numel() == 0:
        return []
    L = int(valid_pos.max()) + 1
    sums, cnts = sums[:L], cnts[:L]
    if n_bins is not None and L > n_bins:
        bounds = [(k * L) // n_bins for k in range(n_bins + 1)]
        idx = torch.bucketize(torch.arange(L, device=x.device), torch.tensor(bounds[1:-1], device=x.device), right=True)
        sums = torch.zeros(n_bins, dtype=torch.float64, device=x.device).index_add_(0, idx, sums)
        cnts = torch.zeros(n_bins, dtype=torch.float64, device=x.device).index_add_(0, idx, cnts)
    means = torch.where(cnts > 0, sums / cnts.clamp(min=1), torch.full_like(sums, float("nan")))
    return means.tolist()


#: Var(target) / mean(target²) at or below this is a constant target (a relative spread under
#: 1e-6: float32 rounding of returns computed as advantages + values).
CONSTANT_TARGET = 1e-12


@torch.no_grad()
def explained_variance(pred: Tensor, target: Tensor, mask: Tensor) -> float:
    """Explained variance of ``target`` by ``pred`` over counted tokens:

        EV = 1 - Var(target - pred) / Var(target)

    1 is a perfect critic, 0 no better than predicting the mean, negative worse than that.
    Population variances (the Bessel factor cancels). A constant target (every return identical,
    e.g. a batch of all-wrong answers under λ = 1: Var(target) is then float32 rounding, below
    :data:`CONSTANT_TARGET` × mean(target²), where EV would read −1e13) or no counted token:
    returns 0.0 (EV is undefined there; 0.0 keeps logs nan-free and finite).

    Args:
        pred: (B, T) predictions (critic values).
        target: (B, T) targets (returns).
        mask: (B, T) counted tokens.
    """
    m = as_bool_mask(mask, target)
    n = int(m.sum())
    if n == 0:
        return 0.0
    t = target.detach().double()[m]
    d = t - pred.detach().double()[m]
    var_t = t.var(unbiased=False)
    if float(var_t) <= CONSTANT_TARGET * float((t * t).mean()):
        return 0.0
    return float(1.0 - d.var(unbiased=False) / var_t)


def add_clip_counts(counts: dict[str, float], buckets: dict[str, float]) -> None:
    """Add one :func:`clip_by_prob_bucket` result to ``counts`` as token counts: each bucket's
    ``tokens/{b}`` and its upper- and lower-clipped tokens (``clip_upper/{b}`` × tokens, same for
    ``clip_lower``), so the counts of several calls (micro-batches; ranks, summed) give the clip
    fractions of all their tokens together (:func:`clip_fractions_from_counts`)."""
    for k, v in buckets.items():
        if k.startswith("tokens/"):
            b = k[len("tokens/"):]
            counts[k] = counts.get(k, 0.0) + v
            for kind in ("clip_upper", "clip_lower"):
                counts[f"{kind}/{b}"] = counts.get(f"{kind}/{b}", 0.0) + buckets.get(f"{kind}/{b}", 0.0) * v


def clip_fractions_from_counts(counts: dict[str, float]) -> dict[str, float]:
    """The clip fractions by probability bucket of counts made by :func:`add_clip_counts`:
    ``tokens/{b}`` the bucket's tokens, ``clip_upper/{b}`` / ``clip_lower/{b}`` the share of them
    clipped (0.0 for an empty bucket)."""
    out: dict[str, float] = {}
    for k, n in counts.items():
        if k.startswith("tokens/"):
            b = k[len("tokens/"):]
            out[k] = n
            for kind in ("clip_upper", "clip_lower"):
                out[f"{kind}/{b}"] = counts.get(f"{kind}/{b}", 0.0) / n if n else 0.0
    return out
