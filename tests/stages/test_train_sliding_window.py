"""`reasonrl train` on a sliding-window model (a tiny Mistral whose window, 4 tokens, is shorter than
its prompts and responses): the trainer scores the function the engine samples in every forward
mode, so the step-1 rollout/trainer gap is fp32 rounding (#40: the packed forward ignored the
window, 0.098 mean there); a model whose attention the packed forward cannot reproduce is refused
for `--forward-mode packed` in one line."""

from __future__ import annotations

import json
import shutil

import pytest

from clihelp import assert_user_error, run_cli

pytestmark = pytest.mark.slow

ARGS = ["--dtype", "fp32", "--algo", "grpo", "--steps", "1", "--group-size", "4", "--max-response-len", "16", "--seed", "0",
        "--prompts-per-step", "2", "--mini-batch-size", "8", "--micro-batch-size", "4"]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    from reasonrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("mistral") / "model", sliding_window=4)


@pytest.mark.parametrize("engine,mode", [("hf", "packed"), ("hf", "auto"), ("hf", "plain"),
                                         pytest.param("vllm", "packed", marks=pytest.mark.vllm)])
def test_a_sliding_window_model_trains_on_the_engine_s_function(engine, mode, prepared, mistral, tmp_path):
    """vLLM's window is transformers' too (its CPU attention: 0.106 packed before the mend)."""
    if engine == "vllm":
        pytest.importorskip("vllm")
    out = tmp_path / mode
    r = run_cli("train", "--model", mistral, "--data", prepared, "--out", out, *ARGS, "--engine", engine, "--forward-mode", mode)
    assert r.exit_code == 0, r.output
    (m,) = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]
    assert m["rollout/response_length_mean"] > 4  # (responses longer than the window)
    assert m["rollout/logprob_diff_mean"] < 1e-5, m["rollout/logprob_diff_mean"]


def test_packed_refuses_a_model_it_cannot_reproduce(prepared, tiny_model, tmp_path):
    """A Llama-4 text model attends in chunks: `--forward-mode packed` is one line naming the fix."""
    import torch
    from transformers import AutoTokenizer, Llama4ForCausalLM, Llama4TextConfig

    model = tmp_path / "llama4"
    shutil.copytree(tiny_model, model)
    tok = AutoTokenizer.from_pretrained(model)
    torch.manual_seed(0)
    config = Llama4TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, intermediate_size_mlp=128, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=2, head_dim=32, num_local_experts=2, attention_chunk_size=4,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None, max_position_embeddings=1024)
    for f in ("config.json", "model.safetensors"):
        (model / f).unlink()
    Llama4ForCausalLM(config).save_pretrained(model)
    r = run_cli("train", "--model", model, "--data", prepared, "--out", tmp_path / "run", *ARGS, "--engine", "hf", "--forward-mode", "packed")
    assert_user_error(r, "--forward-mode packed cannot reproduce", "chunks", "--forward-mode auto")
