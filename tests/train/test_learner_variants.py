"""The learner with the loss variants on fixed rollouts: micro-batching changes nothing (policy
loss + VAPO's positive-example NLL, or + the entropy bonus), the NLL metric is the token-mean over
correct responses, the covariance losses draw from the learner's seeded generator (same seed, same
update), and the adaptive entropy coefficient moves by Skywork-OR1's rule."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from reasonrl.algos import Sampling, get_algo
from reasonrl.algos import reference as ref

WORKER = Path(__file__).resolve().parent / "ds_worker.py"


def _fixed_groups(vocab: int):
    spec = importlib.util.spec_from_file_location("reasonrl_ds_worker", WORKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fixed_groups(vocab), mod.GROUP_SIZE


def _learner(model_dir: Path, spec, micro: int, seed: int = 0, fuse: bool = True):
    """A learner of the tiny model over the fixed groups (one mini-batch); returns (learner, groups, group size)."""
    from reasonrl.models.loading import load_causal_lm, load_tokenizer
    from reasonrl.train.backend import TorchBackend
    from reasonrl.train.learner import Learner

    tok = load_tokenizer(model_dir)
    groups, group_size = _fixed_groups(len(tok))
    model = load_causal_lm(model_dir)
    backend = TorchBackend(model, lr=1e-6, weight_decay=0.0, grad_clip=0.0, warmup_steps=0, dtype="fp32")
    n = sum(len(g) for g in groups)
    learner = Learner(spec=spec, policy=model, policy_backend=backend, critic_backend=None, ref_model=None, sampling=Sampling(), pad_id=tok.pad_token_id,
                      max_len=16, micro_batch_size=micro, mini_batch_size=n, ppo_epochs=1, dtype="fp32", seed=seed, fuse_old_logp=fuse)
    return learner, groups, group_size


def _update(model_dir: Path, spec, micro: int, seed: int = 0, fuse: bool = True):
    """One update_policy on the fixed groups (one mini-batch); returns (metrics, gradients, the step's tensors)."""
    learner, groups, group_size = _learner(model_dir, spec, micro, seed, fuse)
    st = learner.prepare(groups)
    learner.advantages(st, group_size=group_size)
    m = learner.update_policy(st)
    grads = {k: p.grad.clone() for k, p in learner.policy.named_parameters() if p.grad is not None}
    return m, grads, st


@pytest.mark.parametrize("algo", ["dapo", "gspo", "cispo", "drgrpo"])
def test_micro_batching_gives_the_same_gradient_with_the_nll_term(tiny_model, algo) -> None:
    spec = get_algo(algo).replace(pos_lm_coef=0.1, dynamic_sampling=False)
    m_full, g_full, st = _update(tiny_model, spec, micro=16)
    m_micro, g_micro, _ = _update(tiny_model, spec, micro=3)
    assert g_full.keys() == g_micro.keys() and g_full
    for k in g_full:
        torch.testing.assert_close(g_micro[k], g_full[k], rtol=1e-4, atol=1e-6)
    # the NLL metric is the token-mean of -log p over the correct responses' tokens (on-policy: the old log-probs)
    want = ref.positive_example_nll(st.old_logp.tolist(), st.batch.mask.int().tolist(), st.correct.tolist())
    assert want > 0
    for m in (m_full, m_micro):
        assert m["actor/nll_loss"] == pytest.approx(want, rel=1e-4)
    assert m_full["actor/pg_loss"] == pytest.approx(m_micro["actor/pg_loss"], rel=1e-4, abs=1e-6)


def test_nll_term_changes_the_gradient_and_is_absent_when_off(tiny_model) -> None:
    spec = get_algo("grpo")
    m0, g0, _ = _update(tiny_model, spec, micro=16)
    m1, g1, _ = _update(tiny_model, spec.replace(pos_lm_coef=0.1), micro=16)
    assert "actor/nll_loss" not in m0 and "actor/nll_loss" in m1
    assert any(not torch.allclose(g0[k], g1[k]) for k in g0)


def test_clip_cov_draw_follows_the_learner_seed(tiny_model) -> None:
    spec = get_algo("dapo").replace(policy_loss="clip-cov", cov_clip_ratio=0.2, cov_clip_low=-100.0, cov_clip_high=100.0, dynamic_sampling=False)
    m_a, g_a, _ = _update(tiny_model, spec, micro=16, seed=1)
    m_b, g_b, _ = _update(tiny_model, spec, micro=16, seed=1)
    m_c, g_c, _ = _update(tiny_model, spec, micro=16, seed=2)
    assert 0.1 < m_a["actor/cov_selected_frac"] < 0.3
    assert all(torch.equal(g_a[k], g_b[k]) for k in g_a)  # same seed: the same tokens are cut
    assert any(not torch.allclose(g_a[k], g_c[k], rtol=1e-3, atol=1e-6) for k in g_a)  # another seed: others (beyond float noise)


@pytest.mark.parametrize("algo", ["dapo", "grpo", "drgrpo"])  # token-mean, seq-mean-token-mean, seq-mean-token-sum-norm
def test_entropy_bonus_micro_batching_and_the_old_logp_pass_change_nothing(tiny_model, algo) -> None:
    """The bonus -alpha * agg(H) of the sampling distribution's entropy, aggregated as the row's
    policy loss: the same gradient in one micro-batch, in several, and with the separate old-logp pass;
    its metric is -alpha times the reference aggregate of the step's entropy (on-policy: the same weights)."""
    spec = get_algo(algo).replace(entropy_coef=0.05, dynamic_sampling=False)
    m_full, g_full, st = _update(tiny_model, spec, micro=16)
    m_micro, g_micro, _ = _update(tiny_model, spec, micro=3)
    m_pass, g_pass, _ = _update(tiny_model, spec, micro=3, fuse=False)
    for g in (g_micro, g_pass):
        assert g.keys() == g_full.keys() and g_full
        for k in g_full:
            torch.testing.assert_close(g[k], g_full[k], rtol=1e-4, atol=1e-6)
    want = ref.aggregate(st.entropy.tolist(), st.batch.mask.int().tolist(), spec.loss_agg, 16) * -0.05
    assert want < 0
    for m in (m_full, m_micro, m_pass):
        assert m["actor/entropy_loss"] == pytest.approx(want, rel=1e-4) and m["actor/entropy_coef"] == 0.05


def test_entropy_bonus_changes_the_gradient_and_is_absent_when_off(tiny_model) -> None:
    spec = get_algo("dapo").replace(dynamic_sampling=False)
    m0, g0, _ = _update(tiny_model, spec, micro=16)
    m1, g1, _ = _update(tiny_model, spec.replace(entropy_coef=0.05), micro=16)
    assert "actor/entropy_loss" not in m0 and "actor/entropy_coef" not in m0 and "actor/entropy_loss" in m1
    assert any(not torch.allclose(g0[k], g1[k]) for k in g0)
    assert m1["actor/pg_loss"] == pytest.approx(m0["actor/pg_loss"] + m1["actor/entropy_loss"], rel=1e-4, abs=1e-7)


def test_adaptive_entropy_coefficient_moves_after_the_step(tiny_model) -> None:
    """Skywork-OR1's rule on the step's mean token entropy (actor/entropy): below the target, alpha
    rises by delta and the next step applies it; above it, alpha falls (not below 0) and the next
    step applies none. The state is the learner's, for the checkpoint."""
    import math

    base = get_algo("dapo").replace(dynamic_sampling=False, entropy_coef=0.002, entropy_coef_delta=1e-3, entropy_coef_max=0.0025)
    for target, coef, on in [(1e6, 0.0025, True), (0.0, 0.001, False)]:  # capped at 0.0025 / down by delta
        learner, groups, group_size = _learner(tiny_model, base.replace(entropy_target=target), micro=16)
        st = learner.prepare(groups)
        learner.advantages(st, group_size=group_size)
        m = learner.update_policy(st)
        assert m["actor/entropy_coef"] == 0.002 and m["actor/entropy_loss"] < 0  # step 1: alpha_0, on
        assert math.isclose(learner.entropy.coef, coef, rel_tol=1e-12) and learner.entropy.on is on
        assert learner.entropy.applied() == (coef if on else 0.0)
        fresh, _, _ = _learner(tiny_model, base.replace(entropy_target=target), micro=16)
        fresh.load(learner.state())
        assert (fresh.entropy.coef, fresh.entropy.on) == (learner.entropy.coef, learner.entropy.on)
