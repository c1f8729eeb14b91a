"""`reasonrl train --lora-rank R` end to end on the tiny model: the bad inputs (one line, nothing
written), what a LoRA run writes (checkpoints with the adapter and its optimizer state only, policy/
merged with policy/adapter/), resuming with other LoRA settings, and `reasonrl eval` on the merged
directory, the adapter in it, and a bare adapter directory."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from clihelp import assert_user_error, run_cli

pytestmark = pytest.mark.slow

SMALL = ["--dtype", "fp32", "--group-size", "4", "--max-response-len", "12", "--seed", "0", "--prompts-per-step", "2",
         "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "4", "--report-to", "none"]
LORA = ["--lora-rank", "4", "--lr", "1e-2"]
PV = ["--dtype", "fp32", "--group-size", "4", "--max-response-len", "12", "--seed", "0", "--prompts-per-step", "2",
      "--mini-batch-size", "8", "--micro-batch-size", "4", "--report-to", "none"]


@pytest.mark.parametrize("args,needles", [
    (["--lora-rank", "-1"], ["lora_rank must be >= 1 for LoRA, or 0"]),
    (["--lora-alpha", "16"], ["--lora-alpha set but --lora-rank is 0", "--lora-rank R"]),
    (["--lora-target-modules", "q_proj"], ["--lora-target-modules set but --lora-rank is 0"]),
    (["--lora-rank", "4", "--lora-alpha", "0"], ["lora_alpha must be finite and > 0"]),
    (["--lora-rank", "4", "--lora-target-modules", "q_proj,attn"], ["'attn' matches no linear layer", "q_proj", "all-linear"]),
    (["--lora-rank", "4", "--lora-target-modules", "lm_head"], ["'lm_head' matches no linear layer", "never LoRA targets"]),
])
def test_bad_lora_options_are_one_line_and_write_nothing(prepared, tiny_model, tmp_path, args, needles):
    out = tmp_path / "run"
    assert_user_error(run_cli("train", "--model", tiny_model, "--data", prepared, "--out", out, "--engine", "hf", *SMALL, *args), *needles)
    assert not out.exists()


@pytest.fixture(scope="module")
def lora_run(prepared, format_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "run"
    r = run_cli("train", "--algo", "grpo", "--model", format_model, "--data", prepared, "--out", out, "--engine", "hf", "--steps", "2",
                "--save-every", "1", *SMALL, *LORA)
    assert r.exit_code == 0, r.output
    assert "LoRA r=4 α=32 on 14 layers" in r.output
    return out


def test_a_lora_run_checkpoints_the_adapter_and_writes_a_merged_policy(lora_run, format_model):
    from safetensors.torch import load_file

    from reasonrl.models.loading import load_causal_lm
    from reasonrl.models.lora import ADAPTER_WEIGHTS, MergedWeights, apply_lora, load_adapter_weights, LoraSettings

    ckpt = lora_run / "checkpoints" / "step_2"
    assert sorted(p.name for p in (ckpt / "policy").glob("*.safetensors")) == [ADAPTER_WEIGHTS]  # no frozen base
    adapter = load_file(str(ckpt / "policy" / ADAPTER_WEIGHTS))
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    n_adapter = sum(v.numel() for v in adapter.values())
    base = load_causal_lm(format_model)
    assert n_adapter < sum(p.numel() for p in base.parameters()) / 5
    optim = torch.load(ckpt / "policy_state" / "optim.pt", weights_only=True)["optimizer"]
    assert sum(s["exp_avg"].numel() for s in optim["state"].values()) == n_adapter  # AdamW holds the adapter's moments only
    cfg = json.loads((lora_run / "config.json").read_text())
    assert (cfg["lora_rank"], cfg["lora_alpha"], cfg["lora_target_modules"]) == (4, None, ["all-linear"])
    # policy/ is a plain HF directory with the merged weights; policy/adapter/ is peft's
    assert "policy/adapter/" in json.loads((lora_run / "manifest.json").read_text())["outputs"]
    merged = load_causal_lm(lora_run / "policy").state_dict()
    peft_model = apply_lora(load_causal_lm(format_model), LoraSettings(4), seed=0, base_path=format_model)
    load_adapter_weights(peft_model, lora_run / "policy" / "adapter")
    want = MergedWeights(peft_model.state_dict(), 32.0 / 4)
    assert set(want) == set(merged) and all(torch.equal(merged[k], want[k]) for k in merged)
    assert any(not torch.equal(merged[k], v) for k, v in base.state_dict().items())  # it learned something


@pytest.mark.parametrize("args,needles", [
    ([], ["--resume without --lora-rank", "rank-4 LoRA adapter", "resume with --lora-rank 4"]),
    (["--lora-rank", "8"], ["--resume with --lora-rank 8", "rank-4", "resume with --lora-rank 4"]),
    (["--lora-rank", "4", "--lora-target-modules", "q_proj"], ["--resume with --lora-target-modules", "resume with the run's"]),
])
def test_resuming_a_lora_run_with_other_lora_settings_is_one_line(lora_run, prepared, format_model, tmp_path, args, needles):
    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    (run / "manifest.json").unlink()  # (an unfinished run)
    r = run_cli("train", "--algo", "grpo", "--model", format_model, "--data", prepared, "--out", run, "--engine", "hf", "--steps", "3",
                "--save-every", "1", "--resume", *SMALL, "--lr", "1e-2", *args)
    assert_user_error(r, *needles)


def test_resuming_a_full_run_with_lora_is_one_line(prepared, tiny_model, tmp_path):
    run = tmp_path / "full"
    r = run_cli("train", "--algo", "grpo", "--model", tiny_model, "--data", prepared, "--out", run, "--engine", "hf", "--steps", "1", *SMALL)
    assert r.exit_code == 0, r.output
    (run / "manifest.json").unlink()
    r = run_cli("train", "--algo", "grpo", "--model", tiny_model, "--data", prepared, "--out", run, "--engine", "hf", "--steps", "2", "--resume", *SMALL, *LORA)
    assert_user_error(r, "--resume with --lora-rank 4", "full fine-tuning", "without --lora-rank")


def _eval(model, prepared, out):
    r = run_cli("eval", "file", "--dataset", prepared, "--model", model, "--engine", "hf", "--n", "2", "--max-response-len", "12",
                "--out", out, "--report-to", "none")
    assert r.exit_code == 0, r.output
    return json.loads((out / "results.json").read_text())


def test_eval_takes_the_merged_policy_its_adapter_or_a_bare_adapter(lora_run, prepared, format_model, tmp_path):
    merged = _eval(lora_run / "policy", prepared, tmp_path / "merged")
    adapter = _eval(lora_run / "policy" / "adapter", prepared, tmp_path / "adapter")
    bare = tmp_path / "bare"
    shutil.copytree(lora_run / "checkpoints" / "step_2" / "policy", bare)
    alone = _eval(bare, prepared, tmp_path / "alone")
    assert adapter["base_model"] == alone["base_model"] == str(format_model.resolve()) and "base_model" not in merged
    samples = [(tmp_path / d / "samples.jsonl").read_text() for d in ("merged", "adapter", "alone")]
    assert samples[0] == samples[1] == samples[2]  # the same weights, bit for bit: the same tokens


def test_eval_of_an_adapter_whose_base_is_gone_is_one_line(lora_run, prepared, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(lora_run / "policy" / "adapter", bare)
    cfg = json.loads((bare / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "moved-away")
    (bare / "adapter_config.json").write_text(json.dumps(cfg))
    r = run_cli("eval", "file", "--dataset", prepared, "--model", bare, "--engine", "hf", "--n", "1", "--out", tmp_path / "ev")
    assert_user_error(r, f"names the base model {tmp_path / 'moved-away'}", "base_model_name_or_path")


def test_pretrain_value_with_a_lora_critic(prepared, format_model, tmp_path):
    """LoRA on the critic's backbone, its value head trained in full: critic/ is a merged value model
    (what `train --critic` loads), critic/adapter/ the adapter with the head."""
    from safetensors.torch import load_file

    from reasonrl.models.lora import ADAPTER_WEIGHTS
    from reasonrl.models.value import load_value_model, new_value_model

    out = tmp_path / "critic"
    r = run_cli("pretrain-value", "--model", format_model, "--data", prepared, "--out", out, "--engine", "hf", "--steps", "2",
                "--eval-prompts", "2", "--critic-lr", "1e-2", *PV, "--lora-rank", "4")
    assert r.exit_code == 0, r.output
    assert "LoRA r=4 α=32 on 14 layers" in r.output and "the value head in full" in r.output
    adapter = load_file(str(out / "critic" / "adapter" / ADAPTER_WEIGHTS))
    assert any("score" in k for k in adapter) and any(".lora_A." in k for k in adapter)
    trained, init = load_value_model(out / "critic").state_dict(), new_value_model(format_model, seed=0).state_dict()
    assert set(trained) == set(init)
    assert not torch.equal(trained["score.weight"], init["score.weight"])  # the head trained in full
    assert any(not torch.equal(trained[k], init[k]) for k in init if "q_proj" in k)  # the backbone through the adapter
    assert torch.equal(trained["model.embed_tokens.weight"], init["model.embed_tokens.weight"])  # frozen
    assert "critic/adapter/" in json.loads((out / "manifest.json").read_text())["outputs"]
    bad = run_cli("pretrain-value", "--model", format_model, "--data", prepared, "--out", tmp_path / "bad", "--engine", "hf",
                  "--lora-rank", "4", "--lora-target-modules", "score")
    assert_user_error(bad, "'score' matches no linear layer", "value head are never LoRA targets")
    assert not (tmp_path / "bad").exists()


def test_the_kl_reference_of_a_lora_run_is_its_base(prepared, format_model, tmp_path):
    """A KL penalty's reference is the policy with its adapter off: 0 exactly at step 1 (B starts at
    0: policy = base, bit for bit), > 0 once the adapter moved; with gradient checkpointing too."""
    out = tmp_path / "kl"
    r = run_cli("train", "--algo", "grpo", "--model", format_model, "--data", prepared, "--out", out, "--engine", "hf", "--steps", "2",
                *SMALL, "--lora-rank", "4", "--lr", "3e-2", "--entropy-coef", "0.05", "--kl-coef", "0.1", "--gradient-checkpointing")
    assert r.exit_code == 0, r.output
    m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    assert m[0]["actor/kl_ref"] == 0.0 and m[0]["actor/grad_norm"] > 0
    assert m[1]["actor/kl_ref"] > 0
