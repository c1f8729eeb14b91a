"""reasonrl.perf: the FLOP count against a hand count and torch's own counter, the bound arithmetic
against hand-computed numbers, and the trainer's perf/… metrics. No timing is asserted."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from reasonrl.perf import (
    Limits,
    ModelShape,
    StepCounts,
    StepPerf,
    flops_per_token,
    gpu_peak_flops,
    phase_bounds,
    phase_gemms,
    step_work,
)


def _tiny_shape(tiny_model) -> ModelShape:
    return ModelShape.from_config(json.loads((tiny_model / "config.json").read_text()))


def test_flops_per_token_hand_count(tiny_model):
    s = _tiny_shape(tiny_model)
    V = s.vocab
    assert (s.hidden, s.intermediate, s.layers, s.heads, s.kv_heads, s.head_dim, s.tied) == (64, 128, 2, 2, 2, 32, True)
    # per layer: q, k, v, o are 64x64 each (4 * 4096), gate, up 64x128 and down 128x64 (3 * 8192) = 40960 weights
    assert s.layer_linear_params() == 40960
    # forward: 2 FLOPs per weight over 2 layers + attention 4 * layers * heads * head_dim * context + LM head 2 * 64 * V
    assert flops_per_token(s, context=10) == 2 * 2 * 40960 + 4 * 2 * 2 * 32 * 10 + 2 * 64 * V
    assert flops_per_token(s, context=10, lm_head=False) == 2 * 2 * 40960 + 4 * 2 * 2 * 32 * 10
    assert flops_per_token(s, context=10, backward=True) == 3 * flops_per_token(s, context=10)
    # parameters: layer linears + 2 norms per layer, final norm, one (tied) embedding
    assert s.params() == 2 * (40960 + 2 * 64) + 64 + V * 64


def test_flops_match_torch_counter(tiny_model):
    """torch's FlopCounterMode on the real tiny model, forward and forward + backward. Eager attention
    multiplies the full T x T score matrix (then masks it), so each token's context is T here."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    s = _tiny_shape(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="eager")
    T = 24
    ids = torch.randint(0, s.vocab, (1, T))
    with FlopCounterMode(display=False) as fwd:
        model(ids).logits.sum()
    assert fwd.get_total_flops() == T * flops_per_token(s, context=T)
    with FlopCounterMode(display=False) as both:
        model(ids).logits.sum().backward()
    assert both.get_total_flops() == T * flops_per_token(s, context=T, backward=True)


# A model small enough to count by hand: hidden 2, intermediate 4, 1 layer, 1 head of dim 2, vocab 8.
# linears: qkv 2x6 = 12, o 2x2 = 4, gate_up 2x8 = 16, down 4x2 = 8 -> 40 weights; params 40 + 4 + 2 + 16 = 62.
# flops_per_token = 2 * 40 + 4 * 2 * context (+ 2 * 2 * 8 = 32 with the LM head) = 80 + 8c (+ 32).
SMALL = ModelShape(hidden=2, intermediate=4, layers=1, heads=1, kv_heads=1, head_dim=2, vocab=8, tied=True)
# 2 prompts of 3 tokens, G = 2, 12 response tokens (3 per response), longest 5; all trained on.
COUNTS = StepCounts(gen_prompts=2, gen_rows=4, gen_tokens=12, decode_steps=5, prompt_len=3, train_prompts=2, train_rows=4, train_tokens=24)
METRICS = {"rollout/batch_size": 4, "perf/train_tokens": 24, "rollout/ds_generated_groups": 2, "rollout/ds_kept_groups": 2,
           "rollout/prompt_length_mean": 3.0, "rollout/gen_tokens": 12, "rollout/response_length_max": 5}


def test_step_work_hand_count():
    assert SMALL.params() == 62 and SMALL.kv_bytes_per_token(2) == 8
    w = step_work(SMALL, COUNTS, engine_bytes=2)
    # contexts: prompt (3 + 1) / 2 = 2; responses 3 + (3 + 1) / 2 = 5
    assert w.prefill_flops == 2 * 3 * (80 + 8 * 2)  # 576
    assert w.decode_flops == 12 * (112 + 8 * 5)  # 1824
    assert w.decode_bytes == 5 * 62 * 2 + 12 * 5 * 8  # weights once per decode step + KV reads = 1100
    assert w.forward_flops == 576 + 1824
    assert w.critic_forward_flops == 576 + 12 * (80 + 40)
    assert w.update_flops == 3 * 2400


def test_phase_bounds_hand_count():
    w = step_work(SMALL, COUNTS, engine_bytes=2)
    b = phase_bounds(w, COUNTS, Limits.uniform(100.0, 10.0), engine_bytes=2)
    # memory-bound decode: 1100 bytes / 10 > 1824 FLOPs / 100
    assert b["generate"] == pytest.approx(576 / 100 + 1100 / 10)
    assert b["prepare"] == pytest.approx(2400 / 100)
    assert b["update_actor"] == pytest.approx(7200 / 100 + 62 * 28 / 10)  # + AdamW's traffic, one optimizer step
    assert b["weight_sync"] == pytest.approx(62 * (4 + 2) / 10)
    assert b["step"] == pytest.approx(115.76 + 24 + 245.6 + 37.2)
    # compute-bound decode once the bandwidth is large
    fast = phase_bounds(w, COUNTS, Limits.uniform(100.0, 1000.0), engine_bytes=2)
    assert fast["generate"] == pytest.approx((576 + 1824) / 100)
    # a critic and a reference model add their forwards and the critic's update
    # the old log-probs taken from the update's own forward: no policy forward in prepare
    fused = dataclasses.replace(COUNTS, old_pass=False)
    assert phase_bounds(w, fused, Limits.uniform(100.0, 10.0), engine_bytes=2)["prepare"] == 0.0
    assert StepCounts.from_metrics({**METRICS, "perf/old_logp_pass": 0.0}, group_size=2) == fused
    both = phase_bounds(w, COUNTS, Limits.uniform(100.0, 10.0), engine_bytes=2, critic=True, ref=True)
    assert both["prepare"] == pytest.approx((2 * 2400 + 2016) / 100)
    assert both["update_critic"] == pytest.approx(3 * 2016 / 100 + 62 * 28 / 10)


