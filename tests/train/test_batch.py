"""Training tensors: the padded layout, and the shared-prompt forward (each distinct prompt once,
its KV cache copied to its rows) against one plain forward over the padded rows."""

from __future__ import annotations

import pytest
import torch

from reasonrl.algos import logprobs_from_logits
from reasonrl.train.batch import build_batch, prompt_groups, response_logits, response_values


def _groups(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """3 prompts of different lengths × 3 samples with responses of different lengths (one empty)."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for plen in (7, 12, 4):
        p = torch.randint(3, 500, (plen,), generator=g).tolist()
        for rlen in (5, 1, 9):
            prompts.append(p)
            responses.append(torch.randint(3, 500, (rlen,), generator=g).tolist())
    responses[4] = []
    return prompts, responses


@pytest.fixture(scope="module")
def policy(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)


@pytest.fixture(scope="module")
def critic(tiny_model):
    from reasonrl.models.value import new_value_model

    return new_value_model(tiny_model, seed=0)


def test_layout_left_padded_prompts_right_padded_responses() -> None:
    b = build_batch([[5, 6, 7], [8]], [[9], [10, 11]], pad_id=0, loss_rows=[True, False])
    assert b.input_ids.tolist() == [[5, 6, 7, 9, 0], [0, 0, 8, 10, 11]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert b.position_ids[1].tolist() == [0, 0, 0, 1, 2]
    assert b.valid.tolist() == [[1, 0], [1, 1]] and b.mask.tolist() == [[1, 0], [0, 0]]


def test_prompt_groups_finds_the_rows_of_each_prompt() -> None:
    prompts, responses = _groups()
    first, inverse = prompt_groups(build_batch(prompts, responses, pad_id=0))
    assert sorted(first.tolist()) == [0, 3, 6]
    assert [first[i].item() for i in inverse.tolist()] == [0, 0, 0, 3, 3, 3, 6, 6, 6]
    assert prompt_groups(build_batch(prompts[::3], responses[::3], pad_id=0)) is None  # all distinct


@pytest.mark.parametrize("rows", [slice(None), [2, 0, 5, 3, 8], [1, 4]])
def test_shared_prompt_logits_and_gradients_equal_the_plain_forward(policy, rows) -> None:
    prompts, responses = _groups()
    full = build_batch(prompts, responses, pad_id=0)
    batch = full.select(range(len(prompts))[rows] if isinstance(rows, slice) else rows)
    res = {}
    for share in (False, True):
        policy.zero_grad()
        logits = response_logits(policy, batch, share_prompts=share)
        assert logits.shape == (*batch.response_ids.shape, policy.config.vocab_size)
        logp = logprobs_from_logits(logits, batch.response_ids)
        (logp * batch.valid).sum().backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        res[share] = (logp * batch.valid, grads)
    torch.testing.assert_close(res[True][0], res[False][0], atol=1e-5, rtol=1e-5)
    assert res[True][1].keys() == res[False][1].keys()
    for n in res[False][1]:
        torch.testing.assert_close(res[True][1][n], res[False][1][n], atol=1e-5, rtol=1e-4, msg=n)


def test_shared_prompt_values_equal_the_plain_forward(critic) -> None:
    prompts, responses = _groups(1)
    batch = build_batch(prompts, responses, pad_id=0)
    plain = response_values(critic, batch, share_prompts=False)
    shared = response_values(critic, batch, share_prompts=True)
    assert shared.shape == batch.response_ids.shape
    torch.testing.assert_close(shared * batch.valid, plain * batch.valid, atol=1e-5, rtol=1e-5)


def test_one_token_responses(policy) -> None:
    batch = build_batch([[5, 6, 7]] * 3, [[9], [10], [11]], pad_id=0)
    torch.testing.assert_close(response_logits(policy, batch), response_logits(policy, batch, share_prompts=False), atol=1e-5, rtol=1e-5)


def test_one_token_prompts_and_all_distinct_prompts(policy) -> None:
    """One-token prompts (pass 1 gets a masked pad column) and a batch where no prompt repeats."""
    for prompts, responses in (([[5]] * 3, [[9, 4], [10], [11, 12, 13]]), ([[5, 6], [7, 8, 9], [4]], [[9, 4], [10], [11, 12]])):
        batch = build_batch(prompts, responses, pad_id=0)
        want = response_logits(policy, batch, share_prompts=False) * batch.valid[..., None]
        torch.testing.assert_close(response_logits(policy, batch) * batch.valid[..., None], want, atol=1e-5, rtol=1e-5)
