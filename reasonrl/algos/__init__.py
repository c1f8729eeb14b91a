"""reasonrl.algos: the RL formulas, one pure function each (tensors and masks in, tensors and
python-float metrics out), plus the ``AlgoSpec`` table behind ``--algo``.

Imports torch and the standard library only. Every formula is documented with its equation and
tensor shapes; variants live in name -> function registries (``ADVANTAGE_ESTIMATORS``,
``POLICY_LOSSES``, ``AGG_MODES``, ``KL_ESTIMATORS``, ``ROLLOUT_CORRECTIONS``), each with one keyword signature, and
algorithms in ``ALGOS`` (an ``AlgoSpec`` row names its entries).
"""

from reasonrl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    adaptive_lambda,
    compute_advantages,
    decoupled_gae,
    gae,
    grpo_advantages,
    outcome_token_rewards,
)
from reasonrl.algos.aggregation import AGG_MODES, aggregate
from reasonrl.algos.entropy import adaptive_entropy_coef, entropy_bonus
from reasonrl.algos.kl import KL_ESTIMATORS, kl_penalty
from reasonrl.algos.logits import Sampling, entropy_from_logits, logprobs_from_logits, sampling_logits
from reasonrl.algos.losses import (
    POLICY_LOSSES,
    LossParams,
    PolicyLossOutput,
    cispo_loss,
    clip_cov_loss,
    gspo_loss,
    kl_cov_loss,
    policy_loss,
    positive_example_nll,
    ppo_clip_loss,
    token_covariance,
    value_loss,
)
from reasonrl.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten
from reasonrl.algos.diagnostics import clip_by_prob_bucket, explained_variance, mean_by_position
from reasonrl.algos.mismatch import TIS_LEVELS, mismatch_metrics, truncated_is_weights
from reasonrl.algos.offpolicy import (
    CORRECTION_DEFAULTS,
    CORRECTION_LEVELS,
    CORRECTION_MODES,
    ROLLOUT_CORRECTIONS,
    correction_bounds,
    offpolicy_diagnostics,
    proximal_logp,
    rollout_correction,
)
from reasonrl.algos.shaping import informative_groups, soft_overlong_punishment
from reasonrl.algos.spec import ALGOS, AlgoSpec, get_algo

__all__ = [
    # advantages
    "grpo_advantages",
    "gae",
    "decoupled_gae",
    "adaptive_lambda",
    "outcome_token_rewards",
    "compute_advantages",
    "ADVANTAGE_ESTIMATORS",
    # losses
    "aggregate",
    "AGG_MODES",
    "POLICY_LOSSES",
    "LossParams",
    "PolicyLossOutput",
    "policy_loss",
    "ppo_clip_loss",
    "gspo_loss",
    "cispo_loss",
    "clip_cov_loss",
    "kl_cov_loss",
    "token_covariance",
    "positive_example_nll",
    "value_loss",
    "kl_penalty",
    "KL_ESTIMATORS",
    # entropy regularisation
    "entropy_bonus",
    "adaptive_entropy_coef",
    # logits
    "entropy_from_logits",
    "logprobs_from_logits",
    "Sampling",
    "sampling_logits",
    # rewards / sampling
    "soft_overlong_punishment",
    "informative_groups",
    # rollout/trainer mismatch
    "mismatch_metrics",
    "truncated_is_weights",
    "TIS_LEVELS",
    # off-policy corrections (behaviour -> proximal -> current)
    "ROLLOUT_CORRECTIONS",
    "CORRECTION_DEFAULTS",
    "CORRECTION_LEVELS",
    "CORRECTION_MODES",
    "correction_bounds",
    "rollout_correction",
    "offpolicy_diagnostics",
    "proximal_logp",
    # masked helpers
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    # metrics
    "clip_by_prob_bucket",
    "mean_by_position",
    "explained_variance",
    # algorithm table
    "AlgoSpec",
    "ALGOS",
    "get_algo",
]
