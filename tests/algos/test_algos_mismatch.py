"""Rollout/trainer mismatch metrics and truncated importance sampling against the loop reference."""

from __future__ import annotations

import pytest
import torch

from reasonrl.algos import reference as ref
from reasonrl.algos.losses import LossParams, ppo_clip_loss
from reasonrl.algos.mismatch import mismatch_metrics, truncated_is_weights


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(5, 9, generator=g, dtype=torch.float64).clamp(min=1e-3))
    sampler = old + torch.randn(5, 9, generator=g, dtype=torch.float64) * 0.4
    mask = (torch.arange(9)[None, :] < torch.tensor([9, 4, 1, 0, 7])[:, None]).double()
    return old, sampler, mask


def test_mismatch_metrics_match_the_loop() -> None:
    old, sampler, mask = _batch()
    got = mismatch_metrics(old, sampler, mask)
    want = ref.mismatch(old.tolist(), sampler.tolist(), mask.tolist())
    assert [got["logprob_diff_mean"], got["logprob_diff_max"], got["mismatch_kl"]] == pytest.approx(list(want), rel=1e-9)
    assert mismatch_metrics(old, old, mask) == {"logprob_diff_mean": 0.0, "logprob_diff_max": 0.0, "mismatch_kl": 0.0}
    assert mismatch_metrics(old, sampler, torch.zeros_like(mask))["logprob_diff_max"] == 0.0


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("cap", [2.0, 0.5, 100.0])
def test_tis_weights_match_the_loop(level: str, cap: float) -> None:
    old, sampler, mask = _batch(1)
    w, m = truncated_is_weights(old, sampler, mask, cap=cap, level=level)
    want = torch.tensor(ref.tis_weights(old.tolist(), sampler.tolist(), mask.tolist(), cap, level), dtype=torch.float32)
    torch.testing.assert_close(w, want, rtol=1e-5, atol=1e-6)
    assert (w[mask.bool()] <= cap + 1e-6).all() and not w.requires_grad and (w[~mask.bool()] == 1.0).all()
    assert 0.0 <= m["tis_truncated_frac"] <= 1.0


def test_tis_weights_multiply_the_clipped_token_loss() -> None:
    """With weights w, the per-token loss is w * (clipped surrogate): the gradient scales by w."""
    old, sampler, mask = _batch(2)
    w, _ = truncated_is_weights(old, sampler, mask, cap=2.0)
    logp = (old + 0.05).clone().requires_grad_(True)
    adv = torch.randn(5, dtype=torch.float64)
    plain = ppo_clip_loss(logp, old, adv, mask, params=LossParams())
    (g_plain,) = torch.autograd.grad(plain.loss, logp)
    weighted = ppo_clip_loss(logp, old, adv, mask, params=LossParams(), is_weights=w)
    (g_w,) = torch.autograd.grad(weighted.loss, logp)
    torch.testing.assert_close(g_w, g_plain * w.double())
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(old, sampler, mask, cap=0.0)
    with pytest.raises(ValueError, match="unknown TIS level"):
        truncated_is_weights(old, sampler, mask, cap=2.0, level="geo")