def test_counts_from_metrics():
    assert StepCounts.from_metrics(METRICS, group_size=2) == COUNTS
    old = {k: v for k, v in METRICS.items() if k != "rollout/prompt_length_mean"}  # logged before the metric existed
    assert StepCounts.from_metrics(old, group_size=2) == COUNTS
    with pytest.raises(ValueError, match="prompt_length_mean"):
        StepCounts.from_metrics({**old, "rollout/ds_generated_groups": 3}, group_size=2)
    assert StepCounts.from_metrics({"rollout/gen_tokens": 12}, group_size=2) is None  # no update this step
    # two processes: rollout counts are over both, perf/train_tokens this process's; the counts are one process's share
    both = {**METRICS, "rollout/batch_size": 8, "rollout/ds_generated_groups": 4, "rollout/ds_kept_groups": 4, "rollout/gen_tokens": 24}
    assert StepCounts.from_metrics(both, group_size=2, world=2) == COUNTS
    two = StepCounts.from_metrics(METRICS, group_size=2, epochs=2, mini_batch_size=3)
    assert (two.epochs, two.optimizer_steps) == (2, 4)


def test_step_perf_shares_and_mfu():
    perf = StepPerf(SMALL, peak_flops=100.0, bandwidth=10.0, engine_dtype="bf16", group_size=2)
    times = {"perf/generate_s": 231.52, "perf/prepare_s": 48.0, "perf/update_actor_s": 491.2, "perf/weight_sync_s": 74.4, "perf/step_s": 845.12}
    out = perf.metrics({**METRICS, **times})
    for k in ("generate", "prepare", "update_actor", "weight_sync", "step"):
        assert out[f"perf/{k}_bound_frac"] == pytest.approx(0.5), k
    assert out["perf/step_bound_s"] == pytest.approx(422.56)
    assert out["perf/mfu"] == pytest.approx(7200 / (491.2 * 100))
    assert perf.metrics({"rollout/gen_tokens": 12}) == {}


def test_phase_gemms_and_gpu_table(tiny_model):
    s = _tiny_shape(tiny_model)
    prefill = phase_gemms(s, 100, kind="prefill")
    assert "lm_head" not in prefill and prefill["qkv"] == [(100, 64, 3 * 64, 2)]
    assert phase_gemms(s, 100, kind="decode")["lm_head"] == [(100, 64, s.vocab, 1)]

    def flops(kind: str) -> int:
        return sum(2 * m * k * n * c for products in phase_gemms(s, 100, kind=kind).values() for m, k, n, c in products)

    assert flops("train") == 3 * flops("forward") == 3 * 100 * flops_per_token(s, context=0)
    assert gpu_peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12  # the longest matching name wins
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(66.9e12)
    assert gpu_peak_flops("NVIDIA L40S", "bf16") == pytest.approx(362.1e12)
    assert gpu_peak_flops("Some New GPU", "bf16") is None


@pytest.mark.slow
@pytest.mark.parametrize("mini", [4, 2])
def test_train_logs_bound_shares(tiny_model, toy_data_file, tmp_path, mini):
    """The real trainer, peak measured at start-up: every step with an update logs its shares. One
    update per batch (mini-batch 4 = the batch) takes the old log-probs from the update's forward:
    prepare then has no policy forward, so no bound and no share; two updates keep the pass."""
    from reasonrl.stages.prepare_data import PrepareConfig, run_prepare
    from reasonrl.stages.train import TrainConfig, run_train

    run_prepare(PrepareConfig(inputs=[str(toy_data_file)], out=str(tmp_path / "data"), template="none", decontaminate=[], val_size=1))
    cfg = TrainConfig(model=str(tiny_model), data=str(tmp_path / "data"), out=str(tmp_path / "run"), algo="grpo", steps=1, prompts_per_step=2,
                      group_size=2, max_response_len=6, engine="hf", dtype="fp32", mini_batch_size=mini, micro_batch_size=2, seed=0)
    (m,) = run_train(cfg)["history"]
    fused = mini == 4
    assert m["perf/old_logp_pass"] == (0.0 if fused else 1.0)
    for k in ("generate", "update_actor", "weight_sync", "step") + (() if fused else ("prepare",)):
        assert 0 < m[f"perf/{k}_bound_frac"] < math.inf, k
    assert ("perf/prepare_bound_frac" in m) is not fused
    assert 0 < m["perf/mfu"] < math.inf and m["perf/step_bound_s"] > 0
    assert m["rollout/prompt_length_mean"] >= 1
