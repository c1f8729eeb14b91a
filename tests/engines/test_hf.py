"""The transformers engine: top-k/top-p filtering, n samples per prompt, seeds, finish reasons,
log-probabilities (temperature 0 → log_softmax; sampling → the distribution sampled from)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from reasonrl.engines.base import SamplingParams
from reasonrl.engines.hf import HFEngine


# ---------------------------------------------------------------- generation
@pytest.fixture(scope="module")
def hf(tiny_model) -> HFEngine:
    return HFEngine(str(tiny_model), dtype="fp32", seed=0, batch_size=4)


def test_n_samples_per_prompt_shapes_and_logprobs(hf: HFEngine, prompts) -> None:
    out = hf.generate(prompts, SamplingParams(n=3, temperature=1.0, max_tokens=10, seed=1))
    assert len(out) == len(prompts) and all(len(g) == 3 for g in out)
    for g in out:
        for c in g:
            assert len(c.token_ids) == len(c.logprobs) and 1 <= len(c.token_ids) <= 10
            assert all(math.isfinite(x) and x <= 0 for x in c.logprobs)
            if c.finish_reason == "length":
                assert len(c.token_ids) == 10
            else:
                assert c.finish_reason == "stop" and c.token_ids[-1] in hf.eos_ids
    # the samples of a prompt differ (random 512-token model: a collision is ~impossible)
    assert len({tuple(c.token_ids) for c in out[0]}) == 3
    assert [len(g) for g in out] == [3] * len(prompts)


def test_seed_reproducible_and_seeds_differ(hf: HFEngine, prompts) -> None:
    p = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=7)
    a = hf.generate(prompts, p)
    b = hf.generate(prompts, p)
    c = hf.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=8))
    assert [x.token_ids for g in a for x in g] == [x.token_ids for g in b for x in g]
    assert [x.logprobs for g in a for x in g] == [x.logprobs for g in b for x in g]
    assert [x.token_ids for g in a for x in g] != [x.token_ids for g in c for x in g]


def test_progress_callback_hears_everything_and_changes_nothing(tiny_model, prompts, check_progress) -> None:
    check_progress(HFEngine(str(tiny_model), dtype="fp32", batch_size=4), prompts)  # 9 rows: 3 batches, 3 calls


def test_finish_reasons_length_and_forced_stop(hf: HFEngine, prompts) -> None:
    greedy = hf.generate(prompts, SamplingParams(temperature=0, max_tokens=6))
    for g in greedy:
        assert g[0].finish_reason == "length" and len(g[0].token_ids) == 6
    first = greedy[0][0].token_ids[0]
    stopped = hf.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=6, stop_token_ids=(first,)))[0][0]
    assert stopped.finish_reason == "stop" and stopped.truncated is False
    assert stopped.token_ids == [first]  # the stop token is kept


def test_temperature_zero_logprobs_equal_log_softmax(hf: HFEngine, prompts, hf_logprobs) -> None:
    out = hf.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    for p, g in zip(prompts, out):
        c = g[0]
        want = hf_logprobs(hf.model, p, c.token_ids, temperature=0)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-4, rtol=0)
        # greedy: each token is the argmax of its step
        with torch.no_grad():
            logits = hf.model(input_ids=torch.tensor([p + c.token_ids])).logits[0, len(p) - 1 : -1]
        assert logits.argmax(-1).tolist() == c.token_ids


def test_sampling_logprobs_are_of_the_filtered_distribution(hf: HFEngine, prompts, hf_logprobs) -> None:
    for kw in ({"temperature": 0.7}, {"temperature": 1.3, "top_k": 20}, {"temperature": 1.0, "top_p": 0.3}):
        out = hf.generate(prompts, SamplingParams(n=2, max_tokens=8, seed=3, **kw))
        for p, g in zip(prompts, out):
            for c in g:
                want = hf_logprobs(hf.model, p, c.token_ids, **kw)
                assert torch.isfinite(want).all()  # every sampled token survived the filters
                torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-4, rtol=0)


def test_top_k_one_is_greedy_with_logprob_zero(hf: HFEngine, prompts) -> None:
    greedy = hf.generate(prompts, SamplingParams(temperature=0, max_tokens=6))
    k1 = hf.generate(prompts, SamplingParams(temperature=1.0, top_k=1, max_tokens=6, seed=0))
    assert [g[0].token_ids for g in greedy] == [g[0].token_ids for g in k1]
    assert all(x == 0.0 for g in k1 for x in g[0].logprobs)


def test_batching_is_invisible(tiny_model, prompts) -> None:
    """Greedy results do not depend on batch size / left padding."""
    a = HFEngine(str(tiny_model), dtype="fp32", batch_size=1).generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    b = HFEngine(str(tiny_model), dtype="fp32", batch_size=8).generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    assert [g[0].token_ids for g in a] == [g[0].token_ids for g in b]
    for ga, gb in zip(a, b):
        torch.testing.assert_close(torch.tensor(ga[0].logprobs), torch.tensor(gb[0].logprobs), atol=1e-4, rtol=0)


def test_shared_prefill_equals_one_prefill_per_row(tiny_model, prompts) -> None:
    """A prompt's samples share one prefill (its cache copied per row), also when they straddle
    batches: greedy samples equal the one-row-at-a-time result."""
    one = HFEngine(str(tiny_model), dtype="fp32", batch_size=1).generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    shared = HFEngine(str(tiny_model), dtype="fp32", batch_size=5).generate(prompts, SamplingParams(n=3, temperature=0, max_tokens=8))
    for g1, g3 in zip(one, shared):
        for c in g3:
            assert c.token_ids == g1[0].token_ids
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(g1[0].logprobs), atol=1e-4, rtol=0)


def test_update_weights_copies_in_place(tiny_model, prompts) -> None:
    eng = HFEngine(str(tiny_model), dtype="fp32")
    before = eng.generate(prompts, SamplingParams(temperature=0, max_tokens=6))
    sd = {k: v + 0.5 * torch.randn_like(v) for k, v in eng.model.state_dict().items()}
    eng.update_weights(sd)
    assert torch.equal(eng.model.state_dict()["model.norm.weight"], sd["model.norm.weight"])
    after = eng.generate(prompts, SamplingParams(temperature=0, max_tokens=6))
    assert [g[0].token_ids for g in before] != [g[0].token_ids for g in after]


def test_per_request_seeds_do_not_depend_on_the_batch(tiny_model, prompts) -> None:
    """Each prompt samples from its own seeded stream: the same tokens alone or next to others,
    in any order (what an exact resume and a rank-independent draw rely on)."""
    eng = HFEngine(str(tiny_model), dtype="fp32", seed=0, batch_size=8)
    p = SamplingParams(n=2, temperature=1.0, max_tokens=10)
    together = eng.generate(prompts, dataclasses.replace(p, seeds=(11, 22, 33)))
    alone = [eng.generate([pr], dataclasses.replace(p, seeds=(s,)))[0] for pr, s in zip(prompts, (11, 22, 33))]
    reordered = eng.generate(prompts[::-1], dataclasses.replace(p, seeds=(33, 22, 11)))[::-1]
    ids = lambda out: [[c.token_ids for c in g] for g in out]  # noqa: E731
    assert ids(together) == ids(alone) == ids(reordered)
    other = eng.generate(prompts, dataclasses.replace(p, seeds=(12, 22, 33)))
    assert ids(other)[0] != ids(together)[0] and ids(other)[1:] == ids(together)[1:]
