"""Losses: aggregation, clipped policy loss (clip-higher, dual clip), value loss, KL."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algos import AGG_MODES, KL_ESTIMATORS, aggregate, kl_penalty, policy_loss, value_loss
from reasonrl.algos import reference as ref

SHAPES = [(1, 1), (2, 5), (5, 17)]


def prefix_mask(B: int, T: int, seed: int) -> torch.Tensor:
    lengths = ref.prefix_mask_lengths(B, T, seed)
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


# ---------------------------------------------------------------- aggregate


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("mode", list(AGG_MODES))
def test_aggregate_matches_reference(B: int, T: int, mode: str) -> None:
    g = torch.Generator().manual_seed(B * T)
    loss = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = prefix_mask(B, T, seed=B)
    for max_len in (None, 40):
        got = aggregate(loss, m, mode, max_len=max_len)
        want = ref.aggregate(loss.tolist(), m.int().tolist(), mode, max_len)
        assert got.dim() == 0
        assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_token_mean_weights_long_responses_more_than_seq_mean() -> None:
    # response 0: 1 token with loss 1; response 1: 3 tokens with loss 0
    loss = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    m = torch.tensor([[1, 0, 0], [1, 1, 1]])
    assert aggregate(loss, m, "token-mean").item() == pytest.approx(1 / 4)
    assert aggregate(loss, m, "seq-mean-token-mean").item() == pytest.approx((1 / 1 + 0 / 3) / 2)
    assert aggregate(loss, m, "seq-mean-token-sum-norm").item() == pytest.approx((1 / 3 + 0) / 2)
    # gradient weight per token: token-mean 1/4 each; seq-mean 1/2 for the short one, 1/6 for the long one
    x = torch.zeros(2, 3, requires_grad=True)
    aggregate(x, m, "token-mean").backward()
    torch.testing.assert_close(x.grad, torch.tensor([[0.25, 0, 0], [0.25, 0.25, 0.25]]))
    x.grad = None
    aggregate(x, m, "seq-mean-token-mean").backward()
    torch.testing.assert_close(x.grad, torch.tensor([[0.5, 0, 0], [1 / 6, 1 / 6, 1 / 6]]))


def test_aggregate_empty_rows_and_empty_mask() -> None:
    loss = torch.tensor([[2.0, 4.0], [float("nan"), float("inf")]], requires_grad=True)
    m = torch.tensor([[1, 1], [0, 0]])
    for mode in AGG_MODES:
        out = aggregate(loss, m, mode)
        assert math.isfinite(out.item())
    assert aggregate(loss, m, "seq-mean-token-mean").item() == pytest.approx(3.0)  # empty row not counted
    assert aggregate(loss, m, "seq-mean-token-sum-norm").item() == pytest.approx(3.0)
    zero = torch.zeros(2, 2)
    for mode in AGG_MODES:
        out = aggregate(loss, zero, mode)
        assert out.item() == 0.0 and out.requires_grad
        out.backward()
        assert torch.equal(loss.grad, torch.zeros(2, 2))
        loss.grad = None


def test_aggregate_denominator_for_gradient_accumulation() -> None:
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 7, generator=g, dtype=torch.float64)
    m = prefix_mask(6, 7, seed=11)
    for mode in AGG_MODES:
        full = aggregate(loss, m, mode)
        denom = m.sum() if mode == "token-mean" else (m.sum(-1) > 0).sum()
        parts = sum(aggregate(loss[i : i + 2], m[i : i + 2], mode, denominator=denom) for i in range(0, 6, 2))
        torch.testing.assert_close(parts, full)


def test_aggregate_unknown_mode() -> None:
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "sum")


# ---------------------------------------------------------------- policy loss


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("eps_low,eps_high,dual", [(0.2, 0.2, None), (0.2, 0.28, None), (0.2, 0.28, 3.0)])
@pytest.mark.parametrize("agg", list(AGG_MODES))
def test_policy_loss_matches_reference(B: int, T: int, eps_low: float, eps_high: float, dual, agg: str) -> None:
    g = torch.Generator().manual_seed(B + T)
    logp_old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = logp_old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.8
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = prefix_mask(B, T, seed=B * T)
    loss, met = policy_loss(logp, logp_old, adv, m, eps_low=eps_low, eps_high=eps_high, dual_clip=dual, agg=agg)
    per_tok = [
        [ref.policy_loss_token(a, b, c, eps_low, eps_high, dual) for a, b, c in zip(ra, rb, rc)]
        for ra, rb, rc in zip(logp.tolist(), logp_old.tolist(), adv.tolist())
    ]
    assert loss.item() == pytest.approx(ref.aggregate(per_tok, m.int().tolist(), agg), rel=1e-10, abs=1e-12)
    # metrics against loops
    toks = [
        (math.exp(a - b), c)
        for ra, rb, rc, rm in zip(logp.tolist(), logp_old.tolist(), adv.tolist(), m.tolist())
        for a, b, c, mm in zip(ra, rb, rc, rm)
        if mm
    ]
    n = max(len(toks), 1)
    assert met["clipfrac_upper"] == pytest.approx(sum(1 for r, a in toks if a > 0 and r > 1 + eps_high) / n)
    assert met["clipfrac_lower"] == pytest.approx(sum(1 for r, a in toks if a < 0 and r < 1 - eps_low) / n)
    assert met["approx_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r, _ in toks) / n, abs=1e-12)
    assert met["ratio_mean"] == pytest.approx(sum(r for r, _ in toks) / n)
    assert met["ratio_max"] == pytest.approx(max((r for r, _ in toks), default=0.0))
    if dual is not None:
        assert met["clipfrac_dual"] == pytest.approx(
            sum(1 for r, a in toks if a < 0 and max(r, min(max(r, 1 - eps_low), 1 + eps_high)) > dual) / n
        )
    else:
        assert "clipfrac_dual" not in met
    assert all(isinstance(v, float) for v in met.values())


def _grad_wrt_logp(p_old: float, p_new: float, adv: float, **kw) -> float:
    logp = torch.tensor([[math.log(p_new)]], dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(logp, torch.tensor([[math.log(p_old)]], dtype=torch.float64), torch.tensor([adv]), torch.ones(1, 1), **kw)
    loss.backward()
    return float(logp.grad)


@pytest.mark.parametrize("p_old", [0.01, 0.9])
def test_clip_bounds_how_far_a_positive_token_can_rise(p_old: float) -> None:
    # eps = 0.2: a token sampled with probability 0.01 (0.9) can be pushed to 0.012 (1.08) at most:
    # beyond r = 1.2 the gradient of the loss w.r.t. logp vanishes, inside it is -A * r.
    cap = p_old * 1.2
    assert cap == pytest.approx({0.01: 0.012, 0.9: 1.08}[p_old])
    inside = min(p_old * 1.1, 0.999)
    assert _grad_wrt_logp(p_old, inside, 1.0) == pytest.approx(-inside / p_old)
    beyond = p_old * 1.25 if p_old < 0.5 else 0.9 * 1.21  # (a "probability" > 1 is fine for the algebra)
    assert _grad_wrt_logp(p_old, beyond, 1.0) == 0.0


def test_clip_higher_lets_low_probability_tokens_rise_further() -> None:
    assert 0.01 * (1 + 0.28) == pytest.approx(0.0128)
    # r = 1.25: clipped (no gradient) with eps_high 0.2, still learning with eps_high 0.28
    assert _grad_wrt_logp(0.01, 0.0125, 1.0, eps_high=0.2) == 0.0
    assert _grad_wrt_logp(0.01, 0.0125, 1.0, eps_high=0.28) == pytest.approx(-1.25)
    assert _grad_wrt_logp(0.01, 0.0129, 1.0, eps_high=0.28) == 0.0  # 0.0129 > 0.0128
    # the lower clip is unchanged: A < 0, r = 0.75 < 0.8 -> no gradient with either eps_high
    assert _grad_wrt_logp(0.01, 0.0075, -1.0, eps_high=0.28) == 0.0
    assert _grad_wrt_logp(0.01, 0.0085, -1.0, eps_high=0.28) == pytest.approx(0.85)


def test_policy_loss_hand_values_and_clipfrac() -> None:
    logp_old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 1.1, 0.5, 0.9]]))
    adv = torch.tensor([[1.0, 1.0, -2.0, -2.0]])
    loss, met = policy_loss(logp, logp_old, adv, torch.ones(1, 4), eps_low=0.2, eps_high=0.28, agg="token-mean")
    # per token: -min(1.5, 1.28) = -1.28; -1.1; -min(-1.0, -1.6) = 1.6; -min(-1.8, -1.8) = 1.8
    assert loss.item() == pytest.approx((-1.28 - 1.1 + 1.6 + 1.8) / 4)
    assert met["clipfrac_upper"] == pytest.approx(0.25)
    assert met["clipfrac_lower"] == pytest.approx(0.25)
    assert met["clipfrac"] == pytest.approx(0.5)
    assert met["ratio_max"] == pytest.approx(1.5)


def test_dual_clip_numbers() -> None:
    # A = -1, r = 5: standard loss = -min(-5, -1.2) = 5; dual clip c = 3 caps it at 3 (no gradient)
    logp = torch.tensor([[math.log(5.0), math.log(2.0), math.log(5.0)]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, met = policy_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), dual_clip=3.0)
    # tokens: 3 (capped), 2 (r = 2 < 3: not capped), A > 0 with r = 5: -1.2 (upper clip; dual clip ignores A > 0)
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.2) / 3)
    assert met["clipfrac_dual"] == pytest.approx(1 / 3)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 2.0 / 3, 0.0]]))
    # without the dual clip the first token is 5
    loss2, met2 = policy_loss(logp.detach(), torch.zeros(1, 3), adv, torch.ones(1, 3))
    assert loss2.item() == pytest.approx((5.0 + 2.0 - 1.2) / 3)
    with pytest.raises(ValueError):
        policy_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), dual_clip=1.0)


def test_policy_loss_broadcasts_per_response_advantages() -> None:
    g = torch.Generator().manual_seed(3)
    logp, logp_old = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    a = torch.randn(3, generator=g)
    m = prefix_mask(3, 4, seed=3)
    l1, _ = policy_loss(logp, logp_old, a, m)
    l2, _ = policy_loss(logp, logp_old, a[:, None].expand(3, 4), m)
    torch.testing.assert_close(l1, l2)


def test_policy_loss_is_stable_and_empty_mask_is_zero() -> None:
    logp = torch.tensor([[0.0, -200.0]], requires_grad=True)
    logp_old = torch.tensor([[-200.0, 0.0]])
    loss, met = policy_loss(logp, logp_old, torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in met.values())
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    loss, met = policy_loss(logp, logp_old, torch.tensor([[-1.0, 1.0]]), torch.zeros(1, 2))
    assert loss.item() == 0.0 and loss.requires_grad
    assert met["clipfrac_upper"] == 0.0 and met["ratio_mean"] == 0.0


def test_policy_loss_on_policy_gradient_is_minus_advantage() -> None:
    # r = 1 (first mini-batch step): d loss / d logp = -A / n_tokens for token-mean
    logp = torch.randn(2, 3, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 0.5], [3.0, 0.0, -1.0]])
    loss, met = policy_loss(logp, logp.detach(), adv, torch.ones(2, 3))
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv / 6)
    assert met["approx_kl"] == 0.0 and met["ratio_mean"] == pytest.approx(1.0)


# ---------------------------------------------------------------- value loss


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_matches_reference(B: int, T: int, clip) -> None:
    g = torch.Generator().manual_seed(B * 7 + T)
    v_old = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = v_old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    ret = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = prefix_mask(B, T, seed=B + 2 * T)
    loss, met = value_loss(v, v_old, ret, m, clip=clip)
    per_tok = [
        [ref.value_loss_token(a, b, c, clip) for a, b, c in zip(ra, rb, rc)]
        for ra, rb, rc in zip(v.tolist(), v_old.tolist(), ret.tolist())
    ]
    assert loss.item() == pytest.approx(ref.aggregate(per_tok, m.int().tolist(), "token-mean"), rel=1e-10, abs=1e-12)
    assert met["explained_variance"] == pytest.approx(ref.explained_variance(v.tolist(), ret.tolist(), m.int().tolist()))
    assert {"vf_loss", "vf_clipfrac", "value_mean", "explained_variance"} <= set(met)


def test_value_loss_clip_hand_values() -> None:
    v_old = torch.zeros(1, 3)
    v = torch.tensor([[0.5, 0.1, -0.5]], requires_grad=True)
    ret = torch.tensor([[1.0, 1.0, 1.0]])
    loss, met = value_loss(v, v_old, ret, torch.ones(1, 3), clip=0.2)
    # token 0: max(0.25, (0.2-1)^2=0.64) = 0.64; token 1: max(0.81, 0.81); token 2: max(2.25, (-0.2-1)^2=1.44) = 2.25
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81 + 2.25) / 3)
    assert met["vf_clipfrac"] == pytest.approx(1 / 3)
    assert met["value_mean"] == pytest.approx((0.5 + 0.1 - 0.5) / 3)
    loss.backward()
    torch.testing.assert_close(v.grad, torch.tensor([[0.0, (0.1 - 1.0) / 3, (-0.5 - 1.0) / 3]]))


# ---------------------------------------------------------------- KL


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_penalty_matches_reference(kind: str) -> None:
    g = torch.Generator().manual_seed(9)
    logp = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 4
    logp_ref = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 4
    got = kl_penalty(logp, logp_ref, kind)
    want = [[ref.kl(a, b, kind) for a, b in zip(ra, rb)] for ra, rb in zip(logp.tolist(), logp_ref.tolist())]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))
    assert torch.equal(kl_penalty(logp, logp, kind), torch.zeros(3, 5, dtype=torch.float64))


def test_kl_k3_nonnegative_and_unknown_kind() -> None:
    x = torch.linspace(-30, 30, 61)
    assert (kl_penalty(x, torch.zeros(61), "k3") >= 0).all()
    assert torch.isfinite(kl_penalty(x, torch.zeros(61), "k3")).all()
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(x, x, "low_var_kl")
    assert list(KL_ESTIMATORS) == ["k1", "k2", "k3"]
