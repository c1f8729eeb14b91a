"""Loss aggregation, the clipped policy loss (PPO / GRPO / DAPO), the clipped value loss and
KL estimators.

Shapes: B responses, T token positions; per-token tensors are (B, T), ``mask`` (B, T) marks
counted tokens. Losses return ``(scalar loss, metrics)`` where metrics is a dict of python floats
(computed without gradient, one device sync per call).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from reasonrl.algos.masked import as_bool_mask, masked_mean, masked_sum
from reasonrl.algos.metrics import explained_variance

__all__ = [
    "AGG_MODES",
    "aggregate",
    "policy_loss",
    "value_loss",
    "KL_ESTIMATORS",
    "kl_penalty",
    "LOG_RATIO_CLAMP",
]

LOG_RATIO_CLAMP = 20.0
"""log-ratios are clamped to [-20, 20] before ``exp`` (ratio in [2e-9, 4.9e8]): no inf/nan."""


# --------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------


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
    try:
        fn = AGG_MODES[mode]
    except KeyError:
        raise ValueError(f"unknown loss aggregation mode '{mode}'; valid: {', '.join(AGG_MODES)}") from None
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be (B, T), got shape {tuple(loss_mat.shape)}")
    m = as_bool_mask(mask, loss_mat)
    return fn(loss_mat, m, max_len, denominator)


# --------------------------------------------------------------------------------------------
# Policy loss
# --------------------------------------------------------------------------------------------


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    max_len: int | None = None,
    denominator: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate policy loss with decoupled clip range (DAPO "Clip-Higher", eq. 10).

        r_t   = exp(clamp(logp_t - logp_old_t, -20, 20))
        l_t   = -min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)
        dual clip (c > 1, Ye et al. 2020), for A_t < 0 only:  l_t = min(l_t, -c * A_t)

    then aggregated with ``aggregate(l, mask, agg, max_len=..., denominator=...)``.
    PPO/GRPO use eps_low = eps_high = 0.2; DAPO eps_high = 0.28. With A > 0 the gradient vanishes
    once r > 1 + eps_high (a token of probability 0.01 can be pushed to 0.012 at most with
    eps_high = 0.2, to 0.0128 with 0.28); with A < 0 once r < 1 - eps_low; the dual clip also
    zeroes it once r > c for A < 0.

    Args:
        logp: (B, T) log-probs of the sampled tokens under the policy being trained (with grad).
        logp_old: (B, T) log-probs under the sampling policy (treated as constant).
        advantages: (B, T), or (B,) broadcast over T (treated as constant).
        mask: (B, T) counted tokens.
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high].
        dual_clip: c > 1, or None for no dual clip.
        agg, max_len, denominator: see :func:`aggregate`.

    Returns:
        (loss, metrics). metrics (python floats; 0.0 when no token is counted):
        ``pg_loss``; ``clipfrac_upper`` share of counted tokens with A > 0 and r > 1 + eps_high
        (upper clip active: their gradient is cut); ``clipfrac_lower`` A < 0 and r < 1 - eps_low;
        ``clipfrac`` their sum; ``clipfrac_dual`` (only when dual_clip is set) A < 0 and the dual
        cap active; ``approx_kl`` token-mean of the k3 estimator of KL(pi_old || pi_theta),
        (r - 1) - log r, which is >= 0 and unbiased for samples from pi_old; ``ratio_mean``,
        ``ratio_max`` over counted tokens.
    """
    if logp.dim() != 2 or logp_old.shape != logp.shape:
        raise ValueError(f"logp and logp_old must both be (B, T); got {tuple(logp.shape)}, {tuple(logp_old.shape)}")
    if advantages.dim() == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages (B,) must have B={logp.shape[0]}, got {tuple(advantages.shape)}")
        advantages = advantages[:, None].expand_as(logp)
    elif advantages.shape != logp.shape:
        raise ValueError(f"advantages must be (B, T) or (B,), got {tuple(advantages.shape)}")
    if eps_low < 0 or eps_low >= 1 or eps_high < 0:
        raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    m = as_bool_mask(mask, logp)
    adv = advantages.detach().to(logp.dtype)
    log_ratio = (logp - logp_old.detach().to(logp.dtype)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss_mat = torch.maximum(pg_unclipped, pg_clipped)
    neg = adv < 0
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual_active = neg & (loss_mat > cap)
        loss_mat = torch.where(neg, torch.minimum(loss_mat, cap), loss_mat)
    loss = aggregate(loss_mat, m, agg, max_len=max_len, denominator=denominator)

    with torch.no_grad():
        r = ratio.detach()
        lr = log_ratio.detach()
        if r.dtype in (torch.float16, torch.bfloat16):
            r, lr = r.float(), lr.float()
        upper = m & (adv > 0) & (r > 1.0 + eps_high)
        lower = m & neg & (r < 1.0 - eps_low)
        k3 = (r - 1.0) - lr
        n = m.sum().clamp(min=1).to(r.dtype)
        stats = [
            loss.detach().to(r.dtype),
            upper.sum() / n,
            lower.sum() / n,
            masked_mean(k3, m),
            masked_mean(r, m),
            torch.where(m, r, torch.zeros((), dtype=r.dtype, device=r.device)).amax() if r.numel() else n * 0,
        ]
        names = ["pg_loss", "clipfrac_upper", "clipfrac_lower", "approx_kl", "ratio_mean", "ratio_max"]
        if dual_clip is not None:
            stats.append((m & dual_active).sum() / n)
            names.append("clipfrac_dual")
        vals = torch.stack([s.to(r.dtype) for s in stats]).tolist()
    metrics = dict(zip(names, vals))
    metrics["clipfrac"] = metrics["clipfrac_upper"] + metrics["clipfrac_lower"]
    return loss, metrics


# --------------------------------------------------------------------------------------------
# Value loss
# --------------------------------------------------------------------------------------------


def value_loss(
    values: Tensor,
    values_old: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = None,
    agg: str = "token-mean",
    max_len: int | None = None,
    denominator: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss (PPO; SPEC "Value loss").

        l_t = 0.5 * max((V_t - G_t)^2, (clip(V_t, V_old_t - clip, V_old_t + clip) - G_t)^2)
        l_t = 0.5 * (V_t - G_t)^2                                       (clip=None)

    aggregated like the policy loss (``aggregate(l, mask, agg, ...)``, default token-mean).

    Args:
        values: (B, T) current critic values (with grad).
        values_old: (B, T) critic values at rollout time (constant).
        returns: (B, T) targets G (constant), e.g. from :func:`decoupled_gae`.
        mask: (B, T) counted tokens.
        clip: eps_v > 0, or None for the plain MSE.

    Returns:
        (loss, metrics) with ``vf_loss``; ``vf_clipfrac`` share of counted tokens where the clipped
        term is the larger one (0.0 with clip=None); ``value_mean`` and ``returns_mean`` (masked
        token means); ``explained_variance`` of the returns by the values
        (:func:`reasonrl.algos.metrics.explained_variance`).
    """
    if values.dim() != 2 or values_old.shape != values.shape or returns.shape != values.shape:
        raise ValueError(
            "values, values_old and returns must all be (B, T); got "
            f"{tuple(values.shape)}, {tuple(values_old.shape)}, {tuple(returns.shape)}"
        )
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip must be > 0 (or None), got {clip}")
    m = as_bool_mask(mask, values)
    g = returns.detach().to(values.dtype)
    unclipped = (values - g) ** 2
    if clip is None:
        loss_mat = 0.5 * unclipped
        clipped_active = torch.zeros_like(m)
    else:
        v_old = values_old.detach().to(values.dtype)
        v_clipped = v_old + (values - v_old).clamp(-clip, clip)
        clipped = (v_clipped - g) ** 2
        loss_mat = 0.5 * torch.maximum(unclipped, clipped)
        clipped_active = clipped.detach() > unclipped.detach()
    loss = aggregate(loss_mat, m, agg, max_len=max_len, denominator=denominator)
    with torch.no_grad():
        v = values.detach()
        if v.dtype in (torch.float16, torch.bfloat16):
            v, g = v.float(), g.float()
        n = m.sum().clamp(min=1).to(v.dtype)
        vals = torch.stack(
            [loss.detach().to(v.dtype), (m & clipped_active).sum() / n, masked_mean(v, m), masked_mean(g, m)]
        ).tolist()
    metrics = dict(zip(["vf_loss", "vf_clipfrac", "value_mean", "returns_mean"], vals))
    metrics["explained_variance"] = explained_variance(v, g, m)
    return loss, metrics


# --------------------------------------------------------------------------------------------
# KL
# --------------------------------------------------------------------------------------------


def _k1(logp: Tensor, logp_ref: Tensor) -> Tensor:
    return logp - logp_ref


def _k2(logp: Tensor, logp_ref: Tensor) -> Tensor:
    return 0.5 * (logp - logp_ref) ** 2


def _k3(logp: Tensor, logp_ref: Tensor) -> Tensor:
    d = (logp_ref - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(d) - d - 1.0


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}
"""Per-token estimators of KL(pi || pi_ref) from samples of pi (Schulman's k1/k2/k3)."""


def kl_penalty(logp: Tensor, logp_ref: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate between the policy and a reference policy (samples from the policy).

        "k1": logp - logp_ref                                    (unbiased, can be negative)
        "k2": 0.5 * (logp - logp_ref)^2                          (biased, >= 0)
        "k3": exp(logp_ref - logp) - (logp_ref - logp) - 1       (unbiased, >= 0, low variance;
                                                                  verl's "low_var_kl" without its
                                                                  [-10, 10] output clamp)

    k3's exponent is clamped to [-20, 20]. Shapes are preserved (any shape, e.g. (B, T)); the
    caller masks and aggregates (in the loss) or subtracts ``kl_coef * kl`` from token rewards.

    Raises:
        ValueError: unknown kind (the message names the valid kinds).
    """
    try:
        fn = KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"unknown KL estimator '{kind}'; valid: {', '.join(KL_ESTIMATORS)}") from None
    if logp.shape != logp_ref.shape:
        raise ValueError(f"logp and logp_ref shapes differ: {tuple(logp.shape)} vs {tuple(logp_ref.shape)}")
    return fn(logp, logp_ref)
