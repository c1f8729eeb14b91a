"""The off-policy correction family, its modes and diagnostics against the loop reference (fp64),
and what a log-prob gap of +-100 does to them (nothing non-finite)."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algos import reference as ref
from reasonrl.algos.losses import LossParams, ppo_clip_loss
from reasonrl.algos.mismatch import truncated_is_weights
from reasonrl.algos.offpolicy import (CORRECTION_DEFAULTS, CORRECTION_LEVELS, ROLLOUT_CORRECTIONS, offpolicy_diagnostics, proximal_logp,
                                      rollout_correction)
from reasonrl.algos.spec import get_algo

NAMES = sorted(ROLLOUT_CORRECTIONS)


def _batch(seed: int = 0, spread: float = 0.5, B: int = 6, T: int = 9) -> tuple[torch.Tensor, ...]:
    """(logp, logp_old, logp_behaviour, advantages (B,), mask) in fp64; the behaviour log-probs off
    pi_old by N(0, spread) per token, the current ones a little off pi_old."""
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(B, T, generator=g, dtype=torch.float64).clamp(min=1e-3))
    beh = old + torch.randn(B, T, generator=g, dtype=torch.float64) * spread
    logp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.15
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lens = torch.tensor([T, 4, 1, 0, 7, 3][:B])
    mask = (torch.arange(T)[None, :] < lens[:, None]).double()
    return logp, old, beh, adv, mask


def _bands(name: str) -> list[tuple[float | None, float | None]]:
    """The defaults, and bands that cut some of the batch's tokens / responses."""
    return {"token-tis": [(None, None), (1.2, None), (0.7, None)], "sequence-tis": [(None, None), (1.5, None)],
            "token-mask": [(None, None), (1.3, 0.6)], "sequence-mask": [(None, None), (1.5, 0.3)],
            "geo-rs": [(None, None), (1.2, 0.8)], "icepop": [(None, None), (1.5, 0.7)]}[name]


@pytest.mark.parametrize("name", NAMES)
def test_each_estimator_equals_its_loop(name: str) -> None:
    _, old, beh, _, mask = _batch(1)
    for cap, low in _bands(name):
        w, m = rollout_correction(old, beh, mask, name=name, cap=cap, low=low)
        W, REJ, TR = ref.rollout_correction(old.tolist(), beh.tolist(), mask.tolist(), name, cap, low)
        torch.testing.assert_close(w, torch.tensor(W, dtype=torch.float64), rtol=1e-12, atol=1e-12)
        n = mask.sum().item()
        assert m["masked_frac"] == pytest.approx(sum(map(sum, REJ)) / n, abs=1e-12)
        assert m["truncated_frac"] == pytest.approx(sum(map(sum, TR)) / n, abs=1e-12)
        assert m["weight_mean"] == pytest.approx(sum(x for rw, rm in zip(W, mask.tolist()) for x, k in zip(rw, rm) if k) / n, rel=1e-12)
        assert not w.requires_grad and (w[~mask.bool()] == 1.0).all() and w.dtype == torch.float64


def test_the_bands_cut_what_they_say() -> None:
    """Each estimator's defining behaviour on hand-made ratios: a token at ratio 4 and one at 0.25."""
    d = torch.tensor([[math.log(4.0), math.log(0.25), 0.0]], dtype=torch.float64)
    old, beh, mask = d, torch.zeros_like(d), torch.ones_like(d)
    w = {n: rollout_correction(old, beh, mask, name=n)[0][0].tolist() for n in NAMES}
    assert w["token-tis"] == pytest.approx([2.0, 0.25, 1.0])  # truncated at 2
    assert w["token-mask"] == pytest.approx([0.0, 0.25, 1.0])  # ratio 4 > 3: rejected, no lower bound
    assert w["icepop"] == pytest.approx([4.0, 0.0, 1.0])  # inside [0.5, 5] kept with its ratio, 0.25 rejected
    assert w["sequence-tis"] == pytest.approx([1.0, 1.0, 1.0])  # product 4 * 0.25 = 1
    assert w["sequence-mask"] == pytest.approx([1.0, 1.0, 1.0])
    assert w["geo-rs"] == pytest.approx([1.0, 1.0, 1.0])  # geometric mean 1
    d2 = torch.tensor([[math.log(4.0), 0.0, 0.0]], dtype=torch.float64)  # product 4, geometric mean 4^(1/3)
    w2 = {n: rollout_correction(d2, beh, mask, name=n)[0][0].tolist() for n in ("sequence-tis", "sequence-mask", "geo-rs")}
    assert w2 == {"sequence-tis": [2.0] * 3, "sequence-mask": [0.0] * 3, "geo-rs": [0.0] * 3}
    assert rollout_correction(d2, beh, mask, name="sequence-mask", cap=5.0)[0][0].tolist() == pytest.approx([4.0] * 3)
    assert rollout_correction(d2, beh, mask, name="geo-rs", cap=1.6, low=0.5)[0][0].tolist() == [1.0] * 3


