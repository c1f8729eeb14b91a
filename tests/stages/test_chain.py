"""The chain the design draws, through the real CLI on the tiny model: rollout → pretrain-value --rollouts
(the critic learns offline from the saved responses) → train --rollouts (the prompts filtered by their
pass rates) → eval; and each link's bad inputs."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clihelp import assert_user_error, run_cli
from toyhelp import jsonl_records

pytestmark = pytest.mark.slow

SMALL = ["--engine", "hf", "--dtype", "fp32", "--max-response-len", "12", "--seed", "0"]
VALUE = ["--mini-batch-size", "8", "--micro-batch-size", "4", "--prompts-per-step", "2", "--eval-prompts", "2"]


@pytest.fixture(scope="module")
def rollouts(prepared, format_model, tmp_path_factory):
    """A rollout artifact of 6 training prompts × 4 responses by the format-taught tiny model (read only)."""
    out = tmp_path_factory.mktemp("chain") / "ro"
    r = run_cli("rollout", "--model", format_model, "--data", prepared, "--out", out, "--num-prompts", "6", "--group-size", "4", *SMALL)
    assert r.exit_code == 0, r.output
    return out


def _lines(path):
    return jsonl_records(path)  # (complete lines: a run being watched or just killed may have one half-written)


def test_rollout_manifest_names_its_policy(rollouts, format_model):
    from reasonrl.artifacts import hash_weights

    man = json.loads((rollouts / "manifest.json").read_text())
    assert man["policy"]["weights_sha256"] == hash_weights(format_model)
    assert man["policy"]["path"] == str(format_model)


def test_pretrain_value_from_rollouts(rollouts, format_model, tmp_path):
    """Offline value pretraining: no engine, the saved responses and rewards; --epochs sets the steps."""
    out = tmp_path / "critic"
    r = run_cli("pretrain-value", "--rollouts", rollouts, "--model", format_model, "--out", out, "--epochs", "2", "--data", tmp_path / "absent",
                *VALUE, *SMALL)
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4  # 2 epochs × 4 training prompts (2 of 6 held out) / 2 per step
    assert summary["rollouts"]["prompts"] == 4 and summary["rollouts"]["held_out_prompts"] == 2 and summary["rollouts"]["epochs"] == 2.0
    bias = json.loads((out / "bias.json").read_text())
    assert bias["held_out"] == "rollouts" and bias["held_out_prompts"] == 2 and bias["held_out_responses"] == 8
    m = _lines(out / "metrics.jsonl")
    assert [x["step"] for x in m] == [1, 2, 3, 4]
    assert all(x["rollout/batch_size"] == 8 and x["rollout/ds_rounds"] == 0 for x in m)
    # the responses served are the saved ones, each training prompt once an epoch: 2 epochs hold twice its correct answers
    from reasonrl.rollouts import load_rollout_artifact
    from reasonrl.stages.pretrain_value import split_saved

    train, held = split_saved(load_rollout_artifact(rollouts, option="--rollouts").groups, 2, 0)
    assert sum(round(x["rollout/acc_mean"] * 8) for x in m) == 2 * sum(s.correct for g in train for s in g)
    assert len(held) == 2 and {g[0].prompt for g in held}.isdisjoint(g[0].prompt for g in train)
    man = json.loads((out / "manifest.json").read_text())
    assert "rollouts" in man["inputs"] and "data" not in man["inputs"]
    assert man["sampled_by"]["weights_sha256"] == json.loads((rollouts / "manifest.json").read_text())["policy"]["weights_sha256"]
    assert man["steps"] == 4


def test_pretrain_value_rollouts_bad_inputs(rollouts, format_model, tmp_path):
    # another policy sampled them
    other = tmp_path / "other"
    shutil.copytree(format_model, other)
    from safetensors.torch import load_file, save_file

    w = next(other.glob("*.safetensors"))
    t = load_file(w)
    k = next(iter(t))
    t[k] = t[k] + 1
    save_file(t, w, metadata={"format": "pt"})
    base = ["pretrain-value", "--rollouts", rollouts, "--out", tmp_path / "c", *VALUE, *SMALL]
    assert_user_error(run_cli(*base, "--model", other), "--allow-other-policy", "--model")
    r = run_cli(*base, "--model", other, "--allow-other-policy", "--steps", "1")
    assert r.exit_code == 0, r.output
    # not a rollout artifact / missing / too few prompts / options without --rollouts
    assert_user_error(run_cli(*base[:2], tmp_path / "nowhere", *base[3:], "--model", format_model), "reasonrl rollout")
    assert_user_error(run_cli(*base[:2], tmp_path / "c", *base[3:], "--model", format_model, "--overwrite"), "not a rollout artifact")
    assert_user_error(run_cli(*base, "--model", format_model, "--eval-prompts", "6", "--out", tmp_path / "c2"), "--eval-prompts")
    assert_user_error(run_cli("pretrain-value", "--epochs", "2", "--model", format_model, "--out", tmp_path / "c3"), "--rollouts")
    assert_user_error(run_cli(*base, "--model", format_model, "--reward", "examples/rewards/exact_match.py:exact_match", "--out", tmp_path / "c4"), "--reward")
    # an artifact from before the policy record
    old = tmp_path / "old"
    shutil.copytree(rollouts, old)
    man = json.loads((old / "manifest.json").read_text())
    del man["policy"]
    (old / "manifest.json").write_text(json.dumps(man))
    assert_user_error(run_cli(*base[:2], old, *base[3:], "--model", format_model, "--out", tmp_path / "c5"), "older", "--allow-other-policy")


def test_the_chain_rollout_pretrain_value_train_eval(rollouts, prepared, format_model, tmp_path):
    """rollout → pretrain-value --rollouts → train --filter-rollouts (vcppo, the filtered prompts) → eval, as a user types them."""
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.rollouts import load_rollout_artifact, prompt_text

    critic = tmp_path / "critic"
    r = run_cli("pretrain-value", "--rollouts", rollouts, "--model", format_model, "--out", critic, "--steps", "2", *VALUE, *SMALL)
    assert r.exit_code == 0, r.output
    out = tmp_path / "train"
    r = run_cli("train", "--algo", "vcppo", "--critic", critic, "--filter-rollouts", rollouts, "--model", format_model, "--data", prepared, "--out", out,
                "--steps", "2", "--prompts-per-step", "2", "--group-size", "4", "--mini-batch-size", "8", "--micro-batch-size", "4", "--lr", "1e-4", *SMALL)
    assert r.exit_code == 0, r.output
    # the counts: what the artifact's pass rates say of the training prompts
    rates = load_rollout_artifact(rollouts, option="--rollouts").pass_rates()
    tok = load_tokenizer(format_model)
    import pyarrow.parquet as pq

    train_rows = pq.read_table(prepared / "train.parquet").to_pylist()
    ps = [rates.get(prompt_text(row, tok)) for row in train_rows]
    want = {"prompts": len(train_rows), "unrated": sum(p is None for p in ps), "dropped_solved": sum(p is not None and p[0] == p[1] for p in ps),
            "dropped_unsolved": sum(p is not None and p[0] == 0 for p in ps)}
    want["kept"] = want["prompts"] - want["dropped_solved"] - want["dropped_unsolved"]
    assert want["unrated"] == want["prompts"] - 6
    summary = json.loads((out / "summary.json").read_text())
    got = summary["prompts"]["rollouts_filter"]
    assert {k: got[k] for k in want} == want and summary["prompts"]["prompts"] == want["kept"]
    man = json.loads((out / "manifest.json").read_text())
    assert man["prompts"]["rollouts_filter"] == got and "rollouts" in man["inputs"]
    assert f"kept {want['kept']} of {want['prompts']} prompts" in " ".join(r.output.split())
    ev = tmp_path / "eval"
    r = run_cli("eval", "file", "--dataset", prepared, "--model", out, "--out", ev, "--n", "2", "--engine", "hf", "--max-response-len", "12",
                "--bootstrap", "50")
    assert r.exit_code == 0, r.output
    assert json.loads((ev / "results.json").read_text())["problems"] == 4


def test_train_rollouts_bad_inputs(rollouts, prepared, format_model, tmp_path):
    base = ["train", "--algo", "grpo", "--model", format_model, "--data", prepared, "--steps", "1", "--prompts-per-step", "2", "--group-size", "4",
            "--mini-batch-size", "8", "--micro-batch-size", "4", *SMALL]
    val = tmp_path / "val-ro"  # rollouts of the validation split: no prompt in common with the training prompts
    r = run_cli("rollout", "--model", format_model, "--data", prepared, "--split", "validation", "--out", val, "--group-size", "2", *SMALL)
    assert r.exit_code == 0, r.output
    assert_user_error(run_cli(*base, "--filter-rollouts", val, "--out", tmp_path / "a"), "shares no prompt", "reasonrl rollout --data")
    assert_user_error(run_cli(*base, "--filter-rollouts", rollouts, "--unrated", "drop", "--min-pass-rate", "0.999", "--max-pass-rate", "1",
                              "--out", tmp_path / "b"), "widen")
    assert_user_error(run_cli(*base, "--min-pass-rate", "0.1", "--out", tmp_path / "c"), "--filter-rollouts")
    assert_user_error(run_cli(*base, "--filter-rollouts", rollouts, "--min-pass-rate", "0.5", "--max-pass-rate", "0.5", "--out", tmp_path / "d"), "below")
    assert_user_error(run_cli(*base, "--rollouts", tmp_path / "nowhere", "--out", tmp_path / "e"), "reasonrl rollout")
    assert not any((tmp_path / d).exists() for d in "abde")  # nothing written before the inputs were checked


SOLVED = '''def solved_when_even(response, ground_truth, **info):
    """Every response to an even answer is right (those prompts are solved at once); the others by the response's parity."""
    return int(ground_truth) % 2 == 0 or len(response) % 2 == 0
