"""One update per batch: the old log-probs come from the update's own forward (detached), not from a
separate pass. Checked against the separate pass on the same rollouts: the same old log-probs,
entropy, rollout/trainer mismatch, TIS weights, losses and gradients (to float tolerance), one
policy forward less; the separate pass stays where the old log-probs are needed before the update.
And the micro-batch arrangement inside a mini-batch (groups together, or longest first)."""

from __future__ import annotations

import random

import pytest
import torch

from reasonrl.algos import Sampling, get_algo
from reasonrl.rollouts import Sample


def _groups(vocab: int, n_groups: int = 3, g: int = 4, seed: int = 0, prompt_len: tuple[int, int] = (3, 9)) -> list[list[Sample]]:
    rng = random.Random(seed)
    out = []
    for gi in range(n_groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_len))]
        group = []
        for j in range(g):
            resp = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 12))]
            correct = (gi + j) % 3 == 0
            # sampler log-probs off the trainer's by a known amount, so the mismatch and TIS have something to see
            lps = [-2.0 + 0.1 * ((k + j) % 5) for k in range(len(resp))]
            group.append(Sample(group=gi, prompt_index=gi, prompt="", prompt_ids=prompt, response="", response_ids=resp, logprobs=lps,
                                finish_reason="stop", truncated=j == 3, ground_truth="0", reward=1.0 if correct else -1.0, correct=correct,
                                shaped_reward=1.0 if correct else -1.0))
        out.append(group)
    return out


