"""The trainer scores every token under the distribution the engine sampled from (temperature,
top-k, top-p): its old log-probs equal the engine's."""

from __future__ import annotations

import pytest

from reasonrl.algos import Sampling, get_algo
from reasonrl.engines.base import SamplingParams
from reasonrl.rollouts import Sample

SETTINGS = [(1.0, 1.0, -1), (0.6, 1.0, -1), (1.0, 0.7, -1), (0.8, 0.9, 20)]


def _groups(engine, tok, params: SamplingParams) -> list[list[Sample]]:
    texts = [tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], tokenize=False, add_generation_prompt=True)
             for a, b in [(1, 2), (3, 4), (0, 0), (2, 2)]]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    out = engine.generate(prompts, params)
    return [[Sample(group=i, prompt_index=i, prompt=texts[i], prompt_ids=prompts[i], response="", response_ids=c.token_ids,
                    logprobs=c.logprobs, finish_reason=c.finish_reason, truncated=c.truncated, ground_truth="0") for c in g]
            for i, g in enumerate(out)]


def _trainer_view(model_dir, groups, sampling: Sampling):
    from reasonrl.models.loading import load_causal_lm, load_tokenizer
    from reasonrl.train.learner import Learner

    tok = load_tokenizer(model_dir)
    learner = Learner(spec=get_algo("grpo"), policy=load_causal_lm(model_dir), policy_backend=None, critic_backend=None, ref_model=None,
                      sampling=sampling, pad_id=tok.pad_token_id, max_len=24, micro_batch_size=8, mini_batch_size=8, ppo_epochs=1,
                      dtype="fp32", seed=0)
    return learner.prepare(groups)


def _gap(st) -> float:
    v = st.batch.valid.bool()
    return float((st.old_logp - st.sampler_logp).abs()[v].max())


@pytest.mark.parametrize("temperature,top_p,top_k", SETTINGS)
def test_hf_engine_and_trainer_agree(format_model, temperature, top_p, top_k) -> None:
    from reasonrl.engines.hf import HFEngine
    from reasonrl.models.loading import load_tokenizer

    engine = HFEngine(str(format_model), dtype="fp32", seed=0, batch_size=16)
    params = SamplingParams(n=4, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=24, seed=1)
    groups = _groups(engine, load_tokenizer(format_model), params)
    st = _trainer_view(format_model, groups, Sampling(temperature=temperature, top_p=top_p, top_k=top_k))
    assert _gap(st) <= 1e-5
    assert st.metrics["rollout/logprob_diff_max"] <= 1e-5 and st.metrics["rollout/mismatch_kl"] <= 1e-9
    if (temperature, top_p, top_k) != (1.0, 1.0, -1):
        # scoring under raw logits (what the trainer did before) is far off
        assert _gap(_trainer_view(format_model, groups, Sampling())) > 0.05


VLLM_TOL = 1e-4  # stated tolerance: vLLM's CPU fp32 kernels against transformers' eager fp32 forward (measured max 2.4e-6)


@pytest.mark.vllm
@pytest.mark.parametrize("temperature,top_p,top_k", SETTINGS)
def test_vllm_engine_and_trainer_agree(format_model, temperature, top_p, top_k) -> None:
    pytest.importorskip("vllm")
    from reasonrl.engines.vllm_engine import VLLMEngine
    from reasonrl.models.loading import load_tokenizer

    engine = VLLMEngine(str(format_model), dtype="fp32", seed=0, max_model_len=512)
    try:
        params = SamplingParams(n=4, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=24, seed=1)
        groups = _groups(engine, load_tokenizer(format_model), params)
    finally:
        engine.close()
    st = _trainer_view(format_model, groups, Sampling(temperature=temperature, top_p=top_p, top_k=top_k))
    print(f"vLLM vs trainer at T={temperature} top_p={top_p} top_k={top_k}: max |Δ logprob| = {_gap(st):.2e}")
    assert _gap(st) <= VLLM_TOL
