"""The entropy bonus (aggregated as the policy loss, its gradient through the sampling
distribution's entropy) and Skywork-OR1's adaptive coefficient, against the slow references."""

from __future__ import annotations

import random

import pytest
import torch

from reasonrl.algos import AGG_MODES, Sampling, adaptive_entropy_coef, entropy_bonus, entropy_from_logits
from reasonrl.algos import reference as ref


def _mask(B: int, T: int, seed: int) -> torch.Tensor:
    lengths = ref.prefix_mask_lengths(B, T, seed)
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("mode", list(AGG_MODES))
@pytest.mark.parametrize("B,T", [(1, 1), (3, 5), (4, 9)])
def test_entropy_bonus_and_its_gradient_match_the_reference(mode: str, B: int, T: int) -> None:
    g = torch.Generator().manual_seed(B * 10 + T)
    H = torch.rand(B, T, generator=g, dtype=torch.float64).requires_grad_(True)
    m = _mask(B, T, seed=T)
    loss, metrics = entropy_bonus(H, m, coef=0.03, agg=mode, max_len=12)
    want, want_grad = ref.entropy_bonus(H.tolist(), m.int().tolist(), 0.03, mode, 12)
    assert loss.item() == pytest.approx(want, rel=1e-12, abs=1e-15) and metrics["entropy_loss"] == pytest.approx(want, rel=1e-12, abs=1e-15)
    loss.backward()
    torch.testing.assert_close(H.grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-12, atol=1e-15)


def test_the_bonus_raises_the_entropy_of_the_sampling_distribution() -> None:
    """Through entropy_from_logits (the learner's entropy, with grad): the value is -alpha * the
    token-mean of the reference entropies of the sampling distribution, and a gradient step on the
    loss raises that entropy."""
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 4, 7, generator=g, dtype=torch.float64)).requires_grad_(True)
    m = _mask(2, 4, seed=1)
    s = Sampling(temperature=0.7)
    loss, _ = entropy_bonus(entropy_from_logits(logits, sampling=s), m, coef=0.5, agg="token-mean")
    ents = [[ref.entropy([x / 0.7 for x in row]) for row in resp] for resp in logits.tolist()]
    assert loss.item() == pytest.approx(ref.entropy_bonus(ents, m.int().tolist(), 0.5, "token-mean")[0], rel=1e-10)
    loss.backward()
    with torch.no_grad():
        stepped = logits - 0.1 * logits.grad
        before = entropy_from_logits(logits, sampling=s)[m].mean()
        after = entropy_from_logits(stepped, sampling=s)[m].mean()
    assert after > before
    assert torch.all(logits.grad[~m] == 0)  # uncounted tokens get no gradient


def test_entropy_bonus_off_and_bad_coef() -> None:
    H = torch.ones(2, 3, requires_grad=True)
    loss, _ = entropy_bonus(H, torch.ones(2, 3), coef=0.0, agg="token-mean")
    assert loss.item() == 0.0
    with pytest.raises(ValueError, match=">= 0"):
        entropy_bonus(H, torch.ones(2, 3), coef=-0.1, agg="token-mean")


def test_adaptive_coefficient_follows_the_reference_trajectory() -> None:
    rng = random.Random(0)
    for trial in range(20):
        target, delta, cap = 0.2, rng.choice([1e-4, 1e-3, 0.05]), rng.choice([5e-3, 0.1])
        entropies = [rng.uniform(0.0, 0.4) for _ in range(30)]
        coef0 = rng.choice([0.0, 0.002])
        alpha, on, applied = coef0, True, []
        for e in entropies:
            applied.append(alpha if on else 0.0)
            alpha, on = adaptive_entropy_coef(alpha, e, target=target, delta=delta, coef_max=cap)
            assert 0.0 <= alpha <= cap
        assert applied == ref.adaptive_entropy_control(coef0, entropies, target, delta, cap), trial


def test_adaptive_coefficient_rule() -> None:
    # below the target: up by delta, the bonus on; at or above it: down by delta (never below 0), off
    assert adaptive_entropy_coef(0.001, 0.1, target=0.2, delta=1e-4, coef_max=5e-3) == (pytest.approx(0.0011), True)
    assert adaptive_entropy_coef(0.001, 0.2, target=0.2, delta=1e-4, coef_max=5e-3) == (pytest.approx(0.0009), False)
    assert adaptive_entropy_coef(0.00005, 0.3, target=0.2, delta=1e-4, coef_max=5e-3) == (0.0, False)
    assert adaptive_entropy_coef(0.00495, 0.1, target=0.2, delta=1e-4, coef_max=5e-3) == (5e-3, True)  # capped
