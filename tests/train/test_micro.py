"""Micro-batches cut to a token budget (``reasonrl.train.micro``): every row once, within the budget,
as many on every rank; and the same gradients (fp32) as micro-batches cut by rows, for the policy
(token-mean and sequence-mean losses, the fused and the separate old-log-prob pass) and the critic."""

from __future__ import annotations

import random

import pytest
import torch

from reasonrl.algos import Sampling, get_algo
from reasonrl.rollouts import Sample
from reasonrl.train.micro import RowLengths, arrange, by_rows, by_tokens, split_to, to_budget


def _lens(seed: int = 0, groups: int = 4, g: int = 6) -> RowLengths:
    rng = random.Random(seed)
    prompt, response, group = [], [], []
    for gi in range(groups):
        p = rng.randint(5, 40)
        for _ in range(g):
            prompt.append(p)
            response.append(int(min(200, rng.lognormvariate(3.0, 1.0))) + 1)  # heavy-tailed, as long CoT
            group.append(gi)
    return RowLengths(prompt, response, group)


@pytest.mark.parametrize("budget", [1, 60, 300, 2000, 10**6])
def test_a_budget_cut_takes_every_row_once_and_stays_within_it(budget):
    lens = _lens()
    rows = list(range(len(lens.group)))
    random.Random(1).shuffle(rows)
    micros = to_budget(lens, rows, budget)
    assert sorted(r for m in micros for r in m) == sorted(rows)
    assert all(lens.cost(m) <= budget or len(m) == 1 for m in micros)  # (a row over the budget goes alone)
    for order in lens.orders(rows):  # greedy: no micro-batch could have taken its successor's first row
        cut = by_tokens(lens, order, budget)
        assert all(lens.cost(a + b[:1]) > budget for a, b in zip(cut, cut[1:]))
    if budget >= lens.cost(rows):
        assert len(micros) == 1


def test_short_rows_go_many_to_a_micro_batch_long_ones_few():
    lens = RowLengths(prompt=[10] * 8, response=[200, 190, 10, 9, 8, 7, 6, 5], group=list(range(8)))
    micros = to_budget(lens, list(range(8)), 450)
    assert [len(m) for m in micros] == [2, 6]  # 2 × (10 + 200) = 420; then 6 × (10 + 10) = 120
    assert sum(lens.cost(m) for m in micros) < sum(lens.cost(m) for m in by_rows(arrange(lens, list(range(8)), 4), 4))


def test_a_micro_batch_costs_the_tokens_its_forward_runs():
    """shared: distinct prompts at the longest prompt + rows at the longest response; plain: rows
    at the longest prompt + longest response; packed: the real tokens, each prompt once."""
    kw = dict(prompt=[10, 10, 30], response=[50, 5, 20], group=[0, 0, 1])
    rows = [0, 1, 2]
    assert RowLengths(**kw).cost(rows) == 2 * 30 + 3 * 50
    assert RowLengths(**kw, forward="plain").cost(rows) == 3 * (30 + 50)
    assert RowLengths(**kw, forward="packed").cost(rows) == 10 + 30 + 50 + 5 + 20
    # a budget counted in packed tokens takes more rows to a micro-batch (padding is not counted)
    lens = _lens(seed=2)
    every = list(range(len(lens.group)))
    packed = RowLengths(lens.prompt, lens.response, lens.group, forward="packed")
    assert len(to_budget(packed, every, 600)) < len(to_budget(lens, every, 600))
    assert all(packed.cost(m) <= 600 or len(m) == 1 for m in to_budget(packed, every, 600))


def test_split_to_reaches_the_count_keeping_every_row():
    lens = _lens(seed=3)
    rows = list(range(len(lens.group)))
    micros = to_budget(lens, rows, 800)
    for count in (len(micros), len(micros) + 1, len(micros) + 5, len(rows), len(rows) + 3):
        out = split_to(lens, micros, count)
        assert len(out) == min(count, len(rows)) and sorted(r for m in out for r in m) == rows and all(out)
        assert max(lens.cost(m) for m in out) <= max(lens.cost(m) for m in micros)


# ---------------------------------------------------------------- the same gradients


def _groups(vocab: int, seed: int = 0, n_groups: int = 3, g: int = 4) -> list[list[Sample]]:
    rng = random.Random(seed)
    out = []
    for gi in range(n_groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 9))]
        group = []
        for j in range(g):
            n = rng.choice([1, 2, 3, 5, 8, 16, 24])  # (one long row among short ones)
            resp = [rng.randrange(3, vocab) for _ in range(n)]
            correct = (gi + j) % 2 == 0
            trunc = j == 3
            group.append(Sample(group=gi, prompt_index=gi, prompt="", prompt_ids=prompt, response="", response_ids=resp,
                                logprobs=[-0.5] * n, finish_reason="length" if trunc else "stop", truncated=trunc, ground_truth="0",
                                reward=1.0 if correct else -1.0, correct=correct, shaped_reward=1.0 if correct else -1.0))
        out.append(group)
    return out


