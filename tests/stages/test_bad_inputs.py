"""Every bad input is a one-line error naming the fix, or a counted skip: never a traceback, never
silently wrong (the cases of issue 10, one by one)."""

from __future__ import annotations

import json
import shutil

import pytest

from clihelp import assert_user_error, run_cli

pytestmark = pytest.mark.slow


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path



def test_prepare_data_refuses_or_counts_bad_answers(tmp_path):
    good = {"problem": "What is 2 + 2?", "answer": "4"}
    f = _jsonl(tmp_path / "in.jsonl", [
        '{"problem": "What is 1 + \\ud800?", "answer": "2"}',  # a lone surrogate
        {"problem": "A huge one?", "answer": "9" * 5000},  # past Python's int-string limit
        '{"problem": "A float one?", "answer": 1e23}',  # not an exact integer as a float
        {"problem": "No answer?", "answer": None},
        good,
    ])
    assert_user_error(run_cli("prepare-data", f, "--out", tmp_path / "o", "--decontaminate", ""), "line 1", "not valid Unicode", "--skip-bad-rows")
    r = run_cli("prepare-data", f, "--out", tmp_path / "o", "--decontaminate", "", "--skip-bad-rows", "--val-size", "0")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["bad_rows_skipped"] == 1 and rep["dropped"] == {"too_large": 2, "no_answer": 1} and rep["train"] == 1


