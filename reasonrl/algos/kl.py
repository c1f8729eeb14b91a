"""KL estimators between the policy and a reference policy, from samples of the policy
(Schulman's k1 / k2 / k3; ``KL_ESTIMATORS``)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from reasonrl.algos.masked import LOG_RATIO_CLAMP, pick

__all__ = ["KL_ESTIMATORS", "kl_penalty"]




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
    fn = pick(KL_ESTIMATORS, kind, "KL estimator")
    if logp.shape != logp_ref.shape:
        raise ValueError(f"logp and logp_ref shapes differ: {tuple(logp.shape)} vs {tuple(logp_ref.shape)}")
    return fn(logp, logp_ref)
