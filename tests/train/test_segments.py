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


# Sliding-window models: a window of 4 tokens, shorter than most rows, in tiny random models of the
# families that have one; every forward mode against the model's own forward over each row alone.

WINDOW = 4
_COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
               num_key_value_heads=1, max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=None)


def _sliding_config(family: str):
    """A tiny config of ``family`` whose sliding-window layers have a window of :data:`WINDOW`."""
    import transformers as T

    if family == "mistral":  # every layer windowed (Mistral-7B-v0.1: 4096)
        return T.MistralConfig(sliding_window=WINDOW, head_dim=32, **_COMMON)
    if family == "qwen2":  # use_sliding_window: the layers from max_window_layers on are windowed
        return T.Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2, head_dim=32, **_COMMON)
    if family.startswith("gemma2"):  # alternating local and global layers; logits soft-capped (applied in eager only)
        return T.Gemma2Config(sliding_window=WINDOW, head_dim=32, **_COMMON)
    if family == "gemma3":  # local layers with their own RoPE base, a global one between them
        return T.Gemma3TextConfig(sliding_window=WINDOW, head_dim=32, layer_types=["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"],
                                  **_COMMON)
    if family == "phi3":  # every layer windowed (Phi-3-mini: 2047)
        return T.Phi3Config(sliding_window=WINDOW, **_COMMON)
    raise AssertionError(family)


FAMILIES = ["mistral", "qwen2", "gemma2", "gemma2-eager", "gemma3", "phi3"]


def _sliding_model(family: str, *, critic: bool = False):
    import transformers as T

    config = _sliding_config(family)
    impl = "eager" if family.endswith("-eager") else "sdpa"
    torch.manual_seed(0)
    if critic:
        config.num_labels, config.classifier_dropout = 1, 0.0  # (as reasonrl.models.value makes its critics)
        return T.AutoModelForTokenClassification.from_config(config, attn_implementation=impl, dtype=torch.float64)
    return T.AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=torch.float64)