'''


def test_skip_solved_epochs_kill_and_resume_is_bitwise_equal(format_model, tmp_path):
    """--skip-solved-epochs 1 on 10 prompts for 8 steps of 2: the even-answer prompts are retired at their first visit and
    skipped in the next epochs; a run SIGKILLed mid-way and resumed ends with the same metrics and weights."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file

    from toyhelp import toy_rows

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(root)}
    (tmp_path / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in toy_rows(12, seed=5)))
    (tmp_path / "solved.py").write_text(SOLVED)
    cmd = [sys.executable, "-m", "reasonrl.cli"]
    subprocess.run([*cmd, "prepare-data", tmp_path / "toy.jsonl", "--out", tmp_path / "data", "--template", "none", "--val-size", "2"],
                   env=env, check=True, capture_output=True, timeout=300)

    def train(out, *extra):
        return [*cmd, "train", "--algo", "grpo", "--model", format_model, "--data", tmp_path / "data", "--out", out, "--steps", "8",
                "--prompts-per-step", "2", "--group-size", "4", "--mini-batch-size", "8", "--micro-batch-size", "4", "--lr", "1e-3",
                "--save-every", "1", "--skip-solved-epochs", "1", "--reward", f"{tmp_path / 'solved.py'}:solved_when_even", "--report-to", "none",
                *SMALL, *extra]

    ref = tmp_path / "ref"
    subprocess.run(train(ref), env=env, check=True, capture_output=True, timeout=600)
    metrics = lambda out: [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in _lines(out / "metrics.jsonl")]  # noqa: E731
    m = metrics(ref)
    assert m[-1]["rollout/retired_prompts"] >= 1  # (the even answers among the 10)
    assert json.loads((ref / "summary.json").read_text())["prompts"]["retired_solved"] == m[-1]["rollout/retired_prompts"]

    out = tmp_path / "killed"
    p = subprocess.Popen(train(out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while p.poll() is None and not ((out / "metrics.jsonl").exists() and len(_lines(out / "metrics.jsonl")) >= 3):
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)  # (in step 4: a step of the tiny model takes a fraction of a second)
    p.wait(timeout=60)
    assert not (out / "manifest.json").exists() and len(_lines(out / "metrics.jsonl")) < 8  # (killed mid-run)
    r = subprocess.run(train(out, "--resume"), env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert metrics(out) == m
    a, b = load_file(ref / "policy" / "model.safetensors"), load_file(out / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
