"""reasonrl.models.lora: the adapter, its merged weights (peft's merge, bit for bit, never in place),
the adapter directory round trip, the reference with the adapter off, and the target checks."""

from __future__ import annotations

import pytest
import torch

from reasonrl.errors import ReasonRLError
from reasonrl.models import lora as L
from reasonrl.models.loading import load_causal_lm

SETTINGS = L.LoraSettings(rank=4, alpha=8.0)


def _trained(path, settings=SETTINGS, seed=0):
    """A LoRA policy whose adapter is not at its start (B = 0 would merge to the base exactly)."""
    model = L.apply_lora(load_causal_lm(path), settings, seed=seed, base_path=path)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return model


def test_only_the_adapter_trains_and_the_init_is_seeded_without_touching_the_global_rng(tiny_model):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = L.apply_lora(load_causal_lm(tiny_model), SETTINGS, seed=7, base_path=tiny_model)
    assert torch.equal(torch.get_rng_state(), before)
    b = L.apply_lora(load_causal_lm(tiny_model), SETTINGS, seed=7, base_path=tiny_model)
    c = L.apply_lora(load_causal_lm(tiny_model), SETTINGS, seed=8, base_path=tiny_model)
    trained = [n for n, p in a.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert len(trained) == 2 * 7 * a.config.num_hidden_layers  # every projection of every block, never lm_head
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if "lora_A" in k)


def test_merged_weights_are_peft_merge_bit_for_bit_and_leave_the_base_alone(tiny_model):
    import copy

    model = _trained(tiny_model)
    sd = model.state_dict()
    base_before = {k: v.clone() for k, v in sd.items() if "base_layer" in k}
    merged = L.MergedWeights(sd, L.lora_scaling(model))
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(want)
    assert all(torch.equal(merged[k], want[k]) for k in want)
    assert any(not torch.equal(merged[k], sd[k.replace(".weight", ".base_layer.weight").replace("model.", "base_model.model.model.", 1)])
               for k in merged if "q_proj" in k)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in base_before.items())  # out of place: W never drifts
    ids = torch.randint(0, 500, (2, 9))
    plain = load_causal_lm(tiny_model)
    plain.load_state_dict(dict(merged))
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_the_engine_gets_every_linear_layer_of_the_blocks_even_when_one_is_targeted(tiny_model):
    """vLLM reloads fused layers (qkv, gate-up) whole: k and v go with a q-only adapter."""
    model = _trained(tiny_model, L.LoraSettings(rank=2, alpha=2.0, targets=("q_proj",)))
    w = L.engine_weights(model, model.state_dict())
    assert w.partial
    layers = model.config.num_hidden_layers
    assert len(w) == 7 * layers and all(k.endswith(".weight") and "layers." in k for k in w)
    assert "lm_head.weight" not in w and "model.embed_tokens.weight" not in w
    full = load_causal_lm(tiny_model)
    assert L.engine_weights(full, full.state_dict()) is not None and not hasattr(L.engine_weights(full, full.state_dict()), "partial")


def test_adapter_round_trip_and_the_merged_directory(tiny_model, tmp_path):
    model = _trained(tiny_model)
    L.save_merged(model, model.state_dict(), tmp_path / "policy")
    assert (tmp_path / "policy" / "config.json").is_file() and (tmp_path / "policy" / "adapter" / L.ADAPTER_CONFIG).is_file()
    assert L.adapter_base(tmp_path / "policy" / "adapter") == tiny_model.resolve()
    again = L.apply_lora(load_causal_lm(tiny_model), SETTINGS, seed=99, base_path=tiny_model)
    L.load_adapter_weights(again, tmp_path / "policy" / "adapter")
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
    # the adapter directory alone gives the merged directory's weights, bit for bit
    merged = load_causal_lm(tmp_path / "policy").state_dict()
    from_adapter = L.adapter_merged_weights(tmp_path / "policy" / "adapter", tiny_model)
    assert all(torch.equal(from_adapter[k], merged[k]) for k in merged)
    L.merge_checkpoint(tiny_model, tmp_path / "policy" / "adapter", tmp_path / "final")
    final = load_causal_lm(tmp_path / "final").state_dict()
    assert all(torch.equal(final[k], merged[k]) for k in merged)


def test_a_full_checkpoint_is_no_adapter(tiny_model):
    model = L.apply_lora(load_causal_lm(tiny_model), SETTINGS, seed=0, base_path=tiny_model)
    with pytest.raises(ReasonRLError, match="not a LoRA checkpoint"):
        L.load_adapter_weights(model, tiny_model)


def test_the_reference_is_the_base_model_exactly(tiny_model):
    model = _trained(tiny_model)
    model.train()
    ref = L.reference_model(model)
    assert list(ref.parameters()) == []  # (no second copy of the weights)
    ids = torch.randint(0, 500, (2, 9))
    with torch.no_grad():
        want = load_causal_lm(tiny_model).eval()(input_ids=ids).logits
        got = ref(input_ids=ids).logits
        assert torch.equal(got, want)
        assert not torch.equal(model(input_ids=ids).logits, want)  # the adapter is back on after the call
    assert model.training


def test_target_modules(tiny_model):
    model = load_causal_lm(tiny_model)
    assert L.resolve_targets(model, ("q_proj", "down_proj")) == [f"model.layers.{i}.{m}" for i in range(2) for m in ("self_attn.q_proj", "mlp.down_proj")]
    with pytest.raises(ReasonRLError, match="'qproj' matches no linear layer.*q_proj"):
        L.resolve_targets(model, ("q_proj", "qproj"))
    with pytest.raises(ReasonRLError, match="'lm_head' matches no linear layer"):
        L.resolve_targets(model, ("lm_head",))
    with pytest.raises(ReasonRLError, match="matches no linear layer"):  # on the meta device, from config.json alone
        L.check_targets(tiny_model, L.LoraSettings(rank=2, targets=("attn",)))
    L.check_targets(tiny_model, L.LoraSettings(rank=2, targets=("v_proj",)))


def test_a_lora_critic_trains_its_value_head_in_full(tiny_model):
    from reasonrl.models.value import new_value_model

    critic = L.apply_lora(new_value_model(tiny_model), SETTINGS, seed=0, base_path=tiny_model, critic=True)
    trained = [n for n, p in critic.named_parameters() if p.requires_grad]
    assert any("score.modules_to_save" in n for n in trained) and not any("score.original_module" in n for n in trained)
    merged = dict(L.MergedWeights(critic.state_dict(), L.lora_scaling(critic)))
    assert "score.weight" in merged and "score.bias" in merged
    with pytest.raises(ReasonRLError, match="needs a value head"):
        L.value_head(load_causal_lm(tiny_model))


def test_adapter_directories(tiny_model, tmp_path):
    model = _trained(tiny_model)
    L.save_adapter(model, None, tmp_path / "a")
    assert L.is_adapter_dir(tmp_path / "a") and not L.is_adapter_dir(tiny_model)
    cfg = tmp_path / "a" / L.ADAPTER_CONFIG
    import json

    c = json.loads(cfg.read_text())
    c["base_model_name_or_path"] = str(tmp_path / "gone")
    cfg.write_text(json.dumps(c))
    with pytest.raises(ReasonRLError, match=f"names the base model {tmp_path / 'gone'}, which is not a model directory"):
        L.adapter_base(tmp_path / "a")
