"""Models load dropout-free: two train-mode forwards give identical outputs (policy and critic)."""

from __future__ import annotations

import json

import torch


def _with_dropout(src, dst, **cfg):
    import shutil

    shutil.copytree(src, dst)
    c = json.loads((dst / "config.json").read_text())
    c.update(cfg)
    (dst / "config.json").write_text(json.dumps(c))
    return dst


def test_policy_and_critic_have_no_dropout(tiny_model, tmp_path) -> None:
    from reasonrl.models.loading import load_causal_lm
    from reasonrl.models.value import load_value_model, new_value_model

    model_dir = _with_dropout(tiny_model, tmp_path / "m", attention_dropout=0.5)
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    policy = load_causal_lm(model_dir).train()
    torch.manual_seed(1)
    a = policy(input_ids=ids).logits
    torch.manual_seed(2)
    b = policy(input_ids=ids).logits
    assert torch.equal(a, b)
    assert policy.config.attention_dropout == 0.0

    critic = new_value_model(model_dir).train()  # transformers' token-classification head defaults to dropout 0.1
    assert critic.config.classifier_dropout == 0.0
    torch.manual_seed(1)
    v1 = critic(input_ids=ids).logits
    torch.manual_seed(2)
    v2 = critic(input_ids=ids).logits
    assert torch.equal(v1, v2)
    critic.save_pretrained(tmp_path / "critic")
    again = load_value_model(tmp_path / "critic").train()
    torch.manual_seed(3)
    assert torch.equal(again(input_ids=ids).logits, critic(input_ids=ids).logits)
