"""Bad input: a one-line error naming the fix, exit code 1, nothing already written damaged."""

from __future__ import annotations

import json

from clihelp import assert_user_error, run_cli


def test_help_lists_stages():
    r = run_cli("--help")
    assert r.exit_code == 0
    for cmd in ("prepare-data", "pretrain-value", "rollout", "train", "eval", "main-job"):
        assert cmd in r.output
    r = run_cli("train", "--help")
    assert r.exit_code == 0 and "--algo" in r.output and "--config" in r.output and "--set" in r.output


def test_missing_data_names_stage(tmp_path):
    r = run_cli("train", "--data", tmp_path / "nope", "--out", tmp_path / "o", "--engine", "hf")
    assert_user_error(r, "prepare-data")


def test_missing_input_file(tmp_path):
    r = run_cli("prepare-data", tmp_path / "missing.jsonl", "--out", tmp_path / "d")
    assert_user_error(r, "missing.jsonl")


def test_empty_dataset(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    assert_user_error(run_cli("prepare-data", f, "--out", tmp_path / "d"))


def test_rows_without_answers(tmp_path):
    f = tmp_path / "noans.jsonl"
    f.write_text(json.dumps({"problem": "What is 1 + 1?"}) + "\n")
    assert_user_error(run_cli("prepare-data", f, "--out", tmp_path / "d"), "line 1")


def test_not_a_model_dir(toy_data_file, tmp_path):
    d = tmp_path / "data"
    assert run_cli("prepare-data", toy_data_file, "--out", d, "--template", "none").exit_code == 0
    (tmp_path / "notmodel").mkdir()
    r = run_cli("train", "--data", d, "--model", tmp_path / "notmodel", "--out", tmp_path / "o", "--engine", "hf")
    assert_user_error(r, "--model")
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_vcppo_without_critic(toy_data_file, tiny_model, tmp_path):
    d = tmp_path / "data"
    assert run_cli("prepare-data", toy_data_file, "--out", d, "--template", "none").exit_code == 0
    r = run_cli("train", "--algo", "vcppo", "--data", d, "--model", tiny_model, "--out", tmp_path / "o", "--engine", "hf")
    assert_user_error(r, "pretrain-value")


def test_vapo_without_critic_and_bad_variant_knobs(toy_data_file, tiny_model, tmp_path):
    d = tmp_path / "data"
    assert run_cli("prepare-data", toy_data_file, "--out", d, "--template", "none").exit_code == 0
    assert_user_error(run_cli("train", "--algo", "vapo", "--data", d, "--model", tiny_model, "--out", tmp_path / "o", "--engine", "hf"), "pretrain-value")
    # CISPO's bounds are absolute weights: a relative-looking "0.2" is refused, naming the field
    assert_user_error(run_cli("train", "--algo", "cispo", "--cispo-weight-max", "0.2", "--out", tmp_path / "o"), "cispo_weight_max")
    assert_user_error(run_cli("train", "--algo", "grpo", "--policy-loss", "clip_cov", "--out", tmp_path / "o"), "clip-cov")
    assert_user_error(run_cli("train", "--algo", "vapo", "--pos-lm-coef", "-1", "--out", tmp_path / "o"), "pos_lm_coef")


def test_unknown_algo_and_conflicts(tmp_path):
    assert_user_error(run_cli("train", "--algo", "reinforce", "--out", tmp_path / "o"), "ppo")
    assert_user_error(run_cli("train", "--resume", "--overwrite", "--out", tmp_path / "o"), "conflict")
    assert_user_error(run_cli("train", "--micro-batch-size", "64", "--mini-batch-size", "8", "--out", tmp_path / "o"), "micro")


def test_recipe_unknown_key_and_type(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('algo = "dapo"\nstepz = 3\n')
    assert_user_error(run_cli("train", "--config", bad), "stepz")
    bad.write_text('steps = "many"\n')
    assert_user_error(run_cli("train", "--config", bad), "steps")
    assert_user_error(run_cli("train", "--set", "lr=fast"), "lr")
    assert_user_error(run_cli("train", "--config", tmp_path / "none.toml"), "--config")


def test_shipped_recipes_parse(tmp_path):
    """Every recipe in stages/ builds its stage's config (no unknown keys, right types); an ablation spec, every rung's train config."""
    from pathlib import Path

    from reasonrl.config import build_config, load_recipe, recipe_layer
    from reasonrl.stages.prepare_data import PrepareConfig
    from reasonrl.stages.eval import EvalConfig
    from reasonrl.stages.pretrain_value import PretrainValueConfig
    from reasonrl.stages.train import TrainConfig
    from reasonrl.stages.ablate import AblateConfig
    from reasonrl.stages.ablation.plan import make_plan, train_config

    kinds = {"prepare-data": PrepareConfig, "pretrain-value": PretrainValueConfig, "train": TrainConfig, "eval": EvalConfig}
    files = sorted((Path(__file__).resolve().parents[2] / "stages").glob("*.toml"))
    assert len(files) >= 8
    for f in files:
        if f.name.startswith("ablate"):  # (an ablation's spec: its rungs are train overrides)
            plan = make_plan(AblateConfig(spec=str(f), out=str(tmp_path / f.stem), sets=[f"data={tmp_path}"]))
            for r in plan.rungs:
                train_config(plan, r, plan.seeds[0], tmp_path / f.stem)
            continue
        stage = next(k for k in kinds if f.name.startswith(k))
        extra = {"inputs": ["x.jsonl"]} if stage == "prepare-data" else {}
        build_config(kinds[stage], recipe_layer(load_recipe(f), stage), extra)


def test_finished_output_not_overwritten(toy_data_file, tmp_path):
    d = tmp_path / "data"
    assert run_cli("prepare-data", toy_data_file, "--out", d, "--template", "none").exit_code == 0
    before = (d / "train.parquet").read_bytes()
    assert_user_error(run_cli("prepare-data", toy_data_file, "--out", d), "--overwrite")
    assert (d / "train.parquet").read_bytes() == before


def test_bad_lr_schedules_are_one_line_errors(tmp_path):
    for stage in ("train", "pretrain-value"):
        for args, needle in [(["--lr-schedule", "linear"], "lr_schedule must be one of constant, cosine"),
                             (["--lr-schedule", "cosine", "--min-lr-ratio", "1.5"], "min_lr_ratio must be in [0, 1]"),
                             (["--min-lr-ratio", "-0.1"], "min_lr_ratio"),
                             (["--warmup-ratio", "1"], "warmup_ratio must be in [0, 1)"),
                             (["--warmup-ratio", "-0.5"], "warmup_ratio"),
                             (["--warmup-steps", "5", "--warmup-ratio", "0.1"], "both set"),
                             (["--warmup-steps", "-1"], "warmup_steps must be >= 0")]:
            assert_user_error(run_cli(stage, *args, "--out", tmp_path / "o"), needle)
    assert not (tmp_path / "o").exists()


def test_a_negative_partial_rollout_len_is_said_to_be_negative(tmp_path):
    """Issue 40 item 19: `--partial-rollout-len -4` said "must divide max_response_len (16)"."""
    r = run_cli("train", "--partial-rollout-len", "-4", "--max-response-len", "16", "--out", tmp_path / "o")
    assert_user_error(r, "partial_rollout_len must be >= 0", "got -4")
    assert "divide" not in r.output
