"""``AlgoSpec``: the table behind ``--algo``. One frozen row per algorithm; a new variant is a new
row (or ``get_algo(name).replace(...)``), never new control flow in the trainer.

| row    | advantage        | critic | lambda actor/critic | policy loss | eps low/high | loss agg                | DS | overlong filter/penalty | KL | pos. NLL |
|--------|------------------|--------|---------------------|-------------|--------------|-------------------------|----|-------------------------|----|----------|
| ppo    | gae              | yes    | 0.95 / 0.95         | ppo-clip    | 0.2 / 0.2    | token-mean              | no | no / no                 | 0  | 0        |
| vcppo  | gae              | yes*   | 0.95 / 1.0          | ppo-clip    | 0.2 / 0.2    | token-mean              | no | no / no                 | 0  | 0        |
| grpo   | grpo             | no     | -                   | ppo-clip    | 0.2 / 0.2    | seq-mean-token-mean     | no | no / no                 | 0  | 0        |
| dapo   | grpo             | no     | -                   | ppo-clip    | 0.2 / 0.28   | token-mean              | yes| yes / yes               | 0  | 0        |
| gspo   | grpo             | no     | -                   | gspo        | 3e-4 / 4e-4  | seq-mean-token-mean     | no | no / no                 | 0  | 0        |
| cispo  | grpo             | no     | -                   | cispo       | w in [0, 5]  | token-mean              | no | no / no                 | 0  | 0        |
| drgrpo | grpo (no std)    | no     | -                   | ppo-clip    | 0.2 / 0.2    | seq-mean-token-sum-norm | no | no / no                 | 0  | 0        |
| vapo   | gae              | yes*   | 1-1/(0.05 l) / 1.0  | ppo-clip    | 0.2 / 0.28   | token-mean              | no | no / no                 | 0  | 0.1      |

(* value pretraining required first.) No row corrects the sampler/trainer gap (``tis_cap`` and
``rollout_correction`` None: the papers' recipes); every row corrects tokens sampled by an older
policy (partial rollouts) with ``stale_correction`` token-tis, C = 2 (docs/algorithms.md, "Off-policy").
gamma = 1.0 everywhere; no row has an entropy bonus
(``entropy_coef`` 0, ``entropy_target`` None: ``--entropy-coef``, ``--entropy-target`` turn them on). ``clip-cov`` and ``kl-cov`` are
policy losses any row can take (``--policy-loss clip-cov``); Clip-Cov's authors run it with clip
ratios 1 / 1 (range [0, 2]: the covariance cut instead of PPO's clip) on GRPO advantages,
token-mean, with dynamic sampling: ``--algo grpo --policy-loss clip-cov --eps-low 1 --eps-high 1
--loss-agg token-mean --dynamic-sampling``. Every field is documented once, in
its ``metadata["help"]`` (``AlgoSpec.field_help(name)``); validation is in ``__post_init__`` and
raises ValueError saying what to change.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from reasonrl.algos.advantages import ADVANTAGE_ESTIMATORS, VAPO_ALPHA, AdvantageInputs
from reasonrl.algos.aggregation import AGG_MODES
from reasonrl.algos.kl import KL_ESTIMATORS
from reasonrl.algos.losses import POLICY_LOSSES, LossParams
from reasonrl.algos.masked import pick
from reasonrl.algos.mismatch import TIS_LEVELS
from reasonrl.algos.offpolicy import CORRECTION_MODES, ROLLOUT_CORRECTIONS, correction_bounds

__all__ = ["AlgoSpec", "ALGOS", "get_algo"]


def _f(default: Any, help: str, *, inf_ok: bool = False) -> Any:
    """A documented field; ``inf_ok``: a float that may be ``inf`` (an upper bound it turns off)."""
    return field(default=default, metadata={"help": help, "inf_ok": inf_ok})


def _default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _loss(name: str, help: str, *, inf_ok: bool = False) -> Any:
    """A policy-loss knob: its default is declared once, in ``LossParams`` (``loss_params`` passes it on)."""
    return _f(_default(LossParams, name), help, inf_ok=inf_ok)


def _adv(name: str, help: str) -> Any:
    """An advantage knob: its default is declared once, in ``AdvantageInputs`` (its field ``name``,
    which ``advantage_knobs`` passes it to)."""
    return field(default=_default(AdvantageInputs, name), metadata={"help": help, "advantage_input": name})


@dataclass(frozen=True)
class AlgoSpec:
    """One RL algorithm as data: which advantage estimator, losses and sampling rules to use."""

    name: str = _f("custom", "Row name, as given to --algo.")
    advantage: str = _f(
        "grpo", "Advantage estimator, a key of ADVANTAGE_ESTIMATORS: 'gae' (PPO, needs a critic) or 'grpo' (group-relative)."
    )
    use_critic: bool = _f(False, "Train a value model (required by, and only used with, advantage='gae').")
    gamma: float = _adv("gamma", "Discount of GAE (1.0 for outcome-reward reasoning tasks).")
    lam_actor: float = _adv("lam_actor", "GAE lambda for the policy's advantages (VC-PPO: 0.95; best range [0.95, 1.0)).")
    lam_critic: float = _adv("lam_critic", "GAE lambda for the critic's targets (VC-PPO: 1.0 = Monte-Carlo return with gamma=1).")
    adaptive_lambda: bool = _f(
        False, "Replace lam_actor per response by VAPO's 1 - 1/(adaptive_lambda_alpha * length) (gae only)."
    )
    adaptive_lambda_alpha: float = _f(VAPO_ALPHA, "VAPO's alpha for adaptive_lambda.")
    policy_loss: str = _f(
        "ppo-clip",
        "Policy loss, a key of POLICY_LOSSES: 'ppo-clip' (PPO / GRPO / DAPO clipped surrogate), 'gspo' (sequence-level ratio), "
        "'cispo' (clipped, detached IS weight), 'clip-cov' / 'kl-cov' (covariance-based token selection, arXiv 2505.22617).",
    )
    eps_low: float = _loss("eps_low", "Lower clip: the ratio is clipped at 1 - eps_low (A < 0); in [0, 1], 1: no lower clip.")
    eps_high: float = _loss("eps_high", "Upper clip: the ratio is clipped at 1 + eps_high (A > 0; DAPO Clip-Higher: 0.28; inf: no upper clip).", inf_ok=True)
    dual_clip: float | None = _loss("dual_clip", "Dual-clip constant c > 1: per-token loss capped at c*|A| when A < 0 (None: off; usual 3).")
    cispo_weight_min: float = _loss("cispo_weight_min", "CISPO: floor of the detached IS weight, an absolute value: w = clamp(r, min, max) (MiniMax-M1: none, 0).")
    cispo_weight_max: float = _loss("cispo_weight_max", "CISPO: cap of the detached IS weight, an absolute value, not 1 + eps (ScaleRL: 5; verl's clip_ratio_high 0.2 means 1.2; inf: no cap).",
                                    inf_ok=True)
    cov_clip_ratio: float = _loss("cov_clip_ratio", "Clip-Cov: fraction r of counted tokens whose gradient is cut, drawn at random among the candidates (paper: 2e-4).")
    cov_clip_low: float = _loss("cov_clip_low", "Clip-Cov: candidates have cov_clip_low < Cov(logp, A) < cov_clip_high, strict (paper: omega = (1, 5)).")
    cov_clip_high: float = _loss("cov_clip_high", "Clip-Cov: upper covariance bound of the candidates (paper: 5; inf: none).", inf_ok=True)
    kl_cov_ratio: float = _loss("kl_cov_ratio", "KL-Cov: fraction k of counted tokens, those of largest Cov(logp, A), that get the KL penalty (paper: 2e-3 for 7B, 2e-4 for 32B).")
    kl_cov_coef: float = _loss("kl_cov_coef", "KL-Cov: beta, weight of |logp - logp_old| on the selected tokens (paper: 1).")
    pos_lm_coef: float = _f(
        0.0, "Weight mu of the positive-example LM loss: NLL of the correct responses' tokens, token-mean over them, added to the policy loss (VAPO: 0.1; 0: off)."
    )
    entropy_coef: float = _f(
        0.0, "Entropy bonus alpha: the policy loss minus alpha * agg(H), H the entropy of the sampling distribution at each counted token, "
        "aggregated as loss_agg (verl's entropy_coeff, OpenRLHF's --entropy_loss_coef; 0: off). With entropy_target: the adaptive coefficient's start."
    )
    entropy_target: float | None = _f(
        None, "Adaptive entropy control (Skywork-OR1, arXiv 2505.22312): after each step alpha moves by entropy_coef_delta, up while the batch's "
        "mean token entropy is below this target, down (to 0) above it, and the bonus applies only after a step below it (None: off; Skywork-OR1: 0.2)."
    )
    entropy_coef_delta: float = _f(1e-4, "Adaptive entropy control: alpha's change per step (Skywork-OR1's scripts: 1e-4).")
    entropy_coef_max: float = _f(5e-3, "Adaptive entropy control: alpha's cap, alpha in [0, entropy_coef_max] (Skywork-OR1's scripts: 5e-3).")
    loss_agg: str = _f(
        "token-mean",
        "Loss aggregation, a key of AGG_MODES: 'token-mean' (DAPO), 'seq-mean-token-mean' (GRPO), "
        "'seq-mean-token-sum-norm' (Dr. GRPO).",
    )
    dynamic_sampling: bool = _f(False, "Keep only groups with 0 < #correct < G, over-sampling to fill the batch (DAPO).")
    overlong_filter: bool = _f(False, "Truncated responses (hit the cap without EOS) get mask 0: no loss (DAPO).")
    overlong_penalty: bool = _f(False, "Add the soft overlong punishment (DAPO eq. 13) to the reward.")
    kl_coef: float = _f(0.0, "Coefficient of the KL penalty against the reference policy (0: off, no reference model).")
    kl_kind: str = _f("k3", "KL estimator, a key of KL_ESTIMATORS: 'k1', 'k2' or 'k3'.")
    kl_in_reward: bool = _f(
        False, "Put the KL penalty into the per-token rewards (gae only) instead of adding it to the loss."
    )
    grpo_scale_by_std: bool = _adv("scale_by_std", "GRPO: divide by the group std (False: Dr. GRPO, mean-centring only).")
    pretrained_critic_required: bool = _f(
        False, "The critic must be value-pretrained (Monte-Carlo targets, fixed policy) before RL starts (VC-PPO)."
    )
    value_clip: float | None = _f(None, "Value-loss clip eps_v around the rollout-time value (None: plain MSE).")
    whiten_advantages: bool = _f(False, "Whiten advantages over the batch's valid tokens after estimation (PPO).")
    tis_cap: float | None = _f(
        None, "Truncated importance sampling (Yao et al. 2025): weight each token's loss by min(pi_old / pi_sampler, C), "
        "correcting the rollout engine's probabilities to the trainer's (None: off, as in the papers' rows; usual C = 2). "
        "The same as rollout_correction 'token-tis' (or 'sequence-tis' with tis_level) with correction_cap C."
    )
    tis_level: str = _f("token", "TIS ratio per 'token', or per 'sequence' (the product of a response's token ratios, on all its tokens).")
    rollout_correction: str | None = _f(
        None, "Off-policy correction of every token, a key of ROLLOUT_CORRECTIONS (weights from rho = pi_old / pi_behaviour): 'token-tis', "
        "'sequence-tis' (truncated at correction_cap), 'token-mask', 'sequence-mask' (MIS: the ratio kept between correction_low and "
        "correction_cap, rejected outside), 'geo-rs' (geometric-mean rejection), 'icepop' (token band); None: none (tis_cap is token-tis / sequence-tis "
        "by its older name). See docs/algorithms.md#off-policy."
    )
    correction_cap: float | None = _f(None, "Upper threshold C of rollout_correction (or of stale_correction); None: the estimator's default "
                                            "(token/sequence-tis 2, token/sequence-mask 3 as TRL, geo-rs 1.001, icepop 5).")
    correction_low: float | None = _f(None, "Lower threshold of the mask estimators (ratio below it: rejected); None: the estimator's default "
                                            "(0 for the masks as TRL, geo-rs 0.999, icepop 0.5).")
    correction_mode: str = _f(
        "decoupled", "'decoupled': the PPO ratio is pi / pi_old and the behaviour -> pi_old gap is weighted by the correction (three policies); "
        "'bypass': pi_old := the behaviour policy (the PPO ratio and its clip are against the sampler's log-probs; no weight)."
    )
    stale_correction: str | None = _f(
        "token-tis", "The correction applied by default to tokens sampled by an older policy (partial rollouts) when neither rollout_correction "
        "nor tis_cap is set: a key of ROLLOUT_CORRECTIONS, on the stale tokens only (a sequence-level one: on the responses holding them); "
        "None turns it off (stale tokens then train uncorrected)."
    )
    max_staleness: int | None = _f(
        None, "Partial rollouts: the most policy versions (steps) a trained token may lag the policy it trains; a response older than that "
        "is regenerated from its prompt (counted: rollout/partial_stale_regenerated). 0: no stale token; None: no bound."
    )
    mask_stale_prefix: bool = _f(False, "Partial rollouts: tokens sampled by an older policy get no loss (slime's choice); only the part "
                                        "of each response sampled by the step's policy trains.")

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"algo '{self.name}': {msg}")

        for f in dataclasses.fields(self):  # every float knob: never NaN, infinite only where it turns a bound off
            v = getattr(self, f.name)
            if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and not f.metadata.get("inf_ok"))):
                bad(f"{f.name} must be a finite number{' (or inf: no bound)' if f.metadata.get('inf_ok') else ''}, got {v}")

        if self.advantage not in ADVANTAGE_ESTIMATORS:
            bad(f"advantage must be one of {', '.join(sorted(ADVANTAGE_ESTIMATORS))}, got '{self.advantage}'")
        if self.advantage == "gae" and not self.use_critic:
            bad("advantage='gae' needs use_critic=True")
        if self.advantage != "gae" and self.use_critic:
            bad(f"use_critic=True is only used with advantage='gae' (got '{self.advantage}')")
        if self.pretrained_critic_required and not self.use_critic:
            bad("pretrained_critic_required needs use_critic=True")
        if not 0.0 < self.gamma <= 1.0:
            bad(f"gamma must be in (0, 1], got {self.gamma}")
        for k in ("lam_actor", "lam_critic"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                bad(f"{k} must be in [0, 1], got {getattr(self, k)}")
        if self.adaptive_lambda and self.advantage != "gae":
            bad("adaptive_lambda only applies to advantage='gae'")
        if self.adaptive_lambda_alpha <= 0:
            bad(f"adaptive_lambda_alpha must be > 0, got {self.adaptive_lambda_alpha}")
        try:
            self.loss_params()
        except ValueError as e:
            bad(str(e))
        if self.pos_lm_coef < 0:
            bad(f"pos_lm_coef must be >= 0, got {self.pos_lm_coef}")
        if self.entropy_coef < 0:
            bad(f"entropy_coef must be >= 0, got {self.entropy_coef}")
        if self.entropy_target is not None and self.entropy_target < 0:
            bad(f"entropy_target must be >= 0 (an entropy, in nats) or None, got {self.entropy_target}")
        if self.entropy_coef_delta <= 0 or self.entropy_coef_max < 0:
            bad(f"need entropy_coef_delta > 0 and entropy_coef_max >= 0, got {self.entropy_coef_delta}, {self.entropy_coef_max}")
        if self.entropy_target is not None and self.entropy_coef > self.entropy_coef_max:
            bad(f"entropy_coef {self.entropy_coef} (the adaptive coefficient's start) exceeds entropy_coef_max {self.entropy_coef_max}: lower it or raise the cap")
        if self.policy_loss not in POLICY_LOSSES:
            bad(f"policy_loss must be one of {', '.join(POLICY_LOSSES)}, got '{self.policy_loss}'")
        if self.loss_agg not in AGG_MODES:
            bad(f"loss_agg must be one of {', '.join(AGG_MODES)}, got '{self.loss_agg}'")
        if self.kl_kind not in KL_ESTIMATORS:
            bad(f"kl_kind must be one of {', '.join(KL_ESTIMATORS)}, got '{self.kl_kind}'")
        if self.kl_coef < 0:
            bad(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_in_reward and self.advantage != "gae":
            bad("kl_in_reward needs advantage='gae' (group advantages take one reward per response); use the loss")
        if self.tis_cap is not None and self.tis_cap <= 0:
            bad(f"tis_cap must be > 0 or None, got {self.tis_cap}")
        if self.tis_level not in TIS_LEVELS:
            bad(f"tis_level must be one of {', '.join(TIS_LEVELS)}, got '{self.tis_level}'")
        for k in ("rollout_correction", "stale_correction"):
            if getattr(self, k) is not None and getattr(self, k) not in ROLLOUT_CORRECTIONS:
                bad(f"{k} must be one of {', '.join(ROLLOUT_CORRECTIONS)} or None, got '{getattr(self, k)}'")
        if self.rollout_correction is not None and self.tis_cap is not None:
            bad("tis_cap and rollout_correction both set: choose one (tis_cap C is rollout_correction 'token-tis' with correction_cap C)")
        if self.correction_mode not in CORRECTION_MODES:
            bad(f"correction_mode must be one of {', '.join(CORRECTION_MODES)}, got '{self.correction_mode}'")
        if self.correction_mode == "bypass" and (self.rollout_correction is not None or self.tis_cap is not None):
            bad("correction_mode 'bypass' sets pi_old := the behaviour policy, so there is no ratio to weight: drop rollout_correction / "
                "tis_cap, or use correction_mode 'decoupled'")
        used = self.rollout_correction or self.stale_correction
        if used is not None:
            cap, low = correction_bounds(used, self.correction_cap, self.correction_low)
            if not (cap > 0 and 0 <= low <= cap):
                bad(f"{used} needs 0 <= correction_low <= correction_cap and correction_cap > 0, got low {low}, cap {cap}")
        if self.max_staleness is not None and self.max_staleness < 0:
            bad(f"max_staleness must be >= 0 (versions) or None, got {self.max_staleness}")
        if self.value_clip is not None and self.value_clip <= 0:
            bad(f"value_clip must be > 0 or None, got {self.value_clip}")

    def replace(self, **overrides: Any) -> "AlgoSpec":
        """A copy with some fields changed (validated again). Unknown field: ValueError."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown AlgoSpec field(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        return dataclasses.replace(self, **overrides)

    @classmethod
    def field_help(cls, name: str) -> str:
        """The documentation of field ``name``."""
        for f in dataclasses.fields(cls):
            if f.name == name:
                return str(f.metadata.get("help", ""))
        raise ValueError(f"unknown AlgoSpec field '{name}'")

    def loss_params(self, generator: torch.Generator | None = None) -> LossParams:
        """The policy loss's knobs from this row; ``generator`` feeds the covariance losses' random draws."""
        names = [f.name for f in dataclasses.fields(LossParams) if f.name != "generator"]
        return LossParams(**{k: getattr(self, k) for k in names}, generator=generator)

    def advantage_knobs(self) -> dict[str, Any]:
        """The advantage estimator's knobs from this row, by ``AdvantageInputs`` field name."""
        return {f.metadata["advantage_input"]: getattr(self, f.name) for f in dataclasses.fields(self) if "advantage_input" in f.metadata}

    def as_dict(self) -> dict[str, Any]:
        """The row as a plain dict (for logging / run metadata)."""
        return dataclasses.asdict(self)