class _Count:
    """Counts the policy's forward calls (a forward pre-hook)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.n = 0
        model.register_forward_pre_hook(self)

    def __call__(self, *_: object) -> None:
        self.n += 1


def _run(model_dir, spec, *, fuse: bool, micro: int = 3, epochs: int = 1, mini: int | None = None, ref: bool = False, critic: bool = False,
         stale: bool = False):
    """prepare → advantages → (critic) → policy update on fixed rollouts; what the two paths must agree on.
    ``stale``: the first half of each response was sampled by the policy two versions back (partial rollouts)."""
    from reasonrl.models.loading import load_causal_lm, load_tokenizer
    from reasonrl.train.backend import TorchBackend
    from reasonrl.train.learner import Learner

    tok = load_tokenizer(model_dir)
    groups = _groups(len(tok))
    if stale:
        for smp in (x for g in groups for x in g):
            smp.versions = [1] * (smp.length // 2) + [3] * (smp.length - smp.length // 2)
    n = sum(len(g) for g in groups)
    torch.manual_seed(0)
    policy = load_causal_lm(model_dir)
    calls = _Count(policy)
    pb = TorchBackend(policy, lr=1e-3, weight_decay=0.0, grad_clip=0.0, warmup_steps=0, dtype="fp32")
    cb = None
    if critic:
        from reasonrl.models.value import new_value_model

        cb = TorchBackend(new_value_model(model_dir, seed=0), lr=1e-3, weight_decay=0.0, grad_clip=0.0, warmup_steps=0, dtype="fp32")
    learner = Learner(spec=spec, policy=policy, policy_backend=pb, critic_backend=cb, ref_model=load_causal_lm(model_dir).eval() if ref else None,
                      sampling=Sampling(temperature=0.9), pad_id=tok.pad_token_id, max_len=12, micro_batch_size=micro, mini_batch_size=mini or n,
                      ppo_epochs=epochs, dtype="fp32", seed=0, fuse_old_logp=fuse)
    st = learner.prepare(groups, step=3)
    prepare_calls = calls.n
    learner.advantages(st, group_size=4)
    m = learner.update_critic(st) if critic else {}
    m.update(learner.update_policy(st))
    m.update(st.metrics)
    grads = {k: p.grad.clone() for k, p in policy.named_parameters() if p.grad is not None}
    return st, m, grads, prepare_calls, calls.n


CASES = {
    "grpo": get_algo("grpo").replace(dynamic_sampling=False),
    "dapo+tis-token": get_algo("dapo").replace(dynamic_sampling=False, tis_cap=2.0, tis_level="token"),
    "dapo+tis-sequence": get_algo("dapo").replace(dynamic_sampling=False, tis_cap=2.0, tis_level="sequence", overlong_filter=True),
    "dapo+sequence-mask": get_algo("dapo").replace(dynamic_sampling=False, rollout_correction="sequence-mask", correction_cap=1e6),
    "dapo+icepop": get_algo("dapo").replace(dynamic_sampling=False, rollout_correction="icepop", correction_low=1e-3),  # (here: ratios ~1e-3-0.03)
    "grpo+bypass": get_algo("grpo").replace(dynamic_sampling=False, correction_mode="bypass"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_update_takes_the_old_logprobs_from_its_own_forward(tiny_model, case) -> None:
    spec = CASES[case]
    st0, m0, g0, prep0, total0 = _run(tiny_model, spec, fuse=False)
    st1, m1, g1, prep1, total1 = _run(tiny_model, spec, fuse=True)
    assert not st0.old_from_update and st1.old_from_update
    # one policy forward less: the separate pass made 2 calls (shared prompt: 2 passes) per micro-batch, the fused none
    assert prep1 == 0 and prep0 > 0 and total1 == total0 - prep0
    torch.testing.assert_close(st1.old_logp, st0.old_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(st1.entropy, st0.entropy, rtol=1e-5, atol=1e-5)
    assert bool((st1.old_logp != 0).any()) and bool((st1.entropy > 0).any())
    for k in ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/mismatch_kl", "actor/pg_loss", "actor/grad_norm"):
        assert m1[k] == pytest.approx(m0[k], rel=1e-4, abs=1e-6), k
    assert m0["rollout/logprob_diff_mean"] > 0.1  # the sampler's log-probs are off: the metrics measure something
    if spec.tis_cap is not None:
        torch.testing.assert_close(st1.is_weights, st0.is_weights, rtol=1e-4, atol=1e-5)
        assert float(st0.is_weights[st0.batch.mask.bool()].min()) < 1.9  # weights vary: TIS changes the gradient
        for k in ("actor/tis_weight_mean", "actor/tis_truncated_frac"):
            assert m1[k] == pytest.approx(m0[k], rel=1e-4, abs=1e-6), k
    elif spec.rollout_correction is not None:
        torch.testing.assert_close(st1.is_weights, st0.is_weights, rtol=1e-4, atol=1e-5)
        w = st0.is_weights[st0.batch.mask.bool()]
        assert float(w.max()) > float(w.min()) and bool((w != 1.0).any())  # weights vary: the correction changes the gradient
        for k in ("actor/correction_weight_mean", "actor/correction_masked_frac", "actor/correction_truncated_frac"):
            assert m1[k] == pytest.approx(m0[k], rel=1e-4, abs=1e-6), k
    else:  # no correction (and in bypass mode none is a weight): a batch without stale tokens trains as it always did
        assert st0.is_weights is None and st1.is_weights is None and st0.staleness is None
        assert "actor/correction_weight_mean" not in m0
    for k in ("rollout/mismatch_k1", "rollout/mismatch_k3_seq", "rollout/mismatch_chi2", "rollout/mismatch_ratio_max", "rollout/token_mult_prob_error"):
        assert m1[k] == pytest.approx(m0[k], rel=1e-4, abs=1e-6), k
    assert g0.keys() == g1.keys() and g0
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-4, atol=1e-6)


def test_bypass_anchors_the_ratio_at_the_sampler(tiny_model) -> None:
    """correction_mode bypass: π_old := π_behaviour. The sampler's log-probs here are far from the
    trainer's, so the first update's ratio is far from 1 and the clip fires; decoupled, it is 1."""
    _, m_dec, g_dec, _, _ = _run(tiny_model, CASES["grpo"], fuse=True)
    _, m_by, g_by, _, _ = _run(tiny_model, CASES["grpo+bypass"], fuse=True)
    assert m_dec["actor/clipfrac"] == 0.0 and m_dec["actor/ratio_max"] == pytest.approx(1.0)
    assert m_by["actor/clipfrac"] > 0.1 and m_by["actor/ratio_max"] < 0.1  # (pi / pi_sampler: the trainer's tokens are less likely here)
    assert any(not torch.allclose(g_dec[k], g_by[k]) for k in g_dec)


def test_stale_tokens_are_corrected_by_default_and_only_they(tiny_model) -> None:
    """Tokens sampled by an older policy (partial rollouts) get the default correction, token TIS
    with C = 2, with no option given; the fresh tokens of the same responses keep weight 1; the
    fused and separate paths agree; stale_correction None trains them uncorrected, and
    mask_stale_prefix takes them out of the loss."""
    spec = CASES["grpo"]
    st0, m0, g0, _, _ = _run(tiny_model, spec, fuse=False, stale=True)
    st1, m1, g1, _, _ = _run(tiny_model, spec, fuse=True, stale=True)
    lag = st0.staleness
    stale, fresh = (lag > 0) & st0.batch.mask.bool(), (lag == 0) & st0.batch.mask.bool()
    assert bool(stale.any()) and bool(fresh.any()) and float(lag.max()) == 2.0
    want = torch.exp(st0.old_logp - st0.sampler_logp).clamp(max=2.0)
    torch.testing.assert_close(st0.is_weights[stale], want[stale], rtol=1e-5, atol=1e-6)
    assert (st0.is_weights[fresh] == 1.0).all() and float(st0.is_weights[stale].min()) < 1.9
    torch.testing.assert_close(st1.is_weights, st0.is_weights, rtol=1e-4, atol=1e-5)
    assert m0["actor/correction_scope_frac"] == pytest.approx(float(stale.sum()) / float(st0.batch.mask.sum()))
    assert m1["actor/correction_weight_mean"] == pytest.approx(m0["actor/correction_weight_mean"], rel=1e-4)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-4, atol=1e-6)
    st2, m2, g2, _, _ = _run(tiny_model, spec.replace(stale_correction=None), fuse=True, stale=True)
    assert st2.is_weights is None and "actor/correction_weight_mean" not in m2
    assert any(not torch.allclose(g2[k], g1[k]) for k in g1)
    st3, _, _, _, _ = _run(tiny_model, spec.replace(mask_stale_prefix=True), fuse=True, stale=True)
    assert not bool(st3.batch.mask[st3.staleness > 0].any()) and bool(st3.batch.mask.bool().any())
    assert torch.equal(st3.batch.mask.bool(), fresh)
    assert float(st3.is_weights.min()) == 1.0  # (no counted token is stale: nothing left to correct)


def test_with_a_critic_and_a_kl_loss_only_the_policy_pass_moves(tiny_model) -> None:
    spec = get_algo("ppo").replace(kl_coef=0.1, kl_in_reward=False)
    st0, m0, g0, _, _ = _run(tiny_model, spec, fuse=False, ref=True, critic=True)
    st1, m1, g1, _, _ = _run(tiny_model, spec, fuse=True, ref=True, critic=True)
    assert st1.old_from_update
    torch.testing.assert_close(st1.values, st0.values, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(st1.ref_logp, st0.ref_logp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(st1.old_logp, st0.old_logp, rtol=1e-5, atol=1e-5)
    assert m1["actor/kl_ref"] == pytest.approx(m0["actor/kl_ref"], rel=1e-4, abs=1e-7)
    assert m1["critic/vf_loss"] == pytest.approx(m0["critic/vf_loss"], rel=1e-5)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("why", ["two epochs", "two mini-batches", "kl in the reward"])
def test_the_separate_pass_stays_where_the_old_logprobs_come_first(tiny_model, why) -> None:
    kw: dict = {"two epochs": {"epochs": 2}, "two mini-batches": {"mini": 6}, "kl in the reward": {"ref": True}}[why]
    spec = get_algo("ppo").replace(kl_coef=0.1, kl_in_reward=True) if why == "kl in the reward" else CASES["grpo"]
    st, m, _, prep, _ = _run(tiny_model, spec, fuse=True, critic=why == "kl in the reward", **kw)
    assert not st.old_from_update and prep > 0
    assert "rollout/logprob_diff_mean" in m


def test_micro_batches_hold_whole_groups_when_prompts_dominate(tiny_model) -> None:
    """Long shared prompts: a group's rows go together (each prompt computed once); short ones:
    longest rows first (least padding). Either way the mini-batch's rows, each once."""
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.train.learner import Learner

    tok = load_tokenizer(tiny_model)
    for plen, together in (((60, 60), True), ((1, 1), False)):
        groups = _groups(len(tok), n_groups=4, g=4, seed=1, prompt_len=plen)
        learner = Learner(spec=CASES["grpo"], policy=None, policy_backend=None, critic_backend=None, ref_model=None, sampling=Sampling(),
                          pad_id=tok.pad_token_id, max_len=12, micro_batch_size=4, mini_batch_size=16, ppo_epochs=1, dtype="fp32", seed=0)
        st = learner.prepare(groups)
        mini = torch.randperm(16, generator=torch.Generator().manual_seed(3)).tolist()
        micros = learner.micro_batches(st, mini)
        order = [r for m in micros for r in m]
        assert sorted(order) == list(range(16)) and [len(m) for m in micros] == [4] * 4
        whole = all(len({int(st.group[r]) for r in mic}) == 1 for mic in micros)
        lengths = st.batch.valid.sum(1)[order].tolist()
        assert whole == together
        if not together:
            assert lengths == sorted(lengths, reverse=True)


