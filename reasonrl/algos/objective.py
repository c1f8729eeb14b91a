"""The policy's objective on a batch of tokens: the policy loss of the algo's row, plus the KL
penalty against a reference policy when it is a loss term, minus the entropy bonus, plus VAPO's
positive-example NLL.

    J = L_policy(r, A) + beta * agg(KL(pi || pi_ref)) - alpha * agg(H) + mu * L_NLL(correct responses)

Each term is a formula of its own module (``losses``, ``kl``, ``entropy``, ``aggregation``); this only composes
them the way the trainer applies them, so the combination reads in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from reasonrl.algos.aggregation import aggregate
from reasonrl.algos.entropy import entropy_bonus
from reasonrl.algos.kl import kl_penalty
from reasonrl.algos.losses import POLICY_LOSSES, LossParams, PolicyLossOutput, positive_example_nll
from reasonrl.algos.masked import pick

__all__ = ["ObjectiveInputs", "PolicyObjective", "policy_objective"]


@dataclass
class PolicyObjective:
    """What :func:`policy_objective` returns. ``loss``: the policy loss plus the KL and entropy
    terms (the part aggregated over this call's tokens, so a micro-batch weighs it by its share of
    the mini-batch); ``nll``: mu * L_NLL, already normalised by the given denominator (added
    unweighted; None when mu = 0); ``metrics``: the policy loss's (``pg_loss`` is then the policy
    loss plus the KL and entropy terms), with ``kl_ref`` when the KL term is on and
    ``entropy_loss`` (-alpha * agg(H)) when the bonus is; ``nll_metrics``: ``nll_loss``;
    ``policy``: the policy loss's own output (its detached ratio and clip masks)."""

    loss: Tensor
    nll: Tensor | None
    metrics: dict[str, float]
    nll_metrics: dict[str, float]
    policy: PolicyLossOutput


@dataclass(frozen=True)
class ObjectiveInputs:
    """What :func:`policy_objective` receives: the tensors of this call's tokens and the terms' knobs.

    Fields:
        logp, logp_old, advantages, mask, params, agg, max_len, is_weights: as every entry of
            ``POLICY_LOSSES`` (``loss`` names it); logp (B, T) with grad, the rest constants.
        ref_logp: (B, T) the reference policy's log-probs; the KL term is on when it is given and
            ``kl_coef`` (beta) > 0, estimated by ``kl_kind`` and aggregated with ``agg``.
        pos_lm_coef: mu (> 0 turns the NLL term on); ``correct``: (B,) bool, the responses it
            imitates; ``nll_denominator``: its D (``positive_example_nll``).
        entropy: (B, T) the sampling distribution's entropy at each token, with grad; the bonus is
            on when it is given and ``entropy_coef`` (alpha) > 0, aggregated with ``agg``
            (``entropy_bonus``).
    """

    logp: Tensor
    logp_old: Tensor
    advantages: Tensor
    mask: Tensor
    loss: str
    params: LossParams
    agg: str
    max_len: int | None = None
    is_weights: Tensor | None = None
    ref_logp: Tensor | None = None
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    pos_lm_coef: float = 0.0
    correct: Tensor | None = None
    nll_denominator: float | Tensor | None = None
    entropy: Tensor | None = None
    entropy_coef: float = 0.0


def policy_objective(x: ObjectiveInputs) -> PolicyObjective:
    """The policy objective J above, its terms and their metrics, of one :class:`ObjectiveInputs`."""
    out = pick(POLICY_LOSSES, x.loss, "policy loss")(x.logp, x.logp_old, x.advantages, x.mask, params=x.params, agg=x.agg,
                                                       max_len=x.max_len, is_weights=x.is_weights)
    total, m = out.loss, dict(out.metrics)
    if x.kl_coef > 0 and x.ref_logp is not None:
        kl_loss = aggregate(kl_penalty(x.logp, x.ref_logp, x.kl_kind), x.mask, x.agg, max_len=x.max_len)
        total = total + x.kl_coef * kl_loss
        m["kl_ref"] = float(kl_loss.detach())
    if x.entropy_coef > 0 and x.entropy is not None:
        ent_term, ent_m = entropy_bonus(x.entropy, x.mask, coef=x.entropy_coef, agg=x.agg, max_len=x.max_len)
        total = total + ent_term
        m.update(ent_m)
    m["pg_loss"] = float(total.detach())
    nll, nll_m = None, {}
    if x.pos_lm_coef > 0:
        if x.correct is None:
            raise ValueError("the positive-example NLL (pos_lm_coef > 0) needs correct (B,)")
        term, nll_m = positive_example_nll(x.logp, x.mask, x.correct, denominator=x.nll_denominator)
        nll = x.pos_lm_coef * term
    return PolicyObjective(total, nll, m, nll_m, out)
