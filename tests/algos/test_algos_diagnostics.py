"""Metric helpers: clip fraction by probability bucket, means by position, explained variance;
masked helpers."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algos import (
    clip_by_prob_bucket,
    explained_variance,
    masked_mean,
    masked_var,
    masked_whiten,
    mean_by_position,
    policy_loss,
)
from reasonrl.algos import reference as ref


def prefix_mask(B: int, T: int, seed: int) -> torch.Tensor:
    lengths = ref.prefix_mask_lengths(B, T, seed)
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


def test_clip_by_prob_bucket_matches_loop_and_policy_loss() -> None:
    g = torch.Generator().manual_seed(0)
    B, T = 6, 40
    logp_old = torch.log(torch.rand(B, T, generator=g).clamp(min=1e-4))
    logp = logp_old + torch.randn(B, T, generator=g) * 0.3
    adv = torch.randn(B, generator=g)
    m = prefix_mask(B, T, seed=1)
    ratio = torch.exp(logp - logp_old)
    loss = policy_loss(logp, logp_old, adv, m, eps_low=0.2, eps_high=0.28)
    out = clip_by_prob_bucket(logp_old, loss.clip_upper, loss.clip_lower, m)
    edges = [round(0.1 * i, 1) for i in range(11)]
    toks = [
        (math.exp(lo), r, float(adv[i]))
        for i in range(B)
        for lo, r, mm in zip(logp_old[i].tolist(), ratio[i].tolist(), m[i].tolist())
        if mm
    ]
    n_up = sum(1 for _, r, a in toks if a > 0 and r > 1.28)
    for j in range(10):
        lo, hi = edges[j], edges[j + 1]
        inb = [t for t in toks if lo <= t[0] < hi or (j == 9 and t[0] == 1.0)]
        b = f"p{lo:.1f}-{hi:.1f}"
        up = sum(1 for _, r, a in inb if a > 0 and r > 1.28)
        low = sum(1 for _, r, a in inb if a < 0 and r < 0.8)
        assert out[f"tokens/{b}"] == len(inb)
        assert out[f"clip_upper/{b}"] == pytest.approx(up / max(len(inb), 1))
        assert out[f"clip_lower/{b}"] == pytest.approx(low / max(len(inb), 1))
        assert out[f"clip_upper_share/{b}"] == pytest.approx(up / max(n_up, 1))
    ps_up = [p for p, r, a in toks if a > 0 and r > 1.28]
    assert out["clip_upper/max_prob"] == pytest.approx(max(ps_up, default=0.0))
    assert out["clip_upper/mean_prob"] == pytest.approx(sum(ps_up) / max(len(ps_up), 1))
    # buckets add up to policy_loss's overall clip fraction
    _, met = policy_loss(logp, logp_old, adv, m, eps_low=0.2, eps_high=0.28)
    total = sum(out[f"tokens/p{edges[j]:.1f}-{edges[j + 1]:.1f}"] for j in range(10))
    ups = sum(out[f"clip_upper/p{edges[j]:.1f}-{edges[j + 1]:.1f}"] * out[f"tokens/p{edges[j]:.1f}-{edges[j + 1]:.1f}"] for j in range(10))
    assert total == m.sum().item()
    assert ups / total == pytest.approx(met["clipfrac_upper"])


def test_clip_by_prob_bucket_custom_edges_and_errors() -> None:
    logp_old = torch.log(torch.tensor([[0.05, 0.5, 0.95]]))
    ratio = torch.tensor([[1.5, 1.5, 1.0]])
    upper = ratio > 1.2  # A > 0 everywhere: the upper clip cuts r > 1 + 0.2
    out = clip_by_prob_bucket(logp_old, upper, torch.zeros_like(upper), torch.ones(1, 3), edges=(0.0, 0.2, 1.0))
    assert out["clip_upper/p0.0-0.2"] == 1.0 and out["clip_upper/p0.2-1.0"] == 0.5
    assert out["clip_upper/max_prob"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        clip_by_prob_bucket(logp_old, upper, torch.zeros_like(upper), torch.ones(1, 3), edges=(0.5, 0.1))


@pytest.mark.parametrize("B,T", [(1, 1), (3, 10), (7, 50)])
@pytest.mark.parametrize("n_bins", [None, 1, 4, 64])
def test_mean_by_position_matches_reference(B: int, T: int, n_bins) -> None:
    g = torch.Generator().manual_seed(B * T)
    x = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = prefix_mask(B, T, seed=B)
    got = mean_by_position(x, m, n_bins=n_bins)
    want = ref.mean_by_position(x.tolist(), m.int().tolist(), n_bins)
    assert got == pytest.approx(want, nan_ok=True)
    if n_bins is not None:
        assert len(got) <= n_bins


def test_mean_by_position_hand_example() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    assert mean_by_position(x, m, n_bins=None) == [3.0, 4.0, 3.0]  # position 3 is past every end
    assert mean_by_position(x, m, n_bins=2) == [pytest.approx((1 + 5) / 2), pytest.approx((2 + 6 + 3) / 3)]
    assert mean_by_position(x, torch.zeros(3, 4)) == []


def test_explained_variance() -> None:
    g = torch.Generator().manual_seed(0)
    t = torch.randn(4, 9, generator=g, dtype=torch.float64)
    m = prefix_mask(4, 9, seed=2)
    assert explained_variance(t, t, m) == pytest.approx(1.0)
    p = t + torch.randn(4, 9, generator=g, dtype=torch.float64)
    assert explained_variance(p, t, m) == pytest.approx(ref.explained_variance(p.tolist(), t.tolist(), m.int().tolist()))
    # predicting the mean explains nothing
    mean = t[m].mean()
    assert explained_variance(torch.full_like(t, float(mean)), t, m) == pytest.approx(0.0, abs=1e-12)
    # Var(target) = 0 and empty mask: 0.0, never nan
    assert explained_variance(torch.randn(2, 3), torch.ones(2, 3), torch.ones(2, 3)) == 0.0
    assert explained_variance(t, t, torch.zeros(4, 9)) == 0.0
    # every return -1 as λ = 1 GAE makes it in float32 (advantages + values): rounding, not variance
    values = torch.randn(4, 9, generator=g)
    returns = ((-1.0 - values) + values).double()
    assert 0 < float(returns[m.bool()].var(unbiased=False)) < 1e-12  # (not exactly constant)
    assert explained_variance(values, returns, m) == 0.0
    assert ref.explained_variance(values.tolist(), returns.tolist(), m.int().tolist()) == 0.0


def test_masked_helpers() -> None:
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
    torch.testing.assert_close(masked_mean(x, m, dim=-1), torch.tensor([1.5, 3.0]))
    assert masked_var(x, m).item() == pytest.approx(1.0)  # Bessel: ((1)^2 + 0 + 1^2) / 2
    assert masked_mean(x, torch.zeros(2, 3)).item() == 0.0
    assert masked_var(x, torch.tensor([[1, 0, 0], [0, 0, 0]])).item() == 0.0
    w = masked_whiten(x, m)
    torch.testing.assert_close(w, torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), atol=1e-6, rtol=0)
    w2 = masked_whiten(x, m, shift_mean=False)
    torch.testing.assert_close(w2, torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]), atol=1e-6, rtol=0)
    g = torch.Generator().manual_seed(1)
    y = torch.randn(5, 8, generator=g, dtype=torch.float64) * 3 + 2
    mm = prefix_mask(5, 8, seed=5)
    wy = masked_whiten(y, mm)
    assert masked_mean(wy, mm).item() == pytest.approx(0.0, abs=1e-9)
    assert masked_var(wy, mm).item() == pytest.approx(1.0, rel=1e-6)


def test_clip_counts_of_parts_give_the_fractions_of_the_whole() -> None:
    """Micro-batches' clip counts, added up, give the clip fractions of their tokens together."""
    from reasonrl.algos.diagnostics import add_clip_counts, clip_fractions_from_counts

    g = torch.Generator().manual_seed(2)
    B, T = 8, 30
    logp_old = torch.log(torch.rand(B, T, generator=g).clamp(min=1e-4))
    logp = logp_old + torch.randn(B, T, generator=g) * 0.4
    adv = torch.randn(B, generator=g)
    m = prefix_mask(B, T, seed=3)
    loss = policy_loss(logp, logp_old, adv, m, eps_low=0.2, eps_high=0.28)
    whole = clip_by_prob_bucket(logp_old, loss.clip_upper, loss.clip_lower, m)
    counts: dict[str, float] = {}
    for rows in (slice(0, 3), slice(3, 8)):
        add_clip_counts(counts, clip_by_prob_bucket(logp_old[rows], loss.clip_upper[rows], loss.clip_lower[rows], m[rows]))
    got = clip_fractions_from_counts(counts)
    assert set(got) == {k for k in whole if k.split("/")[0] in ("tokens", "clip_upper", "clip_lower") and k.split("/")[1].startswith("p")}
    for k, v in got.items():
        assert v == pytest.approx(whole[k], abs=1e-6), k
    assert any(v > 0 for k, v in got.items() if k.startswith("clip_upper/"))  # something was clipped
