"""The in-process vLLM engine on the tiny model (real vLLM, fp32): rollout shapes, finish reasons,
log-probabilities (processed: the distribution sampled from), seeds, and greedy == transformers."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("vllm")

from reasonrl.engines.base import EngineOptions, SamplingParams  # noqa: E402
from reasonrl.engines.registry import make_engine  # noqa: E402
from reasonrl.engines.hf import HFEngine  # noqa: E402
from reasonrl.errors import ReasonRLError  # noqa: E402

pytestmark = pytest.mark.vllm


_HANDLERS: dict[str, dict] = {}  # SIGTERM / SIGINT handlers around the engine's build


@pytest.fixture(scope="module")
def engine(tiny_model):
    import signal

    from reasonrl.engines.vllm_engine import VLLMEngine

    handlers = lambda: {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # noqa: E731
    _HANDLERS["before"] = handlers()
    eng = VLLMEngine(str(tiny_model), dtype="fp32", seed=0, max_model_len=512)
    _HANDLERS["after"] = handlers()
    yield eng
    eng.close()


def test_building_keeps_the_signal_handlers(engine) -> None:
    """vLLM's engine-core process installs SIGTERM / SIGINT handlers; in this process (no engine-core
    process) it must not, or the CLI's clean stop on SIGTERM (reasonrl.interrupts) would be lost."""
    assert _HANDLERS["after"] == _HANDLERS["before"]


@pytest.fixture(scope="module")
def hf(tiny_model) -> HFEngine:
    return HFEngine(str(tiny_model), dtype="fp32")


def _check(out, prompts, n: int, max_tokens: int, eos_ids) -> None:
    assert len(out) == len(prompts)
    for g in out:
        assert len(g) == n
        for c in g:
            assert 1 <= len(c.token_ids) <= max_tokens
            assert len(c.logprobs) == len(c.token_ids)
            assert all(math.isfinite(x) and x <= 0 for x in c.logprobs)
            assert all(isinstance(t, int) and 0 <= t < 512 for t in c.token_ids)
            if c.finish_reason == "length":
                assert len(c.token_ids) == max_tokens
            else:
                assert c.finish_reason == "stop" and c.token_ids[-1] in eos_ids


def test_rollout_shapes_and_n(engine, prompts) -> None:
    out = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=0))
    _check(out, prompts, 4, 16, engine.eos_ids)
    assert len({tuple(c.token_ids) for c in out[0]}) == 4  # distinct samples
    # different prompts do not share random streams (per-prompt derived seeds)
    assert out[0][0].token_ids[:4] != out[1][0].token_ids[:4]
    assert [len(g) for g in out] == [4, 4, 4]
    assert engine.generate([], SamplingParams()) == []


def test_finish_reason_length_and_forced_stop(engine, prompts) -> None:
    greedy = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=5))
    assert [g[0].finish_reason for g in greedy] == ["length"] * 3
    assert all(len(g[0].token_ids) == 5 for g in greedy)
    first = greedy[1][0].token_ids[0]
    stop = engine.generate(prompts[1:2], SamplingParams(temperature=0, max_tokens=5, stop_token_ids=(first,)))[0][0]
    assert stop.finish_reason == "stop" and stop.token_ids == [first]  # the stop token is kept, like HF
    assert engine.eos_ids == {2}  # <|im_end|>; a natural EOS stop is tested in test_vllm_weights.py


def test_seed_reproducible_and_seeds_differ(engine, prompts) -> None:
    p = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=11)
    a = engine.generate(prompts, p)
    b = engine.generate(prompts, p)
    c = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=12))
    ids = lambda o: [x.token_ids for g in o for x in g]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)


def test_progress_callback_hears_everything_and_changes_nothing(engine, prompts, check_progress) -> None:
    check_progress(engine, prompts)  # through vLLM's own use_tqdm hook, in the same single call


