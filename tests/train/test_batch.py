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
    for mode in ("plain", "shared"):
        policy.zero_grad()
        logits = response_logits(policy, batch, mode=mode)
        assert logits.shape == (*batch.response_ids.shape, policy.config.vocab_size)
        logp = logprobs_from_logits(logits, batch.response_ids)
        (logp * batch.valid).sum().backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        res[mode] = (logp * batch.valid, grads)
    torch.testing.assert_close(res["shared"][0], res["plain"][0], atol=1e-5, rtol=1e-5)
    assert res["shared"][1].keys() == res["plain"][1].keys()
    for n in res["plain"][1]:
        torch.testing.assert_close(res["shared"][1][n], res["plain"][1][n], atol=1e-5, rtol=1e-4, msg=n)


def test_shared_prompt_values_equal_the_plain_forward(critic) -> None:
    prompts, responses = _groups(1)
    batch = build_batch(prompts, responses, pad_id=0)
    plain = response_values(critic, batch, mode="plain")
    shared = response_values(critic, batch, mode="shared")
    assert shared.shape == batch.response_ids.shape
    torch.testing.assert_close(shared * batch.valid, plain * batch.valid, atol=1e-5, rtol=1e-5)


def test_one_token_responses(policy) -> None:
    batch = build_batch([[5, 6, 7]] * 3, [[9], [10], [11]], pad_id=0)
    torch.testing.assert_close(response_logits(policy, batch), response_logits(policy, batch, mode="plain"), atol=1e-5, rtol=1e-5)


def test_one_token_prompts_and_all_distinct_prompts(policy) -> None:
    """One-token prompts (pass 1 gets a masked pad column) and a batch where no prompt repeats."""
    for prompts, responses in (([[5]] * 3, [[9, 4], [10], [11, 12, 13]]), ([[5, 6], [7, 8, 9], [4]], [[9, 4], [10], [11, 12]])):
        batch = build_batch(prompts, responses, pad_id=0)
        want = response_logits(policy, batch, mode="plain") * batch.valid[..., None]
        torch.testing.assert_close(response_logits(policy, batch) * batch.valid[..., None], want, atol=1e-5, rtol=1e-5)


# The packed forward: one padding-free sequence per micro-batch (each prompt once, then its rows'
# responses) with a shared-prefix attention mask, against the shared and plain forwards.

