"""The rollout/trainer mismatch: how far the sampler's probabilities are from the trainer's, and
truncated importance sampling (TIS) to correct for it.

The rollout engine (vLLM, often in another precision and with other kernels) and the trainer
compute different probabilities for the same token under the same weights, so the "on-policy"
batch is slightly off-policy. Yao et al. 2025 ("Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training", fengyao.notion.site) weight each token's loss by the truncated ratio
π_old(y_t) / π_sampler(y_t), capped at C (2 in the blog); verl (``rollout_is``, PR #2953) and TRL
(``vllm_importance_sampling_correction``) do the same. The weight is a constant (no gradient) that
multiplies the already-clipped per-token loss (``is_weights`` of every ``POLICY_LOSSES`` entry).

Shapes: (B, T) log-probabilities of the sampled tokens under the trainer (``logp_old``, the
policy before this step's updates) and under the sampler (``logp_sampler``, what the engine
returned); ``mask`` (B, T) the tokens that count in the loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.algos.masked import LOG_RATIO_CLAMP, as_bool_mask, masked_mean
from reasonrl.algos.offpolicy import ROLLOUT_CORRECTIONS

__all__ = ["mismatch_metrics", "truncated_is_weights", "TIS_LEVELS"]


@torch.no_grad()
def mismatch_metrics(logp_old: Tensor, logp_sampler: Tensor, mask: Tensor) -> dict[str, float]:
    """The gap between the trainer's and the sampler's log-probabilities over counted tokens.

        d_t = logp_old_t - logp_sampler_t
        logprob_diff_mean = mean |d_t|, logprob_diff_max = max |d_t|
        mismatch_kl = mean of k3 = (r - 1) - log r with r = exp(d_t): an estimate of
                      KL(π_sampler ‖ π_old) from the sampler's tokens (>= 0, 0 when equal)

    All 0.0 when no token is counted.
    """
    m = as_bool_mask(mask, logp_old)
    if not bool(m.any()):
        return {"logprob_diff_mean": 0.0, "logprob_diff_max": 0.0, "mismatch_kl": 0.0}
    d = (logp_old.double() - logp_sampler.double()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    k3 = torch.expm1(d) - d
    vals = torch.stack([masked_mean(d.abs(), m), d.abs()[m].max(), masked_mean(k3, m)]).tolist()
    return dict(zip(["logprob_diff_mean", "logprob_diff_max", "mismatch_kl"], vals))


TIS_LEVELS: dict[str, str] = {"token": "token-tis", "sequence": "sequence-tis"}
"""TIS level → its ``ROLLOUT_CORRECTIONS`` entry: "token" (one ratio per token) or "sequence" (the
product of a response's token ratios, the same weight on all its tokens)."""


@torch.no_grad()
def truncated_is_weights(logp_old: Tensor, logp_sampler: Tensor, mask: Tensor, *, cap: float,
                         level: str = "token") -> tuple[Tensor, dict[str, float]]:
    """Truncated importance-sampling weights (Yao et al. 2025), constant (no gradient), in fp32:
    the ``token-tis`` / ``sequence-tis`` entries of ``reasonrl.algos.offpolicy.ROLLOUT_CORRECTIONS``.

        token:     w_t = min(π_old(y_t) / π_sampler(y_t), C)
        sequence:  w_t = min(prod_{s in o} π_old(y_s) / π_sampler(y_s), C)   for every t of o

    Returns (B, T) weights (1.0 outside the mask) and metrics over counted tokens: ``tis_weight_mean``
    and ``tis_truncated_frac`` (share of tokens whose ratio exceeded C).

    Raises:
        ValueError: cap <= 0, an unknown level, or shapes that differ.
    """
    if cap <= 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    if level not in TIS_LEVELS:
        raise ValueError(f"unknown TIS level '{level}'; valid: {', '.join(TIS_LEVELS)}")
    if logp_old.shape != logp_sampler.shape or logp_old.dim() != 2:
        raise ValueError(f"logp_old and logp_sampler must both be (B, T); got {tuple(logp_old.shape)}, {tuple(logp_sampler.shape)}")
    m = as_bool_mask(mask, logp_old)
    c = ROLLOUT_CORRECTIONS[TIS_LEVELS[level]](logp_old.float() - logp_sampler.float(), m, cap=cap, low=0.0)
    stats = torch.stack([masked_mean(c.weights, m), masked_mean(c.truncated.float(), m)]).tolist()
    return c.weights, dict(zip(["tis_weight_mean", "tis_truncated_frac"], stats))
