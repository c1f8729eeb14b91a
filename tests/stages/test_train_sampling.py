"""`reasonrl train` off the demo path: temperature / top-p / top-k reach the trainer, the
rollout/trainer gap is logged every step, TIS runs, and a short dynamic-sampling batch is handled
as --on-short-batch says."""

from __future__ import annotations

import json

import pytest

from clihelp import assert_user_error, run_cli

pytestmark = pytest.mark.slow

SMALL = ["--dtype", "fp32", "--group-size", "4", "--max-response-len", "12", "--seed", "0", "--prompts-per-step", "2",
         "--mini-batch-size", "8", "--micro-batch-size", "4", "--overlong-cache-len", "4", "--steps", "2"]



def _lines(out) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]


# LoRA: a large LR and an entropy bonus (a gradient whatever the rewards), so that step 1 surely moves
# the adapter and step 2 samples from the merged weights the engine got; q_proj alone: the engine gets
# the blocks' other linear layers too (vLLM reloads a fused qkv whole).
LORA = {"": [], "lora": ["--lora-rank", "4", "--lr", "3e-2", "--entropy-coef", "0.05"],
        "lora-q": ["--lora-rank", "2", "--lora-target-modules", "q_proj", "--lr", "3e-2", "--entropy-coef", "0.05"]}


@pytest.mark.parametrize("lora", list(LORA))
@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_mismatch_metrics_off_the_default_sampling(prepared, format_model, tmp_path, engine, lora):
    """The sampler/trainer log-prob gap in fp32 stays ~0 after updates: full weights, and LoRA's merged weights."""
    if engine == "vllm":
        pytest.importorskip("vllm")
    out = tmp_path / engine
    r = run_cli("train", "--algo", "grpo", "--model", format_model, "--data", prepared, "--out", out, "--engine", engine,
                "--temperature", "0.6", "--top-p", "0.8", "--top-k", "20", *SMALL, *LORA[lora])
    assert r.exit_code == 0, r.output
    lines = _lines(out)
    for m in lines:
        assert {"rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/mismatch_kl"} <= set(m)
        assert m["rollout/logprob_diff_max"] <= (1e-5 if engine == "hf" else 1e-4), m["rollout/logprob_diff_max"]
    if lora:
        assert lines[0]["actor/grad_norm"] > 0 and lines[0]["actor/entropy_loss"] != 0  # step 2 sampled an updated adapter


def test_tis_cap_runs_and_logs_its_weights(prepared, format_model, tmp_path):
    out = tmp_path / "tis"
    r = run_cli("train", "--algo", "dapo", "--model", format_model, "--data", prepared, "--out", out, "--engine", "hf",
                "--tis-cap", "2", "--tis-level", "sequence", "--max-gen-rounds", "2", *SMALL)
    assert r.exit_code == 0, r.output
    trained = [m for m in _lines(out) if "actor/pg_loss" in m]
    assert trained and all(m["actor/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4) for m in trained)  # the hf engine: no gap
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["resolved_algo"]["tis_cap"] == 2.0 and cfg["resolved_algo"]["tis_level"] == "sequence"


def test_training_at_temperature_zero_is_an_error(prepared, tiny_model, tmp_path):
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", tmp_path / "t0", "--temperature", "0")
    assert_user_error(r, "temperature must be > 0 to train")


@pytest.mark.parametrize("mode", ["train", "skip", "error"])
def test_on_short_batch(prepared, tiny_model, tmp_path, mode):
    """The random tiny model answers almost nothing right: groups are all wrong, dynamic sampling
    keeps none in its one round, and the step says so."""
    out = tmp_path / mode
    r = run_cli("train", "--algo", "dapo", "--model", tiny_model, "--data", prepared, "--out", out, "--engine", "hf",
                "--max-gen-rounds", "1", "--on-short-batch", mode, *SMALL)
    if mode == "error":
        assert_user_error(r, "dynamic sampling kept", "--on-short-batch")
        return
    assert r.exit_code == 0, r.output
    assert "dynamic sampling kept" in r.output
    lines = _lines(out)
    assert all(m["rollout/short_batch"] == 1 for m in lines)
