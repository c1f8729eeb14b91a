"""The policy objective: the policy loss, plus the KL term when given, plus the positive-example NLL,
each term as its own formula computes it."""

from __future__ import annotations

import pytest
import torch

from reasonrl.algos import LossParams, aggregate, kl_penalty, policy_loss, positive_example_nll
from reasonrl.algos.objective import ObjectiveInputs, policy_objective


def _inputs():
    g = torch.Generator().manual_seed(0)
    B, T = 5, 7
    logp_old = -torch.rand(B, T, generator=g) * 3
    logp = (logp_old + 0.2 * torch.randn(B, T, generator=g)).requires_grad_(True)
    ref = logp_old + 0.1 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor([7, 3, 5, 1, 6])[:, None]).float()
    return logp, logp_old, ref, adv, mask, torch.tensor([True, False, True, False, False])


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_objective_is_the_sum_of_its_terms(agg: str) -> None:
    logp, old, ref, adv, mask, correct = _inputs()
    obj = policy_objective(ObjectiveInputs(logp, old, adv, mask, loss="ppo-clip", params=LossParams(eps_high=0.28), agg=agg, max_len=7, ref_logp=ref,
                           kl_coef=0.1, kl_kind="k3", pos_lm_coef=0.5, correct=correct, nll_denominator=4.0))
    pg = policy_loss(logp, old, adv, mask, agg=agg, max_len=7, eps_high=0.28).loss
    kl = aggregate(kl_penalty(logp, ref, "k3"), mask, agg, max_len=7)
    nll, _ = positive_example_nll(logp, mask, correct, denominator=4.0)
    torch.testing.assert_close(obj.loss, pg + 0.1 * kl)
    torch.testing.assert_close(obj.nll, 0.5 * nll)
    assert obj.metrics["kl_ref"] == pytest.approx(float(kl.detach())) and obj.metrics["pg_loss"] == pytest.approx(float((pg + 0.1 * kl).detach()))
    assert obj.nll_metrics["nll_loss"] == pytest.approx(float(nll.detach()))


def test_terms_off() -> None:
    logp, old, ref, adv, mask, _ = _inputs()
    plain = policy_objective(ObjectiveInputs(logp, old, adv, mask, loss="ppo-clip", params=LossParams(), agg="token-mean"))
    no_kl = policy_objective(ObjectiveInputs(logp, old, adv, mask, loss="ppo-clip", params=LossParams(), agg="token-mean", ref_logp=ref, kl_coef=0.0))
    assert plain.nll is None and "kl_ref" not in plain.metrics and "kl_ref" not in no_kl.metrics
    torch.testing.assert_close(no_kl.loss, plain.loss)
    with pytest.raises(ValueError, match="correct"):
        policy_objective(ObjectiveInputs(logp, old, adv, mask, loss="ppo-clip", params=LossParams(), agg="token-mean", pos_lm_coef=0.1))
    with pytest.raises(ValueError, match="policy loss"):
        policy_objective(ObjectiveInputs(logp, old, adv, mask, loss="nope", params=LossParams(), agg="token-mean"))
