"""Policy losses (a registry: ``POLICY_LOSSES``) and the clipped value loss.

Shapes: B responses, T token positions; per-token tensors are (B, T), ``mask`` (B, T) marks
counted tokens. Every policy loss has the same keyword signature (:class:`PolicyLoss`) and returns
a :class:`PolicyLossOutput`: the scalar loss, python-float metrics (computed without gradient,
one device sync per call), and the detached ratio and clip masks the trainer logs, so nothing is
recomputed. A new variant is one function here, one registry entry and one ``AlgoSpec`` row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import torch
from torch import Tensor

from reasonrl.algos.aggregation import aggregate
from reasonrl.algos.masked import LOG_RATIO_CLAMP, as_bool_mask, masked_mean
from reasonrl.algos.metrics import explained_variance

__all__ = ["LossParams", "PolicyLossOutput", "PolicyLoss", "POLICY_LOSSES", "ppo_clip_loss", "policy_loss", "value_loss"]


@dataclass(frozen=True)
class LossParams:
    """The knobs of every policy loss (each loss reads the ones it uses; ``AlgoSpec.loss_params``)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None

    def __post_init__(self) -> None:
        if self.eps_low < 0 or self.eps_low >= 1 or self.eps_high < 0:
            raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {self.eps_low}, {self.eps_high}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")


@dataclass
class PolicyLossOutput:
    """What a policy loss returns. ``ratio`` (B, T) is detached; ``clip_upper`` / ``clip_lower``
    (B, T) bool mark the counted tokens whose gradient the upper / lower clip cuts. Unpacks as
    ``loss, metrics = out``."""

    loss: Tensor
    metrics: dict[str, float]
    ratio: Tensor
    clip_upper: Tensor
    clip_lower: Tensor

    def __iter__(self) -> Iterator[object]:
        yield self.loss
        yield self.metrics


class PolicyLoss(Protocol):
    """The keyword signature every entry of ``POLICY_LOSSES`` has."""

    def __call__(self, logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, *, params: LossParams, agg: str = ...,
                 max_len: int | None = ..., denominator: float | Tensor | None = ..., is_weights: Tensor | None = ...) -> PolicyLossOutput: ...


def _check_shapes(logp: Tensor, logp_old: Tensor, advantages: Tensor) -> Tensor:
    """Validate (B, T) shapes; returns the advantages as (B, T)."""
    if logp.dim() != 2 or logp_old.shape != logp.shape:
        raise ValueError(f"logp and logp_old must both be (B, T); got {tuple(logp.shape)}, {tuple(logp_old.shape)}")
    if advantages.dim() == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages (B,) must have B={logp.shape[0]}, got {tuple(advantages.shape)}")
        advantages = advantages[:, None].expand_as(logp)
    elif advantages.shape != logp.shape:
        raise ValueError(f"advantages must be (B, T) or (B,), got {tuple(advantages.shape)}")
    return advantages


def ppo_clip_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    params: LossParams,
    agg: str = "token-mean",
    max_len: int | None = None,
    denominator: float | Tensor | None = None,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
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
        params: ``eps_low``, ``eps_high`` (clip range [1 - eps_low, 1 + eps_high]) and
            ``dual_clip`` (c > 1, or None for no dual clip).
        agg, max_len, denominator: see :func:`reasonrl.algos.aggregation.aggregate`.
        is_weights: optional (B, T) importance weights (constant), multiplied onto each token's
            clipped loss before aggregation (rollout/trainer mismatch correction, e.g. truncated IS).

    Returns:
        :class:`PolicyLossOutput`: the loss, the ratio and the clip masks, and metrics (python floats; 0.0 when no token is counted):
        ``pg_loss``; ``clipfrac_upper`` share of counted tokens with A > 0 and r > 1 + eps_high
        (upper clip active: their gradient is cut); ``clipfrac_lower`` A < 0 and r < 1 - eps_low;
        ``clipfrac`` their sum; ``clipfrac_dual`` (only when dual_clip is set) A < 0 and the dual
        cap active; ``approx_kl`` token-mean of the k3 estimator of KL(pi_old || pi_theta),
        (r - 1) - log r, which is >= 0 and unbiased for samples from pi_old; ``ratio_mean``,
        ``ratio_max`` over counted tokens.
    """
    advantages = _check_shapes(logp, logp_old, advantages)
    eps_low, eps_high, dual_clip = params.eps_low, params.eps_high, params.dual_clip
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
    if is_weights is not None:
        loss_mat = loss_mat * is_weights.detach().to(loss_mat.dtype)
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
    return PolicyLossOutput(loss, metrics, r, upper, lower)


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo-clip": ppo_clip_loss,
}
"""name → policy loss (``AlgoSpec.policy_loss``)."""


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss: str = "ppo-clip",
    agg: str = "token-mean",
    max_len: int | None = None,
    denominator: float | Tensor | None = None,
    is_weights: Tensor | None = None,
    **params: float | None,
) -> PolicyLossOutput:
    """The policy loss ``loss`` (a key of ``POLICY_LOSSES``) with ``LossParams(**params)``.

    Raises:
        ValueError: unknown loss (the message names the valid ones) or bad parameters.
    """
    try:
        fn = POLICY_LOSSES[loss]
    except KeyError:
        raise ValueError(f"unknown policy loss '{loss}'; valid: {', '.join(POLICY_LOSSES)}") from None
    return fn(logp, logp_old, advantages, mask, params=LossParams(**params), agg=agg, max_len=max_len, denominator=denominator,
              is_weights=is_weights)


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