def _learner(model_dir, spec, *, micro: int, budget: int, critic: bool, fuse: bool, mode: str = "shared"):
    from reasonrl.models.loading import load_causal_lm, load_tokenizer
    from reasonrl.train.backend import TorchBackend
    from reasonrl.train.learner import Learner

    tok = load_tokenizer(model_dir)
    policy = load_causal_lm(model_dir)
    hp = dict(lr=1e-9, weight_decay=0.0, grad_clip=0.0, warmup_steps=0, dtype="fp32")
    cb = None
    if critic:
        from reasonrl.models.value import new_value_model

        torch.manual_seed(0)  # (the value head's initialisation)
        cb = TorchBackend(new_value_model(model_dir), **hp)
    return Learner(spec=spec, policy=policy, policy_backend=TorchBackend(policy, **hp), critic_backend=cb, ref_model=None, sampling=Sampling(),
                   pad_id=tok.pad_token_id, max_len=24, micro_batch_size=micro, mini_batch_size=12, ppo_epochs=1, dtype="fp32", seed=0,
                   fuse_old_logp=fuse, max_tokens_per_micro_batch=budget, forward_mode=mode), tok


def _update(model_dir, spec, *, micro: int, budget: int, critic: bool = False, fuse: bool = True, mode: str = "shared"):
    learner, tok = _learner(model_dir, spec, micro=micro, budget=budget, critic=critic, fuse=fuse, mode=mode)
    st = learner.prepare(_groups(len(tok)))
    learner.advantages(st, group_size=4)
    m = learner.update_critic(st) if critic else {}
    m.update(learner.update_policy(st))
    cuts = [learner.micro_batches(st, list(range(12)))]
    model = learner.critic_backend.model if critic else learner.policy
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, m, st, cuts


@pytest.mark.parametrize("algo,critic,fuse", [("dapo", False, True), ("grpo", False, False), ("vcppo", True, True)])
def test_a_token_budget_gives_the_gradient_of_micro_batches_by_rows(tiny_model, algo, critic, fuse):
    """And the packed forward (``--forward-mode packed``/``auto``) the shared one's. dapo: token-mean loss, old log-probs from the update's forward; grpo: a sequence-mean loss and
    the separate no-grad pass (cut to the budget too); vcppo: the critic's value loss."""
    spec = get_algo(algo).replace(overlong_filter=True)
    ref_g, ref_m, ref_st, _ = _update(tiny_model, spec, micro=12, budget=0, critic=critic, fuse=fuse)  # one micro-batch
    for micro, budget, mode in [(3, 0, "shared"), (12, 40, "shared"), (12, 90, "shared"), (3, 0, "packed"), (12, 60, "packed"), (12, 0, "auto")]:
        g, m, st, cuts = _update(tiny_model, spec, micro=micro, budget=budget, critic=critic, fuse=fuse, mode=mode)
        if budget:
            assert len(cuts[0]) > 1  # (the budget did cut)
        assert g.keys() == ref_g.keys() and g
        for n in g:
            scale = float(ref_g[n].abs().max()) + 1e-12
            assert torch.allclose(g[n], ref_g[n], rtol=1e-4, atol=1e-5 * scale), (n, micro, budget, float((g[n] - ref_g[n]).abs().max()) / scale)
        valid = ref_st.batch.valid.bool()
        assert torch.allclose(st.old_logp[valid], ref_st.old_logp[valid], atol=1e-5)
        key = "critic/vf_loss" if critic else "actor/pg_loss"
        assert m[key] == pytest.approx(ref_m[key], rel=1e-4, abs=1e-6)


@pytest.mark.timeout(600)
def test_the_update_step_bench_cuts_its_random_order_variants_in_random_order(tiny_model, tmp_path):
    """bench/update_step.py compares the learner's arranged micro-batches (``default``) with a cut in
    the mini-batch's random order (``separate``, ``fused``: reasonrl before issue 12). It replaces the
    learner's cut (``Learner.micro_batches``); it set a ``Learner.arrange`` that the learner no longer
    had, so every variant silently ran the arranged cut. Its ``fwd tokens`` column shows the cut: the
    random order computes a prompt in more micro-batches, so its forward runs more tokens."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, str(root / "bench" / "update_step.py"), "--model", str(tiny_model), "--dtype", "fp32", "--prompts", "2",
           "--group-size", "4", "--micro", "2", "--rounds", "2", "--variants", "default,fused", "--workdir", str(tmp_path)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = {ln.split(" micro ")[0]: ln.split() for ln in p.stdout.splitlines() if ln.startswith(("default micro", "fused micro"))}
    assert set(rows) == {"default", "fused"}, p.stdout
    tokens = {k: int(v[-1]) for k, v in rows.items()}
    assert tokens["fused"] > tokens["default"], p.stdout  # (the same batch and mini-batch order, cut two ways)
    assert float(rows["fused"][-2]) < 1e-3, p.stdout  # and the same gradient (fp32), whatever the cut
