"""The --algo table: rows have the specified values; unknown names raise; replace re-validates."""

from __future__ import annotations

import dataclasses

import pytest

from reasonrl.algos import ADVANTAGE_ESTIMATORS, AGG_MODES, ALGOS, KL_ESTIMATORS, AlgoSpec, get_algo


def test_rows_present() -> None:
    assert set(ALGOS) == {"ppo", "vcppo", "grpo", "dapo", "gspo", "cispo", "drgrpo", "vapo"}
    for name, spec in ALGOS.items():
        assert spec.name == name
        assert spec.advantage in ADVANTAGE_ESTIMATORS and spec.loss_agg in AGG_MODES and spec.kl_kind in KL_ESTIMATORS
        assert spec.gamma == 1.0


def test_ppo_row() -> None:
    s = get_algo("ppo")
    assert (s.advantage, s.use_critic, s.lam_actor, s.lam_critic) == ("gae", True, 0.95, 0.95)
    assert (s.eps_low, s.eps_high, s.loss_agg) == (0.2, 0.2, "token-mean")
    assert s.whiten_advantages and not s.pretrained_critic_required
    assert not (s.dynamic_sampling or s.overlong_filter or s.overlong_penalty)
    assert s.kl_coef == 0.0 and s.dual_clip is None


def test_vcppo_row() -> None:
    s = get_algo("vcppo")
    assert (s.advantage, s.use_critic, s.lam_actor, s.lam_critic) == ("gae", True, 0.95, 1.0)
    assert s.pretrained_critic_required
    assert (s.eps_low, s.eps_high) == (0.2, 0.2)


def test_grpo_row() -> None:
    s = get_algo("grpo")
    assert (s.advantage, s.use_critic) == ("grpo", False)
    assert (s.eps_low, s.eps_high, s.loss_agg) == (0.2, 0.2, "seq-mean-token-mean")
    assert s.kl_coef == 0.0 and s.grpo_scale_by_std
    assert not (s.dynamic_sampling or s.overlong_filter or s.overlong_penalty or s.whiten_advantages)


def test_dapo_row() -> None:
    s = get_algo("dapo")
    assert (s.advantage, s.use_critic) == ("grpo", False)
    assert (s.eps_low, s.eps_high, s.loss_agg) == (0.2, 0.28, "token-mean")
    assert s.dynamic_sampling and s.overlong_filter and s.overlong_penalty
    assert s.kl_coef == 0.0 and not s.whiten_advantages


def test_gspo_row() -> None:
    s = get_algo("gspo")
    assert (s.advantage, s.policy_loss, s.loss_agg) == ("grpo", "gspo", "seq-mean-token-mean")
    assert (s.eps_low, s.eps_high) == (3e-4, 4e-4) and s.grpo_scale_by_std and s.kl_coef == 0.0


def test_cispo_row() -> None:
    s = get_algo("cispo")
    assert (s.advantage, s.policy_loss, s.loss_agg) == ("grpo", "cispo", "token-mean")
    p = s.loss_params()
    assert (p.cispo_weight_min, p.cispo_weight_max) == (0.0, 5.0) and s.kl_coef == 0.0
    with pytest.raises(ValueError, match="cispo_weight"):
        s.replace(cispo_weight_max=0.2)


def test_drgrpo_row() -> None:
    s = get_algo("drgrpo")
    assert (s.advantage, s.policy_loss, s.loss_agg) == ("grpo", "ppo-clip", "seq-mean-token-sum-norm")
    assert not s.grpo_scale_by_std and (s.eps_low, s.eps_high) == (0.2, 0.2) and s.kl_coef == 0.0


def test_vapo_row() -> None:
    s = get_algo("vapo")
    assert (s.advantage, s.use_critic, s.pretrained_critic_required, s.lam_critic) == ("gae", True, True, 1.0)
    assert s.adaptive_lambda and s.adaptive_lambda_alpha == 0.05
    assert (s.eps_low, s.eps_high, s.loss_agg, s.policy_loss) == (0.2, 0.28, "token-mean", "ppo-clip")
    assert s.pos_lm_coef == 0.1 and s.kl_coef == 0.0
    with pytest.raises(ValueError, match="pos_lm_coef"):
        s.replace(pos_lm_coef=-1.0)