_PPO = AlgoSpec(
    name="ppo",
    advantage="gae",
    use_critic=True,
    lam_actor=0.95,
    lam_critic=0.95,
    eps_low=0.2,
    eps_high=0.2,
    loss_agg="token-mean",
    value_clip=0.2,  # reasonrl default for outcome rewards of +-1; not a paper setting
    whiten_advantages=True,  # as verl's GAE
)

# group-relative advantages with the std, clip 0.2 / 0.2, no critic, no KL: the field defaults
_GRPO = AlgoSpec(name="grpo", advantage="grpo", loss_agg="seq-mean-token-mean")

ALGOS: dict[str, AlgoSpec] = {
    "ppo": _PPO,
    # VC-PPO (arXiv 2503.01491): decoupled GAE (lam_critic = 1.0) + value pretraining.
    "vcppo": _PPO.replace(name="vcppo", lam_critic=1.0, pretrained_critic_required=True),  # lam_actor 0.95: ppo's
    # GRPO as published (sequence-mean loss); reasonrl turns its KL off by default (GRPO-zero).
    "grpo": _GRPO,
    # DAPO (arXiv 2503.14476): Clip-Higher, token-level loss, dynamic sampling, overlong
    # filtering + soft punishment, no KL.
    "dapo": _GRPO.replace(name="dapo", eps_high=0.28, loss_agg="token-mean", dynamic_sampling=True, overlong_filter=True,
                          overlong_penalty=True),
    # GSPO (arXiv 2507.18071): sequence-level, length-normalised ratio; the paper's clip range;
    # seq-mean aggregation (verl forces it); no KL. The paper splits each rollout batch into 4
    # mini-batches (--mini-batch-size = batch / 4): with one, GSPO equals GRPO.
    "gspo": _GRPO.replace(name="gspo", policy_loss="gspo", eps_low=3e-4, eps_high=4e-4),
    # CISPO (MiniMax-M1, arXiv 2506.13585): clipped detached IS weight, every token keeps its
    # gradient; token-mean; group-normalised advantages; no KL.
    "cispo": _GRPO.replace(name="cispo", policy_loss="cispo", loss_agg="token-mean"),  # IS weight clipped to [0, 5]: the field defaults
    # Dr. GRPO (arXiv 2503.20783): no std normalisation, token sums over a constant (the
    # generation cap, passed by the learner) then the mean over responses.
    "drgrpo": _GRPO.replace(name="drgrpo", grpo_scale_by_std=False, loss_agg="seq-mean-token-sum-norm"),
    # VAPO (arXiv 2504.05118): value pretraining + decoupled GAE (lam_critic = 1) + length-adaptive
    # lam_actor = 1 - 1/(0.05 l), token-level loss, clip-higher, positive-example NLL (mu = 0.1).
    # Group sampling (the paper: 512 prompts x 16 samples) is --prompts-per-step x --group-size.
    # Value clip 0.2 and advantage whitening as ppo (the paper fixes neither; NeMo-RL whitens too).
    "vapo": _PPO.replace(name="vapo", lam_critic=1.0, adaptive_lambda=True, eps_high=0.28,  # alpha 0.05: the field default
                         pretrained_critic_required=True, pos_lm_coef=0.1),
}
"""The --algo table: name -> AlgoSpec."""


def get_algo(name: str) -> AlgoSpec:
    """The row ``name`` of ``ALGOS``; ValueError naming the valid names if unknown."""
    return pick(ALGOS, name, "algo")
