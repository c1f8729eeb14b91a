"""``--gradient-checkpointing`` (``make_backend``, shared by train and pretrain-value) recomputes
activations in the backward pass and changes nothing else: the same losses, gradient norms and
weights as without it, on the real policy update of fixed rollouts (tests/train/ds_worker.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def test_gradient_checkpointing_gives_the_same_update(tiny_model) -> None:
    from reasonrl.models.loading import load_causal_lm, load_tokenizer
    from reasonrl.train.run import make_backend
    from reasonrl.stages.train import TrainConfig

    spec = importlib.util.spec_from_file_location("reasonrl_ds_worker", Path(__file__).with_name("ds_worker.py"))
    w = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w)
    tok = load_tokenizer(tiny_model)
    groups = w.fixed_groups(len(tok))
    runs = []
    for gc in (False, True):
        cfg = TrainConfig(gradient_checkpointing=gc, weight_decay=0.1, grad_clip=0.5, warmup_steps=2, micro_batch_size=w.MICRO, mini_batch_size=16)
        model = load_causal_lm(tiny_model)
        backend = make_backend(cfg, model, 2e-3, "fp32")
        assert model.is_gradient_checkpointing == gc
        learner = w.make_learner(backend.model, backend, tok, 0, 1, len(groups) * w.GROUP_SIZE)
        runs.append(([w.train_step(learner, groups) for _ in range(2)], backend.full_state_dict()))
    (m0, w0), (m1, w1) = runs
    for a, b in zip(m0, m1):
        assert abs(a["pg_loss"] - b["pg_loss"]) <= 1e-6 and abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * max(1.0, a["grad_norm"])
    assert max(float((w0[k] - w1[k]).abs().max()) for k in w0) <= 5e-5  # (Adam turns float-order noise of near-zero gradients into steps)
    init = load_causal_lm(tiny_model).state_dict()
    assert max(float((w0[k] - init[k]).abs().max()) for k in init) > 1e-3  # the update moved the weights far beyond the tolerance