def test_greedy_matches_transformers_fp32(engine, hf, prompts) -> None:
    p = SamplingParams(temperature=0, max_tokens=24)
    v = engine.generate(prompts, p)
    h = hf.generate(prompts, p)
    assert [g[0].token_ids for g in v] == [g[0].token_ids for g in h]
    assert [g[0].finish_reason for g in v] == [g[0].finish_reason for g in h]
    for gv, gh in zip(v, h):
        torch.testing.assert_close(torch.tensor(gv[0].logprobs), torch.tensor(gh[0].logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kw", [{"temperature": 0.7}, {"temperature": 1.3, "top_k": 20}, {"temperature": 1.0, "top_p": 0.3}])
def test_sampling_logprobs_are_processed(engine, hf, prompts, hf_logprobs, kw) -> None:
    """Logprobs are of the distribution sampled from (temperature, top-k/top-p renormalised), as
    the transformers engine's: recomputed by a full forward of the HF model."""
    out = engine.generate(prompts, SamplingParams(n=2, max_tokens=12, seed=5, **kw))
    for p, g in zip(prompts, out):
        for c in g:
            want = hf_logprobs(hf.model, p, c.token_ids, **kw)
            assert torch.isfinite(want).all()  # sampled tokens all survive the same filters
            torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-4, rtol=0)


def test_top_k_one_is_greedy_with_logprob_zero(engine, prompts) -> None:
    greedy = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=6))
    k1 = engine.generate(prompts, SamplingParams(temperature=1.0, top_k=1, max_tokens=6, seed=0))
    assert [g[0].token_ids for g in greedy] == [g[0].token_ids for g in k1]
    assert all(abs(x) < 1e-6 for g in k1 for x in g[0].logprobs)


def test_long_prompts_and_many_rows(engine, tiny_tok) -> None:
    """More rows than one decode step and prompts longer than a KV block (128 on CPU)."""
    text = " ".join(f"What is {i} + {i + 1}?" for i in range(100))
    long = tiny_tok(text, add_special_tokens=False)["input_ids"][:300]
    assert len(long) == 300
    prompts = [long, long[:150], [5, 6]] * 3
    out = engine.generate(prompts, SamplingParams(n=5, temperature=1.0, max_tokens=10, seed=1))
    _check(out, prompts, 5, 10, engine.eos_ids)
    greedy = engine.generate([long, long], SamplingParams(temperature=0, max_tokens=6))
    assert greedy[0][0].token_ids == greedy[1][0].token_ids  # second one reuses the cached prefix


def test_too_long_prompts_and_outputs(engine) -> None:
    """A completion that would pass max_model_len stops there ("length"); a prompt that fills it is
    a one-line ReasonRLError naming the fix."""
    from reasonrl.errors import ReasonRLError

    out = engine.generate([[5] * 500], SamplingParams(temperature=0, max_tokens=30))[0][0]
    assert (len(out.token_ids), out.finish_reason) == (12, "length")
    with pytest.raises(ReasonRLError, match="max_model_len is 512"):
        engine.generate([[5, 6], [5] * 512], SamplingParams(max_tokens=4))


def test_seeded_sampling_with_more_prompt_tokens_than_one_step(engine) -> None:
    """40 x 300-token prompts (> vLLM's 4096-token step budget): with chunked prefill, vLLM 0.32 on
    CPU crashes on seeded requests ("CPU Generator does not use offset"); the engine disables it."""
    import random

    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(300)] for _ in range(40)]
    p = SamplingParams(n=2, temperature=1.0, max_tokens=4, seed=3)
    a = engine.generate(prompts, p)
    b = engine.generate(prompts, p)
    assert [c.token_ids for g in a for c in g] == [c.token_ids for g in b for c in g]
    assert len(a) == 40 and all(len(g) == 2 for g in a)


def test_auto_dtype_follows_the_hardware() -> None:
    from reasonrl.devices import vllm_dtype

    want = "bfloat16" if (torch.cuda.is_available() or torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()) else "float32"
    assert vllm_dtype("auto") == want


def test_engine_sleep_needs_gpus_and_scale_options_are_vllm_only(tiny_model) -> None:
    """--engine-sleep on CPU: a one-line error saying why (vLLM has sleep mode on CUDA/ROCm/XPU only),
    before any engine is built; --engine-tp / --engine-sleep are the vllm engine's options."""
    if torch.cuda.is_available():
        pytest.skip("sleep mode runs on GPUs (bench/gpu_check.sh)")
    with pytest.raises(ReasonRLError) as e:
        make_engine(EngineOptions(engine="vllm", dtype="fp32", engine_sleep=True), str(tiny_model), seed=0)
    assert "--engine-sleep needs GPUs" in str(e.value) and "\n" not in str(e.value)
    for opt in ({"engine_tp": 2}, {"engine_sleep": True}):
        flag = "--" + next(iter(opt)).replace("_", "-")
        with pytest.raises(ReasonRLError, match=f"{flag} does not apply to the hf engine"):
            make_engine(EngineOptions(engine="hf", **opt), str(tiny_model), seed=0)
    with pytest.raises(ReasonRLError, match="engine_tp must be >= 1"):
        EngineOptions(engine_tp=0)._check_engine()
