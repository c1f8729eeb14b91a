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


def test_cpu_compiles_only_for_long_runs() -> None:
    """vLLM on CPU compiles when the caller expects enough decode steps to repay the compile (a
    long train run), runs eagerly otherwise (tests, the main job, an unknown count); GPUs compile
    always; a multi-process job or a tensor-parallel group on CPU stays eager."""
    import functools

    from reasonrl.engines.vllm_engine import CPU_COMPILE_MIN_DECODE_STEPS as N
    from reasonrl.engines.vllm_engine import compiled_by_default

    cpu = functools.partial(compiled_by_default, on_gpu=False)
    assert cpu(processes=1, tensor_parallel_size=1, expected_decode_steps=N)
    assert not cpu(processes=1, tensor_parallel_size=1, expected_decode_steps=N - 1)
    assert not cpu(processes=1, tensor_parallel_size=1, expected_decode_steps=None)
    assert not cpu(processes=2, tensor_parallel_size=1, expected_decode_steps=10 * N)
    assert not cpu(processes=2, tensor_parallel_size=2, expected_decode_steps=10 * N)
    assert compiled_by_default(on_gpu=True, processes=2, tensor_parallel_size=2, expected_decode_steps=None)


def test_compiled_engine_generates_as_eager_and_follows_weight_syncs(tiny_model, prompts, hf_logprobs) -> None:
    """A run long enough to compile (make_engine's decode_steps) gets a compiled engine on CPU: the
    same greedy tokens as the eager engine, and after each of two weight syncs the synced model's
    tokens and log-probs (the compiled graph reads the reloaded weights, not the ones it was
    compiled with)."""
    from reasonrl.engines.hf import HFEngine
    from reasonrl.engines.vllm_engine import CPU_COMPILE_MIN_DECODE_STEPS
    from reasonrl.models import load_causal_lm

    if torch.cuda.is_available():
        pytest.skip("the compile choice by run length applies on CPU")
    greedy = SamplingParams(temperature=0, max_tokens=12)
    opts = EngineOptions(engine="vllm", dtype="fp32")
    eager = make_engine(opts, str(tiny_model), seed=0, max_model_len=512, decode_steps=CPU_COMPILE_MIN_DECODE_STEPS - 1)
    try:
        assert not eager.compiled and eager.llm.llm_engine.vllm_config.model_config.enforce_eager
        want = [g[0].token_ids for g in eager.generate(prompts, greedy)]
    finally:
        eager.close()
    eng = make_engine(opts, str(tiny_model), seed=0, max_model_len=512, decode_steps=CPU_COMPILE_MIN_DECODE_STEPS)
    try:
        assert eng.compiled and not eng.llm.llm_engine.vllm_config.model_config.enforce_eager
        assert [g[0].token_ids for g in eng.generate(prompts, greedy)] == want
        model = load_causal_lm(tiny_model, dtype=torch.float32)
        g = torch.Generator().manual_seed(1)
        before = want
        for _ in range(2):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.1 * torch.randn(p.shape, generator=g))
            eng.update_weights(model.state_dict())
            out = eng.generate(prompts, greedy)
            ref = HFEngine(str(tiny_model), dtype="fp32", model=model).generate(prompts, greedy)
            assert [c[0].token_ids for c in out] == [c[0].token_ids for c in ref] != before
            before = [c[0].token_ids for c in out]
            for p, c in zip(prompts, out):
                torch.testing.assert_close(torch.tensor(c[0].logprobs), hf_logprobs(model, p, c[0].token_ids, temperature=0), atol=1e-4, rtol=0)
    finally:
        eng.close()
