"""Tests that build and close vLLM engines of their own. vLLM keeps one distributed state per process
and an engine's close tears it down, so these live apart from test_vllm.py's shared engine (pytest,
in any order, runs a module's tests together)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from reasonrl.engines.base import EngineOptions, SamplingParams  # noqa: E402
from reasonrl.engines.registry import make_engine  # noqa: E402
from reasonrl.errors import ReasonRLError  # noqa: E402

pytestmark = pytest.mark.vllm


def test_make_engine_builds_vllm_and_refuses_options_of_other_engines(tiny_model, prompts) -> None:
    """A second engine in the same process after the first closes; max_model_len is capped to the
    model's 1024 positions; an option another engine reads (gen_batch_size: hf) is an error, not
    ignored; building the engine leaves torch's RNG state and torch.set_num_threads as they were."""
    from reasonrl.engines.vllm_engine import VLLMEngine

    VLLMEngine(str(tiny_model), dtype="fp32", seed=0, max_model_len=512).close()
    set_num_threads = torch.set_num_threads
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    with pytest.raises(ReasonRLError, match="--gen-batch-size does not apply to the vllm engine"):
        make_engine(EngineOptions(engine="vllm", dtype="fp32", gen_batch_size=8), str(tiny_model), seed=0)
    eng = make_engine(EngineOptions(engine="vllm", dtype="fp32"), str(tiny_model), seed=0, max_model_len=4096)
    try:
        # vLLM's in-process side effects are undone: the trainer's RNG state and set_num_threads
        assert torch.equal(torch.get_rng_state(), rng)
        assert torch.set_num_threads is set_num_threads
        assert eng.name == "vllm" and eng.max_model_len == 1024
        out = eng.generate(prompts, SamplingParams(temperature=0, max_tokens=4))
        assert [len(g[0].token_ids) for g in out] == [4, 4, 4]
    finally:
        eng.close()
    eng.close()


def test_cpu_block_size_shares_short_prompts_and_changes_no_sample(tiny_model) -> None:
    """On CPU the engine uses 32-token KV blocks (vLLM's CPU default, 128, caches nothing of a prompt
    shorter than 128 tokens, so every sample of a group prefilled it again). The blocks are a cache
    layout: the same seeded requests give the same tokens and log-probs with vLLM's default."""
    from reasonrl.engines.vllm_engine import CPU_BLOCK_SIZE, VLLMEngine

    if torch.cuda.is_available():
        pytest.skip("the CPU block size applies on CPU")
    prompts = [[(7 * i + j) % 500 + 3 for j in range(70 + 9 * i)] for i in range(3)]  # 70..88 tokens: two full blocks each
    p = SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=11)
    out = {}
    for block in (None, 128):
        eng = VLLMEngine(str(tiny_model), dtype="fp32", seed=0, max_model_len=512, block_size=block)
        try:
            assert eng.llm.llm_engine.vllm_config.cache_config.block_size == (block or CPU_BLOCK_SIZE)
            out[block] = eng.generate(prompts, p)
        finally:
            eng.close()
    assert CPU_BLOCK_SIZE == 32
    ours, theirs = out[None], out[128]
    assert [[c.token_ids for c in g] for g in ours] == [[c.token_ids for c in g] for g in theirs]
    diff = max(abs(a - b) for g, h in zip(ours, theirs) for c, d in zip(g, h) for a, b in zip(c.logprobs, d.logprobs))
    assert diff < 1e-4


def test_bf16_engine_takes_fp32_weights(tiny_model, prompts) -> None:
    """dtype conversion: a bf16 engine loads an fp32 state dict."""
    from reasonrl.engines.vllm_engine import VLLMEngine
    from reasonrl.models import load_causal_lm

    eng = VLLMEngine(str(tiny_model), dtype="bf16", seed=0, max_model_len=512)
    try:
        greedy = SamplingParams(temperature=0, max_tokens=8)
        base = eng.generate(prompts, greedy)
        original = load_causal_lm(tiny_model, dtype=torch.float32).state_dict()
        g = torch.Generator().manual_seed(1)
        eng.update_weights({k: v + 0.2 * torch.randn(v.shape, generator=g) for k, v in original.items()})
        assert [x[0].token_ids for x in eng.generate(prompts, greedy)] != [x[0].token_ids for x in base]
        eng.update_weights(original)
        again = eng.generate(prompts, greedy)
        assert [x[0].token_ids for x in again] == [x[0].token_ids for x in base]
    finally:
        eng.close()