def test_prepare_data_never_writes_into_its_input(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    _jsonl(d / "train.parquet.jsonl", [{"problem": "What is 2 + 2?", "answer": "4"}])
    assert_user_error(run_cli("prepare-data", d, "--out", d, "--decontaminate", ""), "holds the input", "another --out")


def test_eval_refuses_null_and_nan_answers(tiny_model, tmp_path):
    for answer in ("null", "NaN"):
        f = tmp_path / f"{answer}.jsonl"
        f.write_text('{"problem": "What is 2 + 2?", "answer": "4"}\n{"problem": "And this?", "answer": %s}\n' % answer)
        r = run_cli("eval", "file", "--dataset", f, "--model", tiny_model, "--out", tmp_path / "ev", "--engine", "hf", "--n", "1")
        assert_user_error(r, "line 2", "needs an answer")


def test_a_misspelled_recipe_table_is_an_error(prepared, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('steps = 2\n[trian]\nlr = 1e-5\n')
    assert_user_error(run_cli("train", "--config", recipe, "--data", prepared), "[trian] names no stage", "[train]")


def test_a_causal_lm_is_not_a_critic(prepared, tiny_model, tmp_path):
    r = run_cli("train", "--algo", "vcppo", "--critic", tiny_model, "--model", tiny_model, "--data", prepared, "--out", tmp_path / "r")
    assert_user_error(r, "is not a value model", "pretrain-value")


def test_a_truncated_parquet_behind_a_manifest(prepared, tiny_model, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    raw = (data / "train.parquet").read_bytes()
    (data / "train.parquet").write_bytes(raw[: len(raw) // 2])
    r = run_cli("train", "--model", tiny_model, "--data", data, "--out", tmp_path / "r", "--engine", "hf")
    assert_user_error(r, "train.parquet is not a readable parquet file", "prepare-data")


def test_pickle_weights_are_refused_unless_allowed(prepared, tiny_model, tmp_path):
    import torch
    from safetensors.torch import load_file

    model = tmp_path / "pickled"
    shutil.copytree(tiny_model, model)
    torch.save(load_file(model / "model.safetensors"), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    args = ["rollout", "--model", model, "--data", prepared, "--out", tmp_path / "ro", "--engine", "hf", "--dtype", "fp32",
            "--num-prompts", "1", "--group-size", "1", "--max-response-len", "2"]
    assert_user_error(run_cli(*args), "pickle", "--allow-pickle")
    r = run_cli(*args, "--allow-pickle")
    assert r.exit_code == 0, r.output


def test_every_prompt_too_long_is_an_error(prepared, tiny_model, tmp_path):
    r = run_cli("train", "--model", tiny_model, "--data", prepared, "--out", tmp_path / "r", "--engine", "hf", "--max-prompt-len", "2")
    assert_user_error(r, "longer than --max-prompt-len 2", "raise it")


def test_verl_parquet_columns_are_checked_before_training(tiny_model, tmp_path):
    """Issue 20 item 13: without reward_model, train ran to rc 0 with every ground truth "" (every
    reward -1); without prompt, or with a prompt that is not a list of messages, a traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    msg = [{"role": "user", "content": "What is 1 + 1?"}]
    cases = {
        "no_reward_model": ([{"prompt": msg, "data_source": "x"}] * 4, "no 'reward_model' column (its columns: prompt, data_source)"),
        "no_prompt": ([{"reward_model": {"ground_truth": "2"}}] * 4, "no 'prompt' column"),
        "int_prompt": ([{"prompt": 7, "reward_model": {"ground_truth": "2"}}] * 4, "row 1: prompt is an int (7)"),
    }
    small = ["--model", tiny_model, "--engine", "hf", "--dtype", "fp32", "--max-response-len", "4", "--group-size", "2"]
    for name, (rows, needle) in cases.items():
        f = tmp_path / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), f)
        for stage, args in [("train", ["--algo", "grpo", "--steps", "1", "--prompts-per-step", "2", "--mini-batch-size", "4", "--micro-batch-size", "4"]),
                            ("rollout", []), ("pretrain-value", ["--steps", "1", "--prompts-per-step", "2", "--eval-prompts", "1"])]:
            out = tmp_path / f"{stage}-{name}"
            r = run_cli(stage, "--data", f, "--out", out, *small, *args)
            assert_user_error(r, str(f), needle, "reward_model = {ground_truth: the answer as text}")
            assert not out.exists()


def test_a_50_mb_problem_is_skipped_without_being_tokenised(tiny_model, tmp_path, monkeypatch):
    """Issue 20 item 14: a 50 MB problem was tokenised in full (68 s, 9.7 GB) to be skipped, a 1 GB
    one aborted the Rust tokenizer. Now its length in characters, past what --max-prompt-len tokens
    can hold, skips it (counted) before the tokenizer ever sees it: in rollout, pretrain-value, train
    and eval."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reasonrl.models import loading
    from toyhelp import CountingTokenizer

    real, seen = loading.load_tokenizer, []

    def counting(path):
        seen.append(CountingTokenizer(real(path), refuse_over=1_000_000))
        return seen[-1]

    monkeypatch.setattr(loading, "load_tokenizer", counting)
    huge = "What is 1 + 1? " * (50_000_000 // 15)
    problems = [(f"What is {i} + 1?", str(i + 1)) for i in range(3)] + [(huge, "2")]
    data = tmp_path / "rl.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": a}} for q, a in problems]), data)
    small = ["--model", tiny_model, "--engine", "hf", "--dtype", "fp32", "--max-response-len", "2", "--group-size", "2"]

    r = run_cli("rollout", "--data", data, "--out", tmp_path / "ro", *small)
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "ro" / "summary.json").read_text())
    assert (summary["skipped_long_prompts"], summary["prompts"]) == (1, 3)

    r = run_cli("pretrain-value", "--data", data, "--out", tmp_path / "pv", "--steps", "1", "--prompts-per-step", "4", "--eval-prompts", "4",
                "--mini-batch-size", "8", "--micro-batch-size", "8", *small)
    assert r.exit_code == 0, r.output

    r = run_cli("train", "--data", data, "--out", tmp_path / "tr", "--algo", "grpo", "--steps", "1", "--prompts-per-step", "2",
                "--mini-batch-size", "4", "--micro-batch-size", "4", *small)
    assert r.exit_code == 0, r.output
    assert "1 of 4 prompts are longer than --max-prompt-len 512: skipped" in " ".join(r.output.split())

    f = _jsonl(tmp_path / "ev.jsonl", [{"problem": q, "answer": a} for q, a in problems])
    r = run_cli("eval", "file", "--dataset", f, "--out", tmp_path / "ev", "--n", "1", "--bootstrap", "10", *small[:-2])
    assert r.exit_code == 0, r.output
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert (results["skipped_long_prompts"], results["problems"]) == (1, 3)

    assert len(seen) >= 4 and max(n for tok in seen for n in tok.calls) < 1_000_000  # (each stage loaded its tokenizer here)


def _rollout_artifact(d, *, drop: str = "", correct: bool = True):
    """A finished `reasonrl rollout` directory of 3 prompts × 2 responses (its manifest and rollouts.parquet), without the column ``drop``."""
    import pyarrow.parquet as pq

    from reasonrl.rollouts import Sample, write_rollouts

    samples = [Sample(group=g, prompt_index=g, prompt=f"What is {g} + 1?\n", prompt_ids=[5, 6, 7], response=f"Answer: {g + 1}", response_ids=[8, 9],
                      logprobs=[-0.5, -0.25], finish_reason="stop", truncated=False, ground_truth=str(g + 1), reward=1.0, correct=correct,
                      extracted=str(g + 1), shaped_reward=1.0, data_source="toy") for g in range(3) for _ in range(2)]
    d.mkdir(parents=True)
    write_rollouts(d / "rollouts.parquet", samples)
    if drop:
        t = pq.read_table(d / "rollouts.parquet")
        pq.write_table(t.drop_columns([drop]), d / "rollouts.parquet")
    (d / "manifest.json").write_text(json.dumps({"stage": "rollout", "policy": {}, "reward": {"spec": "math"}}))
    return d


