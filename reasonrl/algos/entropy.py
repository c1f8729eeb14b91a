"""Entropy regularisation of the policy: the entropy bonus of verl / OpenRLHF, and Skywork-OR1's
adaptive entropy control, which moves the bonus's coefficient to hold the entropy near a target.

Shapes: B responses, T token positions; ``entropy`` (B, T) is the entropy of the sampling
distribution at each position (``reasonrl.algos.logits.entropy_from_logits``, with grad), ``mask``
(B, T) the counted tokens.
"""

from __future__ import annotations

from torch import Tensor

from reasonrl.algos.aggregation import aggregate

__all__ = ["entropy_bonus", "adaptive_entropy_coef"]


def entropy_bonus(entropy: Tensor, mask: Tensor, *, coef: float, agg: str, max_len: int | None = None) -> tuple[Tensor, dict[str, float]]:
    """The entropy bonus as a loss term, aggregated as the policy loss is:

        L_ent = -alpha * agg(H, M)

    added to the policy loss (so minimising it raises the entropy). verl's actor does
    ``policy_loss = pg_loss - entropy_coeff * agg_loss(entropy, response_mask, loss_agg_mode)``,
    with the policy loss's own ``loss_agg_mode``; OpenRLHF's ``--entropy_loss_coef`` is the same
    alpha. ``agg`` and ``max_len`` are ``reasonrl.algos.aggregation.aggregate``'s (token-mean: every
    token weighs the same; the seq modes: every response).

    Args:
        entropy: (B, T) per-token entropy, with grad.
        mask: (B, T) bool or 0/1, the policy loss's mask.
        coef: alpha >= 0.
        agg, max_len: the aggregation mode and its constant.

    Returns:
        (L_ent, {"entropy_loss": float(L_ent)}). A micro-batch's term, weighted by its share of the
        mini-batch as the policy loss is, adds up to the mini-batch's.
    """
    if coef < 0:
        raise ValueError(f"the entropy coefficient must be >= 0, got {coef}")
    term = -coef * aggregate(entropy, mask, agg, max_len=max_len)
    return term, {"entropy_loss": float(term.detach())}


def adaptive_entropy_coef(coef: float, entropy: float, *, target: float, delta: float, coef_max: float) -> tuple[float, bool]:
    """Skywork-OR1's adaptive entropy control (He et al., arXiv 2505.22312, "Adaptive Entropy
    Control"; ``EntController`` in SkyworkAI/Skywork-OR1 ``verl/trainer/ppo/core_algos.py``): after
    step k, from the entropy e_k of the step's batch,

        alpha_{k+1} = clip(alpha_k + delta, 0, alpha_max)   if e_k < target
                      clip(alpha_k - delta, 0, alpha_max)   otherwise
        c_{k+1}     = 1[e_k < target]

    and step k+1's policy loss takes the bonus c_{k+1} * alpha_{k+1} * H (:func:`entropy_bonus`):
    the coefficient rises while the entropy is below the target and falls (to 0 at least) above it,
    and the bonus is only applied on the steps after one whose entropy was below the target, so a
    policy above it is never pushed higher. Skywork-OR1's scripts: target 0.2, delta 1e-4, alpha_0 = 0,
    alpha_max = 5e-3; its entropy e_k is -mean log pi_old of the sampled tokens (an estimate of the
    same mean entropy).

    Args:
        coef: alpha_k >= 0, the coefficient step k used.
        entropy: e_k, the mean token entropy of step k's batch (before its update).
        target, delta, coef_max: the target entropy, the step of alpha (> 0), its cap alpha_max.

    Returns:
        (alpha_{k+1}, c_{k+1}) as (float, bool).
    """
    below = entropy < target
    new = coef + delta if below else coef - delta
    return min(max(new, 0.0), coef_max), below
