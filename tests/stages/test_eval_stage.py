"""`reasonrl eval` on files that list a problem more than once (verl's RL format, e.g. DAPO's AIME
file): one problem per distinct (prompt, ground truth), n samples each, intervals over problems."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clihelp import assert_user_error, run_cli
from reasonrl.evaluation.scores import bootstrap_ci

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
FAST = ["--engine", "hf", "--dtype", "fp32", "--max-response-len", "8", "--bootstrap", "200"]


def verl_parquet(path: Path, items: list[tuple[str, str]]) -> Path:
    """A verl RL parquet (prompt messages, reward_model.ground_truth, ...) with one row per item."""
    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": q}], "ability": "MATH",
             "reward_model": {"ground_truth": a, "style": "rule"}, "extra_info": {"index": i}} for i, (q, a) in enumerate(items)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def samples_of(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "samples.jsonl").read_text().splitlines()]


def flat(output: str) -> str:
    return " ".join(output.split())  # undo rich's line wrapping


# Four problems the format-taught model answers with a random digit 0-4, listed 4, 2, 1 and 3 times.
PROBLEMS = [("What is 0 + 1?", "1"), ("What is 1 + 1?", "2"), ("What is 2 + 1?", "3"), ("Add 2 and 2.", "4")]
ORDER = [0, 1, 0, 3, 2, 0, 1, 3, 0, 3]


def test_replicated_rows_are_one_problem(format_model, tmp_path):
    data = verl_parquet(tmp_path / "rep.parquet", [PROBLEMS[i] for i in ORDER])
    out = tmp_path / "ev"
    r = run_cli("eval", "file", "--dataset", data, "--model", format_model, "--out", out, "--n", "6", "--template", "none",
                "--max-response-len", "6", *FAST[:4], "--bootstrap", "500", "--seed", "1")
    assert r.exit_code == 0, r.output
    assert "10 rows → 4 distinct problems (6 replicated rows merged" in flat(r.output)
    res = json.loads((out / "results.json").read_text())
    assert (res["problems"], res["n"], res["responses"]) == (4, 6, 24)
    assert res["data"] | {"files": None} == {"files": None, "rows": 10, "problems": 4, "merged_rows": 6,
                                             "rows_per_problem": {"1": 1, "2": 1, "3": 1, "4": 1}, "max_problems": None}
    samples = samples_of(out)
    assert Counter(s["problem"] for s in samples) == {0: 6, 1: 6, 2: 6, 3: 6}  # n samples per distinct problem
    assert [s["ground_truth"] for s in samples[::6]] == ["1", "2", "4", "3"]  # in order of first row
    assert [s["where"] for s in samples[::6]] == ["rep.parquet row 1", "rep.parquet row 2", "rep.parquet row 4", "rep.parquet row 5"]

    # The intervals resample the 4 distinct problems, not the 10 rows.
    acc = [sum(s["correct"] for s in samples if s["problem"] == p) / 6 for p in range(4)]
    per_row = [acc[[0, 1, 3, 2][i]] for i in ORDER]  # problem index p of row i (problems in order of first row)
    assert len(set(acc)) > 1, f"the model scored {acc}: pick other problems so that rows and problems can differ"
    assert bootstrap_ci(per_row, n_boot=500, seed=1) != bootstrap_ci(acc, n_boot=500, seed=1)
    assert res["metrics"]["avg@6"] == {"value": pytest.approx(sum(acc) / 4), "ci": list(bootstrap_ci(acc, n_boot=500, seed=1))}
    assert res["by_source"]["rep"]["problems"] == 4 and res["by_source"]["rep"]["metrics"] == res["metrics"]
    assert res["vote_verifier"]["total"] > 0 and res["vote_verifier"]["timeouts"] == 0  # maj@n asked the reward scorer

    r = run_cli("eval", "file", "--dataset", data, "--model", format_model, "--out", tmp_path / "ev2", "--n", "3", "--template", "none",
                "--max-problems", "2", *FAST)
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "ev2" / "results.json").read_text())
    assert (res["problems"], res["responses"], res["data"]["problems"], res["data"]["max_problems"]) == (2, 6, 4, 2)
    assert Counter(s["problem"] for s in samples_of(tmp_path / "ev2")) == {0: 3, 1: 3}


def test_same_prompt_with_two_answers_is_an_error(tiny_model, tmp_path):
    data = verl_parquet(tmp_path / "conflict.parquet", [("What is 1 + 1?", "2"), ("What is 2 + 2?", "4"), ("What is 1 + 1?", "3")])
    r = run_cli("eval", "file", "--dataset", data, "--model", tiny_model, "--out", tmp_path / "ev", "--n", "2", *FAST)
    assert_user_error(r, "conflict.parquet row 1 and conflict.parquet row 3 have the same prompt but different ground truths ('2' vs '3')")
    assert not (tmp_path / "ev" / "results.json").exists()


@pytest.mark.skipif(not (SHARED / "aime-2024.dapo.parquet").is_file(), reason="needs ../shared/data")
def test_dapo_aime_file_is_30_problems(tiny_model, tmp_path):
    """DAPO's file lists the 30 AIME 2024 problems 32 times each: avg@n is over 30 problems."""
    data = SHARED / "aime-2024.dapo.parquet"
    out = tmp_path / "ev"
    r = run_cli("eval", "file", "--dataset", data, "--model", tiny_model, "--out", out, "--n", "4", *FAST)
    assert r.exit_code == 0, r.output
    assert "960 rows → 30 distinct problems (930 replicated rows merged; rows per problem: 32 × 30)" in flat(r.output)
    assert "30 problems × 4 samples (120 responses)" in flat(r.output)
    res = json.loads((out / "results.json").read_text())
    assert (res["problems"], res["n"], res["responses"]) == (30, 4, 120)
    assert Counter(Counter(s["problem"] for s in samples_of(out)).values()) == {4: 30}
    assert res["data"]["rows"] == 960 and res["data"]["merged_rows"] == 930 and res["data"]["rows_per_problem"] == {"32": 30}
    # what a reader needs to reproduce the number
    assert res["data"]["files"] == {str(data): hashlib.sha256(data.read_bytes()).hexdigest()}
    weights = sorted(tiny_model.glob("*.safetensors"))
    assert weights, "the tiny model is saved as safetensors"
    h = hashlib.sha256()
    for f in weights:
        h.update(f.name.encode() + f.read_bytes())
    assert res["model_weights_sha256"] == h.hexdigest()
    assert res["engine"] == "hf" and res["engine_version"] == f"transformers {res['versions']['transformers']}"
    assert {"torch", "transformers"} <= set(res["versions"])
    assert (res["dtype"], res["seed"], res["template"]) == ("fp32", 0, "dapo")
    assert res["sampling"] == {"n": 4, "temperature": 1.0, "top_p": 0.7, "top_k": -1, "max_response_len": 8, "max_prompt_len": 2048}
    assert list(res["by_source"]) == ["aime-2024.dapo"] and res["by_source"]["aime-2024.dapo"]["problems"] == 30

    r = run_cli("eval", "file", "--dataset", data, "--model", tiny_model, "--out", tmp_path / "ev2", "--n", "4", "--max-problems", "2", *FAST)
    assert r.exit_code == 0, r.output
    assert "evaluating the first 2 of 30 distinct problems" in flat(r.output)
    res = json.loads((tmp_path / "ev2" / "results.json").read_text())
    assert (res["problems"], res["responses"], res["data"]["problems"]) == (2, 8, 30)


