"""Learner details: ratio_max is a max over every update, the critic's micro-batch weights use the
loss's own mask, and the cross-rank trim counts what is trained on."""

from __future__ import annotations

import math
import random

import pytest

from reasonrl.algos import Sampling, get_algo
from reasonrl.rollouts import Sample


def _groups(vocab: int, n_groups: int = 2, g: int = 4, seed: int = 0, truncate_every: int = 0) -> list[list[Sample]]:
    rng = random.Random(seed)
    out = []
    for gi in range(n_groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 8))]
        group = []
        for j in range(g):
            resp = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 10))]
            correct = (gi + j) % 2 == 0
            trunc = bool(truncate_every) and j % truncate_every == 0
            group.append(Sample(group=gi, prompt_index=gi, prompt="", prompt_ids=prompt, response="", response_ids=resp, logprobs=[0.0] * len(resp),
                                finish_reason="length" if trunc else "stop", truncated=trunc, ground_truth="0",
                                reward=1.0 if correct else -1.0, correct=correct, shaped_reward=1.0 if correct else -1.0))
        out.append(group)
    return out


def _learner(model_dir, spec, micro: int, mini: int, critic: bool = False, fuse: bool = True):
    from reasonrl.models.loading import load_causal_lm, load_tokenizer
    from reasonrl.train.backend import TorchBackend
    from reasonrl.train.learner import Learner

    tok = load_tokenizer(model_dir)
    policy = load_causal_lm(model_dir)
    pb = TorchBackend(policy, lr=1e-9, weight_decay=0.0, grad_clip=0.0, warmup_steps=0, dtype="fp32")
    cb = None
    if critic:
        from reasonrl.models.value import new_value_model

        cb = TorchBackend(new_value_model(model_dir), lr=1e-9, weight_decay=0.0, grad_clip=0.0, warmup_steps=0, dtype="fp32")
    return Learner(spec=spec, policy=policy, policy_backend=pb, critic_backend=cb, ref_model=None, sampling=Sampling(), pad_id=tok.pad_token_id,
                   max_len=10, micro_batch_size=micro, mini_batch_size=mini, ppo_epochs=1, dtype="fp32", seed=0, fuse_old_logp=fuse), tok


def test_ratio_max_is_the_max_over_micro_batches(tiny_model) -> None:
    learner, tok = _learner(tiny_model, get_algo("grpo"), micro=2, mini=8, fuse=False)  # (the separate pass: old_logp edited below)
    st = learner.prepare(_groups(len(tok)))
    learner.advantages(st, group_size=4)
    st.old_logp[0] -= 1.0 * st.batch.valid[0]  # row 0's tokens: ratio e before any update
    m = learner.update_policy(st)
    assert m["actor/ratio_max"] == pytest.approx(math.e, rel=1e-3)  # (the mean of the 4 micro-batches' maxima was ~1.4)


def test_critic_micro_batches_add_up_to_the_whole_batch(tiny_model) -> None:
    """With truncated responses (loss mask 0 under overlong filtering, but valid for the critic),
    splitting into micro-batches must not change the critic's gradient."""
    spec = get_algo("vcppo").replace(overlong_filter=True)
    norms = []
    for micro in (8, 2, 3):
        learner, tok = _learner(tiny_model, spec, micro=micro, mini=8, critic=True)
        st = learner.prepare(_groups(len(tok), truncate_every=2))
        learner.advantages(st, group_size=4)
        norms.append(learner.update_critic(st)["critic/grad_norm"])
    assert norms[1] == pytest.approx(norms[0], rel=1e-5) and norms[2] == pytest.approx(norms[0], rel=1e-5), norms


