"""Training really learns: from a fixed seed, every --algo row raises the reward on a toy task.

The tiny model is first taught only the *format* ("Answer: d", d uniform in 0..4, independent of
the question), so it starts near chance (~20%). Every toy problem's answer is 3: a policy whose
update has the right sign, advantages and clipping moves mass onto "3" within a few steps; a
broken one (wrong sign, zero advantages, masks off) does not. Asserts on reward, never on time.
"""

from __future__ import annotations

import json

import pytest

from toyhelp import toy_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    from reasonrl.stages.prepare_data import PrepareConfig, run_prepare

    d = tmp_path_factory.mktemp("learn")
    f = d / "toy.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in toy_rows(60, seed=5, total=3)))
    run_prepare(PrepareConfig(inputs=[str(f)], out=str(d / "data"), template="none", decontaminate=[], val_size=1))
    return d / "data"


# Per-row settings: gspo splits each step's batch into 4 mini-batches, as its paper (with one, it
# is GRPO); vapo's critic learns at a toy-sized rate (the CLI default 1e-5 is for real models).
ROWS = {"grpo": {}, "dapo": {}, "gspo": {"mini_batch_size": 16, "micro_batch_size": 16}, "cispo": {}, "drgrpo": {}}


def _train(algo: str, format_model, toy_data, out, **extra) -> list[dict]:
    from reasonrl.stages.train import TrainConfig
    from reasonrl.stages.train import run_train

    kw = dict(steps=8, prompts_per_step=8, group_size=8, max_response_len=8, overlong_cache_len=2, engine="hf", dtype="fp32", lr=2e-3,
              mini_batch_size=32, micro_batch_size=32, max_gen_rounds=3, seed=0)
    cfg = TrainConfig(model=str(format_model), data=str(toy_data), out=str(out), algo=algo, **{**kw, **extra})
    return run_train(cfg)["history"]


def _assert_learned(hist: list[dict]) -> None:
    rewards = [h["rollout/reward_mean"] for h in hist]
    first = sum(rewards[:2]) / 2
    last = sum(rewards[-3:]) / 3
    assert last > first + 0.4, rewards
    assert hist[-1]["rollout/acc_mean"] > 0.5, rewards


@pytest.mark.parametrize("algo", list(ROWS))
def test_reward_rises(algo, format_model, toy_data, tmp_path):
    _assert_learned(_train(algo, format_model, toy_data, tmp_path / algo, **ROWS[algo]))


def test_vapo_reward_rises_from_a_pretrained_critic(format_model, toy_data, tmp_path):
    from reasonrl.stages.pretrain_value import PretrainValueConfig, run_pretrain_value

    critic = tmp_path / "critic"
    run_pretrain_value(PretrainValueConfig(model=str(format_model), data=str(toy_data), out=str(critic), steps=8, prompts_per_step=8, group_size=8,
                                           max_response_len=8, critic_lr=2e-3, mini_batch_size=32, micro_batch_size=32, eval_prompts=1,
                                           engine="hf", dtype="fp32", seed=0))
    hist = _train("vapo", format_model, toy_data, tmp_path / "vapo", critic=str(critic), critic_lr=1e-3)
    _assert_learned(hist)
    assert all(h["actor/nll_loss"] > 0 for h in hist)  # the positive-example NLL ran every step
    assert "critic/vf_loss" in hist[-1]
