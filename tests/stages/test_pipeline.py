"""The pipeline end to end with the tiny model: prepare-data → pretrain-value → train (every --algo row, and a
--policy-loss override) → eval."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from clihelp import run_cli

pytestmark = pytest.mark.slow

SMALL = ["--engine", "hf", "--dtype", "fp32", "--group-size", "4", "--max-response-len", "12", "--seed", "0"]



def test_prepare_writes_verl_parquet(prepared):
    import pyarrow.parquet as pq

    t = pq.read_table(prepared / "train.parquet").to_pylist()
    assert t and set(t[0]) >= {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert t[0]["prompt"][-1]["role"] == "user"
    assert int(t[0]["reward_model"]["ground_truth"]) >= 0
    man = json.loads((prepared / "manifest.json").read_text())
    assert man["stage"] == "prepare-data" and "versions" in man


def test_chain(prepared, tiny_model, tmp_path):
    critic = tmp_path / "critic"
    r = run_cli("pretrain-value", "--model", tiny_model, "--data", prepared, "--out", critic, "--steps", "2", "--prompts-per-step", "2",
                "--eval-prompts", "2", "--mini-batch-size", "8", "--micro-batch-size", "4", *SMALL)
    assert r.exit_code == 0, r.output
    assert (critic / "critic" / "config.json").is_file() and (critic / "manifest.json").is_file()
    AutoModelForTokenClassification.from_pretrained(critic / "critic", num_labels=1)
    bias = json.loads((critic / "bias.json").read_text())
    assert "value_by_position" in bias["before"] and "value_by_position" in bias["after"]
    assert bias["held_out"] == "validation" and bias["held_out_prompts"] == 2  # the prepared validation split
    assert len([ln for ln in (critic / "metrics.jsonl").read_text().splitlines() if ln]) == 2

    runs = {algo: [] for algo in ("ppo", "grpo", "dapo", "gspo", "cispo", "drgrpo")}
    runs.update(vcppo=["--critic", critic], vapo=["--critic", critic], clipcov=["--policy-loss", "clip-cov", "--cov-clip-ratio", "0.05"])
    for run, extra in runs.items():
        algo = "grpo" if run == "clipcov" else run
        out = tmp_path / run
        r = run_cli("train", "--algo", algo, "--model", tiny_model, "--data", prepared, "--out", out, "--steps", "2",
                    "--prompts-per-step", "2", "--mini-batch-size", "4", "--micro-batch-size", "4", "--overlong-cache-len", "4",
                    "--lr", "1e-4", "--max-gen-rounds", "2", *extra, *SMALL)
        assert r.exit_code == 0, f"{run}: {r.output}"
        lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]
        assert [m["step"] for m in lines] == [1, 2], algo
        for key in ("rollout/reward_mean", "rollout/acc_mean", "rollout/response_length_mean", "rollout/truncated_frac", "rollout/ds_rounds", "perf/gen_tokens_per_s"):
            assert key in lines[0], (algo, key)
        AutoModelForCausalLM.from_pretrained(out / "policy")
        man = json.loads((out / "manifest.json").read_text())
        assert man["stage"] == "train" and man["algo"]["name"] == algo
        if algo in ("ppo", "vcppo", "vapo"):
            assert any("critic/vf_loss" in m for m in lines), algo
            assert (out / "checkpoints" / "step_2" / "critic" / "config.json").is_file()
        if algo == "vapo":
            assert man["algo"]["pos_lm_coef"] == 0.1 and man["algo"]["adaptive_lambda"]
        if run == "clipcov":
            assert man["algo"]["policy_loss"] == "clip-cov" and any("actor/cov_selected_frac" in m for m in lines)

    ev = tmp_path / "eval"
    r = run_cli("eval", "file", "--dataset", prepared, "--model", tmp_path / "dapo", "--out", ev, "--n", "4", "--engine", "hf",
                "--max-response-len", "12", "--bootstrap", "100")
    assert r.exit_code == 0, r.output
    res = json.loads((ev / "results.json").read_text())
    assert {"avg@4", "pass@1", "pass@4", "maj@4"} <= set(res["metrics"])
    for v in res["metrics"].values():
        assert 0.0 <= v["ci"][0] <= v["value"] <= v["ci"][1] <= 1.0
    assert len((ev / "samples.jsonl").read_text().splitlines()) == res["problems"] * 4
    assert res["template"] == "none"  # a prepared directory's prompts carry prepare-data's template


def test_rollout_stage(prepared, tiny_model, tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "ro"
    r = run_cli("rollout", "--model", tiny_model, "--data", prepared, "--out", out, "--num-prompts", "3", *SMALL)
    assert r.exit_code == 0, r.output
    rows = pq.read_table(out / "rollouts.parquet").to_pylist()
    assert len(rows) == 12
    for row in rows:
        assert len(row["response_ids"]) == len(row["logprobs"]) == row["length"]
        assert row["finish_reason"] in ("stop", "length") and row["truncated"] == (row["finish_reason"] == "length")
        assert row["reward"] in (-1.0, 1.0)
    assert len({r_["group"] for r_ in rows}) == 3


def test_eval_aime_bundled(tiny_model, tmp_path):
    r = run_cli("eval", "aime", "--model", tiny_model, "--out", tmp_path / "aime", "--n", "2", "--max-problems", "2", "--engine", "hf",
                "--max-response-len", "4", "--bootstrap", "50")
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "aime" / "results.json").read_text())
    assert res["problems"] == 2 and res["n"] == 2


def test_resume_continues(prepared, tiny_model, tmp_path):
    out = tmp_path / "run"
    base = ["train", "--algo", "grpo", "--model", tiny_model, "--data", prepared, "--out", out, "--prompts-per-step", "2",
            "--mini-batch-size", "8", "--micro-batch-size", "4", "--save-every", "1", "--overlong-cache-len", "4", *SMALL]
    assert run_cli(*base, "--steps", "1").exit_code == 0
    r = run_cli(*base, "--steps", "3", "--resume")
    assert r.exit_code == 0, r.output
    assert "resumed" in r.output
    steps = [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]
    assert steps == [1, 2, 3]
    st = json.loads((out / "checkpoints" / "step_3" / "trainer_state.json").read_text())
    assert st["step"] == 3
