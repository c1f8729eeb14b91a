"""Per-segment attention of the packed forward against the dense N × N masked attention (its
reference), alone and inside the model, and the choice between them."""

from __future__ import annotations

import pytest
import torch

from reasonrl.train.batch import build_batch, pack, response_logits
from reasonrl.train.segments import Spans, dense_attention, segment_attention, segments_pay


def _packed(prompt_lens, response_lens, seed=0):
    """A packed micro-batch: prompts of ``prompt_lens`` tokens, each with rows of ``response_lens[i]``."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for plen, rlens in zip(prompt_lens, response_lens, strict=True):
        p = torch.randint(3, 500, (plen,), generator=g).tolist()
        for rlen in rlens:
            prompts.append(p)
            responses.append(torch.randint(3, 500, (rlen,), generator=g).tolist())
    return pack(build_batch(prompts, responses, pad_id=0))


def test_spans_follow_the_packed_layout() -> None:
    pk = _packed((3, 1), ((1, 0, 2), (2,)))
    assert pk.spans.prompts == ((0, 3, ((3, 1), (4, 2))), (6, 1, ((7, 2),))) and pk.spans.n == 9 == pk.input_ids.numel()
    assert pk.spans.pairs() == 9 + 1 * 4 + 2 * 5 + 1 + 2 * 3
    from reasonrl.train.batch import segment_pairs

    batch = build_batch([[5, 6, 7]] * 3 + [[8]], [[9], [], [10, 11], [12, 13]], pad_id=0)
    assert segment_pairs(batch) == pack(batch).spans.pairs() == 30  # the cost model's count, without packing
    # what each segment sees is what the dense mask lets through
    keep = pk.attention_mask()[0, 0]
    assert keep.sum() == sum(p * (p + 1) // 2 + sum(k * p + k * (k + 1) // 2 for _, k in rows) for _, p, rows in pk.spans.prompts)


@pytest.mark.parametrize("heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("layout", [((9, 3, 14, 1), ((1, 6, 11), (4, 0), (2,), (7, 1, 3))), ((5,), ((0, 0),)), ((30,), ((40, 2, 17, 1),))])
def test_segment_attention_equals_the_dense_masked_attention(heads, layout) -> None:
    """Outputs and the gradients of queries, keys and values, fp64 (rounding aside, the same sums);
    grouped-query heads; empty responses; a prompt whose rows are all empty."""
    pk = _packed(*layout)
    H, Hkv = heads
    g = torch.Generator().manual_seed(1)
    n, d = pk.spans.n, 8
    q, k, v = (torch.randn(1, h, n, d, generator=g, dtype=torch.float64, requires_grad=True) for h in (H, Hkv, Hkv))
    w = torch.randn(1, H, n, d, generator=g, dtype=torch.float64)
    outs = {}
    for name, fn in (("segments", lambda: segment_attention(q, k, v, pk.spans, scale=0.3)),
                     ("dense", lambda: dense_attention(q, k, v, pk.attention_mask(), scale=0.3))):
        q.grad = k.grad = v.grad = None
        out = fn()
        (out * w).sum().backward()
        outs[name] = (out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone())
    for a, b in zip(outs["segments"], outs["dense"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_segments_pay_only_where_they_skip_most_pairs() -> None:
    one_long_group = Spans(((0, 246, tuple((246 + i * 100, 100) for i in range(8))),), 246 + 800)
    assert segments_pay(one_long_group.pairs(), one_long_group.n)  # 8 responses of one prompt: each skips the other 7
    one_row = Spans(((0, 100, ((100, 50),)),), 150)
    assert not segments_pay(one_row.pairs(), one_row.n)  # nothing to skip: the dense causal attention is the same pairs


def _model(kind: str, tiny_model):
    from transformers import AutoModelForCausalLM

    if kind == "critic":
        from reasonrl.models.value import new_value_model

        return new_value_model(tiny_model, seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    if kind == "lora":
        from reasonrl.models.lora import LoraSettings, apply_lora

        model = apply_lora(model, LoraSettings(rank=4), seed=0, base_path=tiny_model)
        for n, p in model.named_parameters():  # B = 0 at init: move it so the adapter's gradients are not trivial
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(len(n)))
    return model


@pytest.mark.parametrize("kind", ["policy", "lora", "critic"])
def test_the_packed_forward_attends_per_segment_where_it_pays(kind, tiny_model, monkeypatch) -> None:
    """Inside the model (a policy, a LoRA policy, a value model): the packed forward's outputs and
    gradients with per-segment attention equal the dense attention's, the segments were used in
    every layer, and the model attends with sdpa again afterwards."""
    from reasonrl.algos import logprobs_from_logits
    from reasonrl.train import segments
    from reasonrl.train.batch import response_values

    model = _model(kind, tiny_model)
    config = model.config
    g = torch.Generator().manual_seed(3)
    prompts, responses = [], []
    for plen, rlens in ((12, (20, 3, 9, 14)), (5, (11, 0, 6))):
        p = torch.randint(3, 500, (plen,), generator=g).tolist()
        for rlen in rlens:
            prompts.append(p)
            responses.append(torch.randint(3, 500, (rlen,), generator=g).tolist())
    batch = build_batch(prompts, responses, pad_id=0)
    calls = []
    fn = segments.segment_attention_fn

    def counting(*args, **kwargs):
        calls.append(kwargs.get(segments.KWARG) is not None)
        return fn(*args, **kwargs)

    monkeypatch.setattr(segments, "segment_attention_fn", counting)

    def run(below: float):
        monkeypatch.setattr(segments, "SEGMENTS_BELOW", below)
        model.zero_grad(set_to_none=True)
        if kind == "critic":
            out = response_values(model, batch, mode="packed") * batch.valid
            (out * out).sum().backward()
        else:
            out = logprobs_from_logits(response_logits(model, batch, mode="packed"), batch.response_ids) * batch.valid
            out.sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    dense_out, dense_g = run(-1.0)
    assert calls == [] and config._attn_implementation == "sdpa"
    seg_out, seg_g = run(1.0)
    assert calls == [True] * config.num_hidden_layers and config._attn_implementation == "sdpa"
    torch.testing.assert_close(seg_out, dense_out, atol=1e-5, rtol=1e-5)
    assert dense_g.keys() == seg_g.keys() and dense_g
    for n in dense_g:
        scale = float(dense_g[n].abs().max()) + 1e-12
        torch.testing.assert_close(seg_g[n], dense_g[n], atol=1e-5 * scale, rtol=1e-4, msg=n)