def _stale_worker(rank: int, world: int, port: int, model_dir: str, out: dict) -> None:
    """One rank of a two-rank step whose batch carries versions on rank 0 only (rank 1's responses
    hold none, as empty responses would): the ranks must still run the same collectives."""
    import torch.distributed as dist

    from reasonrl.models.loading import load_causal_lm, load_tokenizer
    from reasonrl.train.backend import TorchBackend
    from reasonrl.train.learner import Learner
    from reasonrl.train.ranks import Ranks
    from reasonrl.train.step_metrics import staleness_metrics

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tok = load_tokenizer(model_dir)
    groups = _groups(len(tok), n_groups=2, seed=rank)
    if rank == 0:
        for smp in (x for g in groups for x in g):
            smp.versions = [1] * (smp.length // 2) + [3] * (smp.length - smp.length // 2)
    torch.manual_seed(0)
    policy = load_causal_lm(model_dir)
    pb = TorchBackend(policy, lr=1e-3, weight_decay=0.0, grad_clip=0.0, warmup_steps=0, dtype="fp32")
    ranks = Ranks(rank, world)
    learner = Learner(spec=CASES["grpo"], policy=policy, policy_backend=pb, critic_backend=None, ref_model=None, sampling=Sampling(temperature=0.9),
                      pad_id=tok.pad_token_id, max_len=12, micro_batch_size=3, mini_batch_size=8, ppo_epochs=1, dtype="fp32", seed=0, ranks=ranks)
    st = learner.prepare(groups, step=3)
    learner.advantages(st, group_size=4)
    m = learner.update_policy(st)
    m.update(st.metrics)
    m.update(staleness_metrics(st, ranks))
    out[rank] = {"metrics": {k: v for k, v in m.items() if k.startswith(("rollout/", "actor/correction"))},
                 "stale_rows": int((st.staleness > 0).any(1).sum()), "lagged": st.staleness is not None}
    dist.destroy_process_group()


def test_two_ranks_agree_on_a_batch_with_stale_tokens_on_one_of_them(tiny_model) -> None:
    """Whether a batch carries versions is decided over every rank: a rank whose responses carry
    none still runs the staleness and correction collectives, and both report the same numbers."""
    import socket
    import time

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    ctx = mp.spawn(_stale_worker, args=(2, port, str(tiny_model), out), nprocs=2, join=False)
    deadline = time.monotonic() + 300
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the ranks did not finish the step (collectives out of step)")
    r0, r1 = out[0], out[1]
    assert r0["lagged"] and r1["lagged"] and r0["stale_rows"] > 0 and r1["stale_rows"] == 0
    assert r0["metrics"] == r1["metrics"]
    assert r0["metrics"]["rollout/staleness_max"] == 2 and 0 < r0["metrics"]["rollout/stale_token_frac"] < 0.5
    assert 0 < r0["metrics"]["actor/correction_scope_frac"] < 0.5