def _rows(seed: int = 5):
    """Prompts of 6, 3 and 2 tokens, rows of up to 11 response tokens (one empty), most longer than the window."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for plen, rlens in ((6, (9, 2, 7)), (3, (5, 0)), (2, (11,))):
        p = torch.randint(2, 128, (plen,), generator=g).tolist()
        for rlen in rlens:
            prompts.append(p)
            responses.append(torch.randint(2, 128, (rlen,), generator=g).tolist())
    return prompts, responses


def _own(model, prompts, responses, weights, *, critic: bool):
    """The model's own forward, each row alone and unpadded: (B, T) log-probs (values), zero past
    each response, and the gradients of Σ weights · out."""
    B, T = weights.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    model.zero_grad(set_to_none=True)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        if not r:
            continue
        ids = torch.tensor([p + r])
        o = model(input_ids=ids).logits[0, len(p) - 1 : len(p) - 1 + len(r)]
        o = o[:, 0] if critic else torch.log_softmax(o, -1).gather(-1, torch.tensor(r)[:, None])[:, 0]
        (o * weights[b, : len(r)]).sum().backward()
        out[b, : len(r)] = o.detach()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _through(model, batch, mode, weights, *, critic: bool):
    from reasonrl.algos import logprobs_from_logits
    from reasonrl.train.batch import response_values

    model.zero_grad(set_to_none=True)
    if critic:
        out = response_values(model, batch, mode=mode).double() * batch.valid
    else:
        out = logprobs_from_logits(response_logits(model, batch, mode=mode), batch.response_ids) * batch.valid
    (out * weights).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads(got, want, what: str) -> None:
    """The same gradients up to 1e-6 of each tensor's largest. The models are fp64 but their RMSNorm
    computes in fp32, so where a mode sums a gradient in another order (a shared prompt's rows
    together, in shared and packed) it differs by up to ~1e-7 of its scale, a Llama's too; the
    window, ignored, moves the outputs by ~1e-1."""
    assert got.keys() == want.keys() and got
    for n in want:
        torch.testing.assert_close(got[n], want[n], atol=1e-6 * float(want[n].abs().max()), rtol=0, msg=f"{what} {n}")


@pytest.mark.parametrize("family", FAMILIES)
def test_sliding_window_models_every_mode_is_the_model_s_own_function(family, monkeypatch) -> None:
    """Log-probs and gradients (fp64) of every forward mode equal the model's own forward over each
    row alone: plain, shared, packed with the dense masks and per segment, auto; the per-segment
    attention served every layer (each layer's window told by its mask)."""
    from reasonrl.train import segments

    model = _sliding_model(family)
    prompts, responses = _rows()
    batch = build_batch(prompts, responses, pad_id=0)
    assert max(len(p) + len(r) for p, r in zip(prompts, responses)) > 2 * WINDOW
    weights = torch.randn(batch.response_ids.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    want, want_g = _own(model, prompts, responses, weights, critic=False)
    calls = []
    fn = segments.segment_attention_fn

    def counting(*args, **kwargs):
        spans = kwargs.get(segments.KWARG)
        calls.append(spans is not None and spans.window_of(args[4])[0])
        return fn(*args, **kwargs)

    monkeypatch.setattr(segments, "segment_attention_fn", counting)
    modes = (("plain", 0.5), ("shared", 0.5), ("packed", -1.0), ("packed", 2.0), ("auto", 2.0))
    if family.endswith("-eager"):  # (eager attention takes the masks as given, never per segment; padded, its
        modes = (("packed", -1.0),)  # rows whose pad tokens see no key within the window turn NaN: reasonrl loads sdpa)
    for mode, below in modes:
        monkeypatch.setattr(segments, "SEGMENTS_BELOW", below)
        calls.clear()
        got, got_g = _through(model, batch, mode, weights, critic=False)
        torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-7, msg=f"{mode} {below}")
        _assert_grads(got_g, want_g, f"{mode} {below}")
        if mode == "packed" and below > 1 and not family.endswith("-eager"):
            assert calls == [True] * model.config.num_hidden_layers


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_sliding_window_critics_packed_are_the_model_s_own_function(family) -> None:
    """A value model (token classification) of a sliding-window family, packed: its own values and gradients."""
    model = _sliding_model(family, critic=True)
    prompts, responses = _rows(6)
    batch = build_batch(prompts, responses, pad_id=0)
    weights = torch.randn(batch.response_ids.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want, want_g = _own(model, prompts, responses, weights, critic=True)
    for mode in ("packed", "auto"):
        got, got_g = _through(model, batch, mode, weights, critic=True)
        torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-7, msg=mode)
        _assert_grads(got_g, want_g, mode)


@pytest.mark.parametrize("window", [1, 3, 7, 100])
def test_windowed_segment_attention_equals_the_dense_windowed_mask(window) -> None:
    """Per segment with a sliding window against the dense mask made with it (fp64, gradients too)."""
    pk = _packed((9, 3, 14, 1), ((1, 6, 11), (4, 0), (2,), (7, 1, 3)))
    g = torch.Generator().manual_seed(4)
    n, d = pk.spans.n, 8
    q, k, v = (torch.randn(1, h, n, d, generator=g, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2))
    w = torch.randn(1, 4, n, d, generator=g, dtype=torch.float64)
    keep = pk.attention_mask(window)
    assert keep.sum() < pk.attention_mask().sum() or window == 100
    outs = {}
    for name, fn in (("segments", lambda: segment_attention(q, k, v, pk.spans, scale=0.3, window=window)),
                     ("dense", lambda: dense_attention(q, k, v, keep, scale=0.3))):
        q.grad = k.grad = v.grad = None
        out = fn()
        (out * w).sum().backward()
        outs[name] = (out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone())
    for a, b in zip(outs["segments"], outs["dense"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_mask_windows_per_family() -> None:
    """One windowed mask where every layer slides (Mistral, Phi-3) or every layer is the same; a
    mask per layer type where they differ; none where no row reaches the window."""
    from reasonrl.train.batch import mask_windows

    assert mask_windows(_sliding_config("mistral"), 20) == {"": WINDOW} == mask_windows(_sliding_config("phi3"), 20)
    assert mask_windows(_sliding_config("mistral"), WINDOW) == {"": None}  # no row longer than the window: nothing masked
    assert mask_windows(_sliding_config("qwen2"), 20) == {"full_attention": None, "sliding_attention": WINDOW}
    assert mask_windows(_sliding_config("gemma2"), 20) == {"full_attention": None, "sliding_attention": WINDOW}
    import transformers as T

    assert mask_windows(T.Qwen2Config(use_sliding_window=False, sliding_window=WINDOW), 20) == {"": None}  # Qwen2.5's configs
    assert mask_windows(T.LlamaConfig(), 10**6) == {"": None}


def test_packing_refuses_what_its_masks_cannot_reproduce(tiny_model) -> None:
    """A model with chunked attention (Llama-4): auto runs it padded and equals its own forward; an
    explicit packed is a one-line error naming the fix, up front (check_forward_mode) and in the pass."""
    import transformers as T

    from reasonrl.errors import ReasonRLError
    from reasonrl.train.batch import check_forward_mode, pass_mode

    config = T.Llama4TextConfig(vocab_size=128, hidden_size=64, intermediate_size=128, intermediate_size_mlp=128, num_hidden_layers=2,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_local_experts=2, attention_chunk_size=WINDOW,
                                pad_token_id=0, eos_token_id=1, bos_token_id=None, max_position_embeddings=256)
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(config, dtype=torch.float64)
    prompts, responses = _rows()
    batch = build_batch(prompts, responses, pad_id=0)
    tail = build_batch([[5] * 8] * 6, [[7] * 40] + [[7] * 2] * 5, pad_id=0)  # padding dominates: auto packs a model it can
    assert pass_mode("auto", model, [tail], causal_lm=True) == "shared"
    weights = torch.randn(batch.response_ids.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    want, _ = _own(model, prompts, responses, weights, critic=False)
    got, _ = _through(model, batch, "auto", weights, critic=False)
    torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-7)
    with pytest.raises(ReasonRLError, match="chunks.*--forward-mode auto"):
        check_forward_mode("packed", None, model)
    check_forward_mode("auto", model)
    with pytest.raises(ReasonRLError, match="chunks"):
        response_logits(model, batch, mode="packed")
    from transformers import AutoModelForCausalLM

    llama = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    check_forward_mode("packed", llama)
    assert pass_mode("auto", llama, [tail], causal_lm=True) == "packed"


def test_sliding_window_packed_under_gradient_checkpointing() -> None:
    """Checkpointed layers attend with the dense masks (a mask per layer type here, Qwen2's): the model's own numbers."""
    model = _sliding_model("qwen2")
    prompts, responses = _rows()
    batch = build_batch(prompts, responses, pad_id=0)
    weights = torch.randn(batch.response_ids.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    want, want_g = _own(model, prompts, responses, weights, critic=False)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for mode in ("packed", "auto"):
        got, got_g = _through(model, batch, mode, weights, critic=False)
        torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-7, msg=mode)
        _assert_grads(got_g, want_g, mode)