def _varied(seed: int = 2) -> tuple[list[list[int]], list[list[int]]]:
    """4 prompts of lengths 9, 3, 14, 1 (left padding) × rows of lengths 1 … 11, one empty."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for plen, rlens in ((9, (1, 6, 11)), (3, (4, 0)), (14, (2,)), (1, (7, 1, 3))):
        p = torch.randint(3, 500, (plen,), generator=g).tolist()
        for rlen in rlens:
            prompts.append(p)
            responses.append(torch.randint(3, 500, (rlen,), generator=g).tolist())
    return prompts, responses


def _outputs_and_grads(model, batch, mode, *, values: bool = False):
    model.zero_grad(set_to_none=True)
    if values:
        out = response_values(model, batch, mode=mode) * batch.valid
        (out * out).sum().backward()
    else:
        logits = response_logits(model, batch, mode=mode)
        assert logits.shape == (*batch.response_ids.shape, model.config.vocab_size)
        out = logprobs_from_logits(logits, batch.response_ids) * batch.valid
        out.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def _assert_same(model, batch, *, values: bool = False, modes=("plain", "shared")) -> None:
    got, got_g = _outputs_and_grads(model, batch, "packed", values=values)
    for mode in modes:
        want, want_g = _outputs_and_grads(model, batch, mode, values=values)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=mode)
        assert got_g.keys() == want_g.keys() and got_g
        for n in want_g:
            scale = float(want_g[n].abs().max()) + 1e-12
            torch.testing.assert_close(got_g[n], want_g[n], atol=1e-5 * scale, rtol=1e-4, msg=f"{mode} {n}")


def test_pack_layout_each_prompt_once_then_its_rows_responses() -> None:
    from reasonrl.train.batch import pack

    batch = build_batch([[5, 6, 7], [8], [5, 6, 7]], [[9], [10, 11], [12, 13]], pad_id=0)
    pk = pack(batch)
    assert pk.input_ids.tolist() == [5, 6, 7, 9, 12, 13, 8, 10, 11]
    assert pk.position_ids.tolist() == [0, 1, 2, 3, 3, 4, 0, 1, 2]
    assert pk.group.tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1] and pk.row.tolist() == [-1, -1, -1, 0, 2, 2, -1, 1, 1]
    assert pk.score.tolist() == [2, 6, 7, 2, 4] and pk.target.tolist() == [0, 2, 3, 4, 5]
    m = pk.attention_mask()[0, 0].int()
    assert m[4].tolist() == [1, 1, 1, 0, 1, 0, 0, 0, 0]  # row 2's first token: its prompt and itself, not row 0
    assert m[8].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("rows", [slice(None), [8, 0, 5, 2, 6], [3], [4]])
def test_packed_logits_and_gradients_equal_the_shared_and_plain_forwards(policy, rows) -> None:
    """Varied lengths (1-token and empty responses), four prompt lengths, a single row, and a
    row whose response is empty alone."""
    prompts, responses = _varied()
    full = build_batch(prompts, responses, pad_id=0)
    _assert_same(policy, full.select(range(len(prompts))[rows] if isinstance(rows, slice) else rows))


def test_packed_skips_padding_copies(policy) -> None:
    """A row with no valid token (a padding copy) gets zeros and no gradient."""
    prompts, responses = _varied()
    batch = build_batch(prompts, responses, pad_id=0)
    batch.valid[1] = 0.0
    _assert_same(policy, batch, modes=("shared",))
    assert response_logits(policy, batch, mode="packed")[1].abs().max() == 0


def test_packed_values_equal_the_shared_and_plain_forwards(critic) -> None:
    prompts, responses = _varied(3)
    _assert_same(critic, build_batch(prompts, responses, pad_id=0), values=True)


def test_packed_under_lora(tiny_model) -> None:
    from transformers import AutoModelForCausalLM

    from reasonrl.models.lora import LoraSettings, apply_lora

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    model = apply_lora(base, LoraSettings(rank=4), seed=0, base_path=tiny_model)
    for n, p in model.named_parameters():  # B = 0 at init: move it so the adapter's gradients are not trivial
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(len(n)))
    prompts, responses = _varied(4)
    _assert_same(model, build_batch(prompts, responses, pad_id=0))


def test_packed_under_gradient_checkpointing(tiny_model) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    prompts, responses = _varied(5)
    _assert_same(model, build_batch(prompts, responses, pad_id=0), modes=("plain",))


def test_cheapest_mode_follows_the_padding() -> None:
    """Packed where padding dominates (one long row among short ones, little attention); where
    every row is full length, packed with per-segment attention (each response against its own
    prompt: the shared mode's pairs, without its second call), shared against the dense N × N
    attention over one long packed sequence (gradient checkpointing: plain or packed)."""
    from reasonrl.train.batch import PACKED_MAX_TOKENS, ForwardCost, cheapest, cheapest_mode, forward_costs

    gemm_heavy = ForwardCost(token=1e9, pair=1e3, head=1e7)
    attn_heavy = ForwardCost(token=1e6, pair=1e5, head=1e5)
    tail = build_batch([[5] * 50] * 8, [[7] * 500] + [[7] * 10] * 7, pad_id=0)
    full = build_batch([[5] * 50] * 8, [[7] * 500] * 8, pad_id=0)
    assert cheapest_mode(tail, gemm_heavy) == "packed"
    assert cheapest_mode(full, attn_heavy) == "packed"
    dense = forward_costs(full, attn_heavy, per_segment=False)
    assert dense["shared"] < dense["packed"] and forward_costs(full, attn_heavy)["packed"] < dense["shared"]
    assert cheapest_mode(full, attn_heavy, shared=False) in ("plain", "packed")
    c = forward_costs(tail, gemm_heavy)
    assert c["packed"] < min(c["shared"], c["plain"])
    huge = build_batch([[5] * 50] * 2, [[7] * (PACKED_MAX_TOKENS // 2)] * 2, pad_id=0)  # its N × N mask is too big
    assert forward_costs(huge, gemm_heavy)["packed"] == float("inf") and cheapest_mode(huge, gemm_heavy) == "shared"
    assert cheapest({"plain": 3.0, "shared": 2.0, "packed": 1.0}) == "packed"
    assert cheapest({"plain": 3.0, "shared": 1.0, "packed": 2.0}) == "shared"
    assert cheapest({"plain": 1.5, "shared": 1.0, "packed": 2.0}, shared=False) == "plain"


def test_pass_mode_decides_on_every_rank_s_counts(policy) -> None:
    """``auto`` over a pass: the costs summed over its micro-batches and, through ``total`` (the
    ranks' all-reduce), over every rank's, so ranks whose own counts would pick differently
    agree; plain stands in for shared under gradient checkpointing."""
    from reasonrl.train.batch import PACKED_MAX_TOKENS, ForwardCost, cheapest, forward_costs, pass_mode

    cost = ForwardCost.of(policy.config)
    tail = build_batch([[5] * 8] * 6, [[7] * 40] + [[7] * 2] * 5, pad_id=0)  # padding dominates: packed
    full = build_batch([[5] * 4] * 2, [[7] * (PACKED_MAX_TOKENS // 2)] * 2, pad_id=0)  # too long for packed's dense mask: shared
    assert forward_costs(tail, cost)["packed"] < forward_costs(tail, cost)["shared"]
    assert forward_costs(full, cost)["shared"] < forward_costs(full, cost)["packed"]
    keys = ("plain", "shared", "packed")

    def summed(*batches):
        return torch.tensor([sum(forward_costs(b, cost)[k] for b in batches) for k in keys], dtype=torch.float64)

    assert pass_mode("auto", policy, [tail], causal_lm=True) == "packed"
    assert pass_mode("auto", policy, [full], causal_lm=True) == "shared"
    both = cheapest(dict(zip(keys, summed(tail, full).tolist())))
    assert pass_mode("auto", policy, [tail], causal_lm=True, total=lambda x: x + summed(full)) == both
    assert pass_mode("auto", policy, [full], causal_lm=True, total=lambda x: x + summed(tail)) == both  # the same answer from either rank
    assert pass_mode("auto", policy, [tail, full], causal_lm=True) == both


def test_auto_and_unknown_modes(policy) -> None:
    prompts, responses = _varied()
    batch = build_batch(prompts, responses, pad_id=0)
    want = response_logits(policy, batch, mode="plain") * batch.valid[..., None]
    torch.testing.assert_close(response_logits(policy, batch, mode="auto") * batch.valid[..., None], want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="forward mode"):
        response_logits(policy, batch, mode="fast")


def test_packed_under_bf16_autocast(policy) -> None:
    """The trainer's bf16 autocast: the additive mask takes the attention's dtype; bf16 rounding only."""
    prompts, responses = _varied()
    batch = build_batch(prompts, responses, pad_id=0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = logprobs_from_logits(response_logits(policy, batch, mode="packed").float(), batch.response_ids) * batch.valid
    with torch.no_grad():
        want = logprobs_from_logits(response_logits(policy, batch, mode="plain"), batch.response_ids) * batch.valid
    torch.testing.assert_close(got, want, atol=0.1, rtol=0.05)