def test_cov_losses_fit_any_row_and_params_validate() -> None:
    for name in ALGOS:
        for loss in ("clip-cov", "kl-cov"):
            assert get_algo(name).replace(policy_loss=loss).policy_loss == loss
    p = get_algo("dapo").replace(policy_loss="clip-cov", cov_clip_ratio=1e-3).loss_params()
    assert (p.cov_clip_ratio, p.cov_clip_low, p.cov_clip_high, p.kl_cov_ratio, p.kl_cov_coef, p.eps_high) == (1e-3, 1.0, 5.0, 2e-3, 1.0, 0.28)
    with pytest.raises(ValueError, match="cov_clip_low"):
        get_algo("grpo").replace(cov_clip_low=6.0)
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        get_algo("grpo").replace(kl_cov_ratio=2.0)


def test_unknown_name_raises_naming_valid() -> None:
    with pytest.raises(ValueError, match="ppo, vcppo, grpo, dapo"):
        get_algo("reinforce")


def test_frozen_and_replace_revalidates() -> None:
    s = get_algo("dapo")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.eps_high = 0.3  # type: ignore[misc]
    s2 = s.replace(eps_high=0.3, name="dapo-wide")
    assert s2.eps_high == 0.3 and s.eps_high == 0.28 and ALGOS["dapo"].eps_high == 0.28
    with pytest.raises(ValueError, match="loss_agg"):
        s.replace(loss_agg="sum")
    with pytest.raises(ValueError, match="unknown AlgoSpec field"):
        s.replace(epsilon=0.1)
    with pytest.raises(ValueError, match="use_critic"):
        s.replace(advantage="gae")
    with pytest.raises(ValueError):
        get_algo("ppo").replace(dual_clip=0.5)
    with pytest.raises(ValueError, match="kl_kind"):
        s.replace(kl_kind="k4")
    with pytest.raises(ValueError, match="kl_in_reward"):
        s.replace(kl_in_reward=True)
    assert get_algo("ppo").replace(dual_clip=3.0, adaptive_lambda=True).dual_clip == 3.0


def test_every_field_documented() -> None:
    for f in dataclasses.fields(AlgoSpec):
        assert AlgoSpec.field_help(f.name), f.name
    with pytest.raises(ValueError):
        AlgoSpec.field_help("nope")
    assert get_algo("grpo").as_dict()["loss_agg"] == "seq-mean-token-mean"


def test_loss_and_advantage_knobs_take_their_defaults_from_one_place() -> None:
    """Each knob's default is declared once: the policy-loss knobs in LossParams, the advantage
    knobs in AdvantageInputs; AlgoSpec's fields of the same name carry those defaults."""
    import dataclasses

    from reasonrl.algos import AlgoSpec, LossParams
    from reasonrl.algos.advantages import AdvantageInputs

    spec = {f.name: f.default for f in dataclasses.fields(AlgoSpec)}
    loss = {f.name: f.default for f in dataclasses.fields(LossParams) if f.name != "generator"}
    assert loss and all(spec[k] == v for k, v in loss.items()), "every LossParams knob is an AlgoSpec field with its default"
    adv = {f.name: f.default for f in dataclasses.fields(AdvantageInputs)}
    assert (spec["gamma"], spec["lam_actor"], spec["lam_critic"], spec["grpo_scale_by_std"]) == (
        adv["gamma"], adv["lam_actor"], adv["lam_critic"], adv["scale_by_std"])
    knobs = AlgoSpec(grpo_scale_by_std=False, gamma=0.9).advantage_knobs()  # what the learner passes to the estimator
    assert knobs == {"gamma": 0.9, "lam_actor": adv["lam_actor"], "lam_critic": adv["lam_critic"], "scale_by_std": False}
