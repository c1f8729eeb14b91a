"""Advantages: GRPO, GAE, decoupled GAE, adaptive lambda, the estimator registry."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algos import (
    ADVANTAGE_ESTIMATORS,
    adaptive_lambda,
    compute_advantages,
    decoupled_gae,
    gae,
    grpo_advantages,
    outcome_token_rewards,
)
from reasonrl.algos import reference as ref


def prefix_mask(B: int, T: int, seed: int) -> torch.Tensor:
    lengths = ref.prefix_mask_lengths(B, T, seed)
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


# ---------------------------------------------------------------- GRPO


@pytest.mark.parametrize("groups,G", [(1, 1), (3, 1), (2, 2), (4, 5), (3, 16)])
@pytest.mark.parametrize("scale", [True, False])
def test_grpo_matches_reference(groups: int, G: int, scale: bool) -> None:
    g = torch.Generator().manual_seed(groups * 100 + G)
    r = torch.randn(groups * G, generator=g, dtype=torch.float64)
    got = grpo_advantages(r, G, scale_by_std=scale)
    want = ref.grpo(r.tolist(), G, scale_by_std=scale)
    assert got.shape == (groups * G,)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


def test_grpo_constant_group_is_zero() -> None:
    r = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
    assert torch.equal(grpo_advantages(r, 4), torch.zeros(8))
    assert torch.equal(grpo_advantages(r, 4, scale_by_std=False), torch.zeros(8))


def test_grpo_uses_bessel_std() -> None:
    # group {1, -1}: mean 0, Bessel std = sqrt(2), population std would be 1
    a = grpo_advantages(torch.tensor([1.0, -1.0]), 2, eps=0.0)
    torch.testing.assert_close(a, torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2)]))
    # group {1, -1, -1, -1}: mean -0.5, Bessel std = 1
    a = grpo_advantages(torch.tensor([1.0, -1.0, -1.0, -1.0]), 4, eps=0.0)
    torch.testing.assert_close(a, torch.tensor([1.5, -0.5, -0.5, -0.5]))


def test_grpo_dr_grpo_is_mean_centring() -> None:
    a = grpo_advantages(torch.tensor([3.0, 1.0, 2.0, 2.0]), 2, scale_by_std=False)
    torch.testing.assert_close(a, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_grpo_group_of_one_is_zero() -> None:
    assert torch.equal(grpo_advantages(torch.tensor([1.0, -1.0, 5.0]), 1), torch.zeros(3))


def test_grpo_rejects_bad_layout() -> None:
    with pytest.raises(ValueError, match="multiple"):
        grpo_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(4), 0)


# ---------------------------------------------------------------- GAE


@pytest.mark.parametrize("B,T", [(1, 1), (2, 1), (3, 7), (6, 23)])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.9, 0.8), (0.99, 0.0)])
def test_gae_matches_reference(B: int, T: int, gamma: float, lam: float) -> None:
    g = torch.Generator().manual_seed(B * 1000 + T)
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = prefix_mask(B, T, seed=B + T)
    adv, ret = gae(r, v, m, gamma=gamma, lam=lam)
    want_a, want_r = ref.gae(r.tolist(), v.tolist(), m.int().tolist(), gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(want_a, dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor(want_r, dtype=torch.float64))
    assert torch.all(adv[~m] == 0) and torch.all(ret[~m] == 0)


def test_gae_ignores_values_and_rewards_outside_mask() -> None:
    r = torch.tensor([[0.0, 1.0, 5.0, 7.0]])
    v = torch.tensor([[0.2, 0.3, 9.0, -9.0]])
    m = torch.tensor([[1, 1, 0, 0]])
    adv, ret = gae(r, v, m, gamma=1.0, lam=1.0)
    # value after the last valid token is 0: A_1 = 1 - 0.3, A_0 = 0 + 0.3 - 0.2 + A_1
    torch.testing.assert_close(adv, torch.tensor([[0.8, 0.7, 0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))


def test_gae_gamma_lambda_one_is_reward_to_go_minus_value() -> None:
    g = torch.Generator().manual_seed(0)
    r = torch.randn(5, 9, generator=g, dtype=torch.float64)
    v = torch.randn(5, 9, generator=g, dtype=torch.float64)
    m = prefix_mask(5, 9, seed=3)
    rz = torch.where(m, r, torch.zeros(()).double())
    rtg = rz.flip(-1).cumsum(-1).flip(-1)
    adv, ret = gae(r, v, m, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.where(m, rtg - v, torch.zeros(()).double()))
    torch.testing.assert_close(ret, torch.where(m, rtg, torch.zeros(()).double()))


def test_gae_lambda_decay_hand_example() -> None:
    # outcome reward 1 at the end, V = 0: A_t = (gamma*lam)^(L-1-t)
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    adv, ret = gae(r, torch.zeros(1, 4), torch.ones(1, 4), gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.125, 0.25, 0.5, 1.0]]))
    torch.testing.assert_close(ret, adv)


def test_gae_per_response_lambda_tensor() -> None:
    g = torch.Generator().manual_seed(1)
    B, T = 4, 11
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = prefix_mask(B, T, seed=1)
    lam = torch.tensor([0.0, 0.5, 0.95, 1.0], dtype=torch.float64)
    adv, ret = gae(r, v, m, gamma=1.0, lam=lam)
    want_a, want_r = ref.gae(r.tolist(), v.tolist(), m.int().tolist(), 1.0, lam.tolist())
    torch.testing.assert_close(adv, torch.tensor(want_a, dtype=torch.float64))
    for i in range(B):  # each row equals a scalar-lambda call
        a_i, r_i = gae(r[i : i + 1], v[i : i + 1], m[i : i + 1], gamma=1.0, lam=float(lam[i]))
        torch.testing.assert_close(adv[i : i + 1], a_i)
        torch.testing.assert_close(ret[i : i + 1], r_i)


def test_gae_non_prefix_mask_bridges_holes() -> None:
    g = torch.Generator().manual_seed(2)
    r = torch.randn(3, 8, generator=g, dtype=torch.float64)
    v = torch.randn(3, 8, generator=g, dtype=torch.float64)
    m = torch.rand(3, 8, generator=g) > 0.4
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.7)
    want_a, want_r = ref.gae(r.tolist(), v.tolist(), m.int().tolist(), 0.9, 0.7)
    torch.testing.assert_close(adv, torch.tensor(want_a, dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor(want_r, dtype=torch.float64))


def test_gae_half_precision_inputs_and_no_grad() -> None:
    v = torch.randn(2, 5, requires_grad=True)
    adv, ret = gae(torch.randn(2, 5).bfloat16(), v, torch.ones(2, 5), gamma=1.0, lam=0.95)
    assert adv.dtype == torch.float32 and not adv.requires_grad and not ret.requires_grad


def test_gae_rejects_bad_args() -> None:
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        gae(z, torch.zeros(2, 4), z, gamma=1.0, lam=1.0)
    with pytest.raises(ValueError):
        gae(z, z, z, gamma=1.0, lam=1.5)
    with pytest.raises(ValueError):
        gae(z, z, z, gamma=1.0, lam=torch.ones(3))


@pytest.mark.parametrize("B,T", [(1, 1), (5, 13)])
def test_decoupled_gae_equals_two_gae_calls(B: int, T: int) -> None:
    g = torch.Generator().manual_seed(B + T)
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = prefix_mask(B, T, seed=7)
    lam_a = torch.rand(B, generator=g, dtype=torch.float64)
    for la in (0.95, lam_a):
        adv, ret = decoupled_gae(r, v, m, gamma=1.0, lam_actor=la, lam_critic=1.0)
        torch.testing.assert_close(adv, gae(r, v, m, gamma=1.0, lam=la)[0])
        torch.testing.assert_close(ret, gae(r, v, m, gamma=1.0, lam=1.0)[1])


def test_decoupled_critic_targets_are_monte_carlo_returns() -> None:
    # outcome reward R on the last token, gamma = lam_critic = 1: every target is R
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    r = outcome_token_rewards(torch.tensor([1.0, -1.0]), m)
    v = torch.full((2, 4), 0.3)
    adv, ret = decoupled_gae(r, v, m, gamma=1.0, lam_actor=0.95, lam_critic=1.0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0], [-1.0, -1.0, -1.0, -1.0]]))
    # the actor's advantage at the first token is damped by 0.95^(L-1) (plus the value terms)
    want0 = (1.0 - 0.3) * 0.95**2  # deltas 0, 0, 0.7
    torch.testing.assert_close(adv[0, 0], torch.tensor(want0))


# ---------------------------------------------------------------- adaptive lambda


def test_adaptive_lambda_values_and_clamp() -> None:
    lam = adaptive_lambda(torch.tensor([0, 1, 10, 20, 400, 2000]), alpha=0.05)
    torch.testing.assert_close(lam, torch.tensor([0.0, 0.0, 0.0, 0.0, 0.95, 0.99]))
    assert adaptive_lambda([100]).dtype == torch.float32
    with pytest.raises(ValueError):
        adaptive_lambda([10], alpha=0.0)


# ---------------------------------------------------------------- registry


def test_outcome_token_rewards_last_valid_token() -> None:
    m = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    out = outcome_token_rewards(torch.tensor([2.0, 3.0, -1.0]), m)
    torch.testing.assert_close(out, torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, -1.0]]))


def test_compute_advantages_grpo_broadcasts_over_mask() -> None:
    rewards = torch.tensor([1.0, -1.0, 1.0, 1.0])
    m = prefix_mask(4, 6, seed=4)
    adv, ret = compute_advantages("grpo", rewards=rewards, mask=m, group_size=2)
    assert ret is None
    a = grpo_advantages(rewards, 2)
    torch.testing.assert_close(adv, torch.where(m, a[:, None].expand(4, 6), torch.zeros(())))


def test_compute_advantages_gae_places_reward_and_decouples() -> None:
    g = torch.Generator().manual_seed(5)
    B, T = 4, 9
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = prefix_mask(B, T, seed=5)
    kl = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.01
    adv, ret = compute_advantages(
        "gae", rewards=rewards, mask=m, values=v, token_rewards=kl, gamma=1.0, lam_actor=0.95, lam_critic=1.0
    )
    tr = outcome_token_rewards(rewards, m) + kl
    want_a, want_r = decoupled_gae(tr, v, m, gamma=1.0, lam_actor=0.95, lam_critic=1.0)
    torch.testing.assert_close(adv, want_a)
    assert ret is not None
    torch.testing.assert_close(ret, want_r)
    # equal lambdas take the single-gae path, same numbers
    a2, r2 = compute_advantages("gae", rewards=rewards, mask=m, values=v, lam_actor=0.9, lam_critic=0.9)
    w = gae(outcome_token_rewards(rewards, m), v, m, gamma=1.0, lam=0.9)
    torch.testing.assert_close(a2, w[0])
    torch.testing.assert_close(r2, w[1])


def test_compute_advantages_errors() -> None:
    m = torch.ones(2, 3)
    r = torch.zeros(2)
    with pytest.raises(ValueError, match="grpo, gae"):
        compute_advantages("vtrace", rewards=r, mask=m)
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", rewards=r, mask=m)
    with pytest.raises(ValueError, match="group_size"):
        compute_advantages("grpo", rewards=r, mask=m)
    with pytest.raises(ValueError, match="token_rewards"):
        compute_advantages("grpo", rewards=r, mask=m, group_size=2, token_rewards=torch.zeros(2, 3))
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "grpo"}