@pytest.mark.parametrize("column", ["shaped_reward", "correct", "reward", "response_ids", "prompt_ids", "logprobs", "group", "prompt",
                                    "response", "ground_truth", "truncated", "finish_reason", "prompt_index"])
def test_a_rollout_artifact_is_checked_column_by_column(column, tmp_path):
    """Issue 40 item 13: a missing column was a TypeError traceback (response_ids, group, …), all-zero critic targets
    with rc 0 (shaped_reward) or every prompt unsolved (correct): now one line naming the column and `reasonrl rollout`."""
    from reasonrl.errors import ReasonRLError
    from reasonrl.rollouts import load_rollout_artifact

    d = _rollout_artifact(tmp_path / "ro", drop=column)
    with pytest.raises(ReasonRLError) as e:
        load_rollout_artifact(d, option="--rollouts")
    msg = str(e.value)
    assert "\n" not in msg and f"no '{column}' column" in msg and "reasonrl rollout" in msg and "--rollouts" in msg, msg


def test_a_rollout_artifact_with_nulls_or_wrong_types(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reasonrl.errors import ReasonRLError
    from reasonrl.rollouts import load_rollout_artifact

    d = _rollout_artifact(tmp_path / "ro")
    t = pq.read_table(d / "rollouts.parquet")
    ok = load_rollout_artifact(d, option="--rollouts")
    assert len(ok.groups) == 3 and all(s.shaped_reward == 1.0 and s.correct for g in ok.groups for s in g)
    for col, values, needle in [("shaped_reward", pa.array([None] + [1.0] * 5, pa.float64()), "'shaped_reward' is empty (null) in row 1"),
                                ("correct", pa.array(["yes"] * 6), "'correct' holds string, not booleans"),
                                ("response_ids", pa.array([1] * 6), "'response_ids' holds int64, not lists of token ids")]:
        pq.write_table(t.set_column(t.schema.get_field_index(col), col, values), d / "rollouts.parquet")
        with pytest.raises(ReasonRLError) as e:
            load_rollout_artifact(d, option="--rollouts")
        assert needle in str(e.value) and "reasonrl rollout" in str(e.value), str(e.value)


def test_train_and_pretrain_value_name_a_missing_rollout_column(prepared, tiny_model, tmp_path):
    small = ["--model", tiny_model, "--engine", "hf", "--dtype", "fp32", "--max-response-len", "4", "--group-size", "2", "--prompts-per-step", "2"]
    for column in ("shaped_reward", "correct", "response_ids"):
        ro = _rollout_artifact(tmp_path / f"ro-{column}", drop=column)
        r = run_cli("train", "--algo", "grpo", "--data", prepared, "--rollouts", ro, "--out", tmp_path / f"t-{column}", "--steps", "1",
                    "--mini-batch-size", "4", "--micro-batch-size", "4", *small)
        assert_user_error(r, f"no '{column}' column", "reasonrl rollout")
        r = run_cli("pretrain-value", "--rollouts", ro, "--allow-other-policy", "--out", tmp_path / f"p-{column}", "--steps", "1",
                    "--mini-batch-size", "4", "--micro-batch-size", "4", "--eval-prompts", "1", *small)
        assert_user_error(r, f"no '{column}' column", "reasonrl rollout")
        assert not (tmp_path / f"t-{column}").exists() and not (tmp_path / f"p-{column}").exists()


def test_rollouts_of_a_train_run_say_what_rollouts_takes(tmp_path):
    """Issue 40 item 19: `--rollouts <a train run>` said "run `reasonrl rollout --out <that train run>`" (into the train run)."""
    from reasonrl.errors import ReasonRLError
    from reasonrl.rollouts import load_rollout_artifact

    done, crashed = tmp_path / "trained", tmp_path / "crashed"
    done.mkdir()
    (done / "manifest.json").write_text(json.dumps({"stage": "train"}))
    crashed.mkdir()
    (crashed / ".reasonrl-run.json").write_text(json.dumps({"stage": "train"}))  # (a run that stopped: its marker, no manifest)
    for d, state in ((done, "a `train` run"), (crashed, "an unfinished `train` run")):
        with pytest.raises(ReasonRLError) as e:
            load_rollout_artifact(d, option="--rollouts")
        msg = str(e.value)
        assert f"--rollouts {d} is {state}, not a rollout artifact" in msg and "reasonrl rollout" in msg, msg
        assert f"--out {d}" not in msg, msg


def test_the_pass_rate_bounds_error_counts_by_the_bounds(prepared, tiny_model, tmp_path):
    """Issue 40 item 19: prompts at pass rate 0.5 dropped by --min-pass-rate 0.5 were counted as "unsolved"."""
    import pyarrow.parquet as pq

    from reasonrl.models.loading import load_tokenizer
    from reasonrl.rollouts import Sample, prompt_text, write_rollouts

    tok = load_tokenizer(tiny_model)
    rows = pq.read_table(prepared / "train.parquet").to_pylist()
    samples = [Sample(group=g, prompt_index=g, prompt=prompt_text(row, tok), prompt_ids=[5], response="x", response_ids=[6], logprobs=[-0.1],
                      finish_reason="stop", truncated=False, ground_truth="1", reward=1.0 if k == 0 else -1.0, correct=k == 0, shaped_reward=0.0)
               for g, row in enumerate(rows) for k in range(2)]  # every prompt: pass rate 1/2
    ro = tmp_path / "ro"
    ro.mkdir()
    write_rollouts(ro / "rollouts.parquet", samples)
    (ro / "manifest.json").write_text(json.dumps({"stage": "rollout"}))
    r = run_cli("train", "--algo", "grpo", "--model", tiny_model, "--data", prepared, "--rollouts", ro, "--min-pass-rate", "0.5", "--max-pass-rate", "0.9",
                "--out", tmp_path / "t", "--engine", "hf", "--steps", "1")
    assert_user_error(r, f"{len(rows)} at pass rate <= 0.5", "0 at pass rate >= 0.9", "widen")
    assert "unsolved" not in r.output


def test_eval_skips_and_counts_the_ground_truths_prepare_data_drops(tiny_model, tmp_path):
    """Issue 40 item 19: `eval file` evaluated ground truths that prepare-data drops (a NUL, an emoji, a right-to-left
    override): now skipped and counted, by the same check (reasonrl.data.readers.answer_flaw)."""
    f = _jsonl(tmp_path / "e.jsonl", [{"problem": "What is 2 + 2?", "answer": "4"}, {"problem": "A?", "answer": "\x00"},
                                      {"problem": "B?", "answer": "😀"}, {"problem": "C?", "answer": "\u202e81"}])
    r = run_cli("eval", "file", "--dataset", f, "--model", tiny_model, "--out", tmp_path / "ev", "--engine", "hf", "--n", "1",
                "--max-response-len", "2", "--bootstrap", "10")
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert res["problems"] == 1 and res["skipped_rows"] == {"bad_characters": 3}, res.get("skipped_rows")
    said = " ".join(r.output.split())
    assert "3 rows skipped" in said and "e.jsonl line 2: the answer holds a control character (U+0000)" in said, said[-1500:]
    rows = [json.loads(x) for x in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert [x["ground_truth"] for x in rows] == ["4"]


def test_eval_names_the_bad_json_line_without_a_flag_it_lacks(tiny_model, tmp_path):
    f = tmp_path / "e.jsonl"
    f.write_text('{"problem": "What is 2 + 2?", "answer": "4"}\n{"problem": "What is 1 +\t1?", "answer": "2"}\n')
    r = run_cli("eval", "file", "--dataset", f, "--model", tiny_model, "--out", tmp_path / "ev", "--engine", "hf", "--n", "1")
    assert_user_error(r, f"{f} line 2: not valid JSON: invalid control character at column 25", "fix that line")
    assert "--skip-bad-rows" not in r.output  # (eval has no such option)


def test_eval_refuses_an_adapter_with_nan_weights(prepared, tiny_model, tmp_path):
    """Issue 40 item 19: eval ran an adapter whose weights are NaN (a diverged run's) without a word."""
    import torch
    from safetensors.torch import load_file, save_file

    from reasonrl.models import lora as L
    from reasonrl.models.loading import load_causal_lm

    model = L.apply_lora(load_causal_lm(tiny_model), L.LoraSettings(rank=4, alpha=8.0), seed=0, base_path=tiny_model)
    adapter = tmp_path / "adapter"
    L.save_adapter(model, None, adapter)
    f = adapter / L.ADAPTER_WEIGHTS
    w = load_file(str(f))
    k = next(k for k in w if "lora_B" in k)
    w[k] = torch.full_like(w[k], float("nan"))
    save_file(w, str(f), metadata={"format": "pt"})
    r = run_cli("eval", "file", "--dataset", prepared, "--model", adapter, "--engine", "hf", "--n", "1", "--max-response-len", "2",
                "--out", tmp_path / "ev")
    assert_user_error(r, str(f), "not finite", k)
    assert not (tmp_path / "ev" / "results.json").exists()