def test_problem_and_answer_fields_are_options(tiny_model, prepared, tmp_path):
    """Issue 20 item 16: eval advised --problem-field / --answer-field, options it did not have, so a
    file whose answer is in `final` could not be evaluated without prepare-data."""
    f = tmp_path / "final.jsonl"
    rows = [{"id": i, "q": f"What is {i} + 1?", "meta": {"final": str(i + 1)}} for i in range(3)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ev"
    r = run_cli("eval", "file", "--dataset", f, "--model", tiny_model, "--out", out, "--n", "2", "--problem-field", "q",
                "--answer-field", "meta.final", *FAST)
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert (res["problems"], res["responses"]) == (3, 6)
    assert [s["ground_truth"] for s in samples_of(out)[::2]] == ["1", "2", "3"]
    config = json.loads((out / "manifest.json").read_text())["config"]
    assert (config["problem_field"], config["answer_field"]) == ("q", "meta.final")

    flat_file = tmp_path / "flat.jsonl"
    flat_file.write_text("".join(json.dumps({"problem": r["q"], "final": r["meta"]["final"]}) + "\n" for r in rows))
    r = run_cli("eval", "file", "--dataset", flat_file, "--model", tiny_model, "--out", tmp_path / "ev2", "--n", "1", "--answer-field", "final", *FAST)
    assert r.exit_code == 0, r.output
    assert [s["ground_truth"] for s in samples_of(tmp_path / "ev2")] == ["1", "2", "3"]

    # a wrong name: one line listing the file's fields; the advice of the auto-detection names the option that now exists
    r = run_cli("eval", "file", "--dataset", f, "--model", tiny_model, "--out", tmp_path / "ev3", "--problem-field", "q", "--answer-field", "final", *FAST)
    assert_user_error(r, "line 1: no 'final' field (from --answer-field; its fields: id, q, meta, meta.final)")
    r = run_cli("eval", "file", "--dataset", flat_file, "--model", tiny_model, "--out", tmp_path / "ev3", *FAST)
    assert_user_error(r, "no answer field", "its fields: problem, final", "pass --answer-field NAME")
    r = run_cli("eval", "file", "--dataset", prepared, "--model", tiny_model, "--out", tmp_path / "ev3", "--answer-field", "final", *FAST)
    assert_user_error(r, "prepare-data directory", "drop them")
    assert not (tmp_path / "ev3").exists()


def test_an_empty_answer_is_refused(tiny_model, tmp_path):
    """An empty answer made every reward of its problem -1, silently."""
    f = tmp_path / "e.jsonl"
    f.write_text('{"problem": "What is 1 + 1?", "answer": "2"}\n{"problem": "What is 2 + 2?", "answer": " "}\n')
    r = run_cli("eval", "file", "--dataset", f, "--model", tiny_model, "--out", tmp_path / "ev", "--n", "1", *FAST)
    assert_user_error(r, "e.jsonl line 2: answer is empty", "needs an answer")