@pytest.mark.parametrize("mode", ["decoupled", "bypass"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("name", NAMES)
def test_corrected_loss_value_and_gradient_equal_the_loop(name: str, agg: str, mode: str) -> None:
    """The clipped surrogate with the correction as the trainer applies it (the mode's anchor, the
    estimator's weights in decoupled mode): loss and d loss / d logp against the loop, fp64."""
    logp0, old, beh, adv, mask = _batch(2, spread=0.4)
    cap, low = _bands(name)[-1]
    params = LossParams(eps_low=0.2, eps_high=0.28)
    logp = logp0.clone().requires_grad_(True)
    w = rollout_correction(old, beh, mask, name=name, cap=cap, low=low)[0] if mode == "decoupled" else None
    out = ppo_clip_loss(logp, proximal_logp(old, beh, mode=mode), adv, mask, params=params, agg=agg, is_weights=w)
    (grad,) = torch.autograd.grad(out.loss, logp)
    A = adv[:, None].expand_as(logp0).tolist()
    want, want_grad = ref.corrected_ppo(logp0.tolist(), old.tolist(), beh.tolist(), A, mask.tolist(), 0.2, 0.28, agg, mode, name, cap, low)
    assert out.loss.item() == pytest.approx(want, rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-10, atol=1e-14)
    if mode == "decoupled" and name != "sequence-tis":  # the correction changes the gradient (sequence-tis may leave it whole here)
        plain = ppo_clip_loss(logp, old, adv, mask, params=params, agg=agg)
        assert not torch.allclose(torch.autograd.grad(plain.loss, logp)[0], grad)


@pytest.mark.parametrize("name", NAMES)
def test_scope_restricts_the_correction_to_stale_tokens(name: str) -> None:
    """The default for partial rollouts corrects only tokens sampled by an older policy: a token
    estimator only those, a sequence one the responses holding one; weights 1 elsewhere."""
    _, old, beh, _, mask = _batch(3, spread=0.8)
    scope = torch.zeros_like(mask, dtype=torch.bool)
    scope[0, :3] = True
    scope[4, :2] = True
    cap, low = _bands(name)[-1]
    w, m = rollout_correction(old, beh, mask, name=name, cap=cap, low=low, scope=scope)
    W, _, _ = ref.rollout_correction(old.tolist(), beh.tolist(), mask.tolist(), name, cap, low, scope=scope.tolist())
    torch.testing.assert_close(w, torch.tensor(W, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    rows = [0, 4] if CORRECTION_LEVELS[name] == "sequence" else None
    outside = ~scope if rows is None else torch.ones_like(scope).index_fill_(0, torch.tensor(rows), False)
    assert (w[outside] == 1.0).all()
    in_scope = (scope & mask.bool()).sum() if rows is None else mask[rows].sum()
    assert m["scope_frac"] == pytest.approx(float(in_scope) / float(mask.sum()))


@pytest.mark.parametrize("gap", [100.0, -100.0])
@pytest.mark.parametrize("mode", ["decoupled", "bypass"])
@pytest.mark.parametrize("name", NAMES)
def test_a_gap_of_100_gives_finite_weights_losses_and_gradients(name: str, mode: str, gap: float) -> None:
    """exp(trainer lp - inference lp) at a gap of +-100 (prime-rl #2972: inf through a mask became
    NaN): every weight, the loss, its gradient and the diagnostics stay finite, in fp64 and fp32."""
    for dtype in (torch.float64, torch.float32):
        logp0, old, beh, adv, mask = (x.to(dtype) for x in _batch(4))
        beh = beh.clone()
        beh[0, :4] = old[0, :4] - gap  # pi_old / pi_b = e^(+-100) on counted tokens
        beh[1, :2] = old[1, :2] + gap
        beh[3, :] = old[3, :] - gap  # and on a row without a counted token
        w, m = rollout_correction(old, beh, mask, name=name)
        assert torch.isfinite(w).all() and all(math.isfinite(v) for v in m.values())
        logp = logp0.clone().requires_grad_(True)
        out = ppo_clip_loss(logp, proximal_logp(old, beh, mode=mode), adv, mask, params=LossParams(),
                            is_weights=w if mode == "decoupled" else None)
        (grad,) = torch.autograd.grad(out.loss, logp)
        assert math.isfinite(out.loss.item()) and torch.isfinite(grad).all(), (dtype, name, mode)
        d = offpolicy_diagnostics(old, beh, mask)
        assert all(math.isfinite(v) for v in d.values()), d
        assert d["ratio_max"] <= math.exp(20.0) * (1 + 1e-6)


def test_diagnostics_equal_the_loop() -> None:
    for seed, spread in ((5, 0.3), (6, 2.0)):
        _, old, beh, _, mask = _batch(seed, spread=spread)
        got = offpolicy_diagnostics(old, beh, mask)
        want = ref.offpolicy_diagnostics(old.tolist(), beh.tolist(), mask.tolist())
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-10, abs=1e-12), k
        assert got["tokens"] == mask.sum().item() and got["sequences"] == 5.0  # (one row has no counted token)
        assert got["k3"] >= 0 and got["k3_seq"] >= 0 and got["chi2"] >= 0 and got["mult_prob_error"] >= 1.0
    same = offpolicy_diagnostics(old, old, mask)
    assert same["k1"] == same["k3"] == same["chi2"] == same["k3_seq"] == 0.0 and same["mult_prob_error"] == 1.0 and same["ratio_max"] == 1.0
    assert offpolicy_diagnostics(old, beh, torch.zeros_like(mask))["k1"] == 0.0


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_tis_cap_is_the_registry_token_and_sequence_tis(level: str) -> None:
    """--tis-cap C (today's knob) gives, in fp32, exactly the weights of the registry's entry."""
    _, old, beh, _, mask = (x.float() for x in _batch(7, spread=1.0))
    w, _ = truncated_is_weights(old, beh, mask, cap=2.0, level=level)
    w2, _ = rollout_correction(old, beh, mask, name=f"{level}-tis", cap=2.0)
    assert torch.equal(w, w2)


def test_the_spec_validates_the_knobs() -> None:
    s = get_algo("dapo")
    assert s.rollout_correction is None and s.stale_correction == "token-tis" and s.correction_mode == "decoupled"
    assert s.replace(rollout_correction="icepop", correction_cap=5.0, correction_low=0.5).rollout_correction == "icepop"
    for bad, match in (({"rollout_correction": "geo"}, "rollout_correction must be one of"), ({"stale_correction": "x"}, "stale_correction"),
                       ({"rollout_correction": "token-tis", "tis_cap": 2.0}, "choose one"),
                       ({"correction_mode": "bypass", "rollout_correction": "token-mask"}, "bypass"),
                       ({"correction_mode": "sideways"}, "correction_mode"), ({"max_staleness": -1}, "max_staleness"),
                       ({"rollout_correction": "icepop", "correction_low": 6.0}, "correction_low"),
                       ({"correction_cap": 0.0}, "correction_cap")):
        with pytest.raises(ValueError, match=match):
            s.replace(**bad)
    assert set(CORRECTION_DEFAULTS) == set(ROLLOUT_CORRECTIONS) == set(CORRECTION_LEVELS)
    with pytest.raises(ValueError, match="unknown rollout correction"):
        rollout_correction(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), name="nope")
    with pytest.raises(ValueError, match="correction mode"):
        proximal_logp(torch.zeros(1, 2), torch.zeros(1, 2), mode="nope")
