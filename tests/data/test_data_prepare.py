"""The prepare-data stage: formats, field mapping, dedup, decontamination, split, outputs, errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from reasonrl.artifacts import LOCK, MANIFEST
from reasonrl.config import build_config
from reasonrl.data import DAPO_TEMPLATE, load_prepared
from reasonrl.evaluation.sets import EVAL_SETS
from reasonrl.stages.prepare_data import PrepareConfig, print_report, run_prepare
from reasonrl.data.templates import DAPO_PREFIX
from reasonrl.errors import MissingArtifactError, ReasonRLError

COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]
EXTRA = {"index", "split", "raw_problem", "original_problem", "original_answer", "rule", "source"}


def prepare(tmp_path: Path, inputs, name: str = "out", **kw) -> tuple[dict, Path]:
    out = tmp_path / name
    kw.setdefault("decontaminate", [])
    report = run_prepare(PrepareConfig(inputs=[str(i) for i in inputs], out=str(out), **kw))
    return report, out


def rows_of(out: Path, split: str = "train") -> list[dict]:
    return load_prepared(out, split)


def check_verl_format(out: Path, template: str = "dapo") -> list[dict]:
    rows = rows_of(out, "train") + rows_of(out, "validation")
    for split in ("train", "validation"):
        assert pq.read_schema(out / f"{split}.parquet").names == COLUMNS
    for row in rows:
        assert row["ability"] == "math"
        assert row["reward_model"]["style"] == "rule"
        assert str(int(row["reward_model"]["ground_truth"])) == row["reward_model"]["ground_truth"]
        assert set(row["extra_info"]) == EXTRA
        (msg,) = row["prompt"]
        assert msg["role"] == "user"
        if template == "dapo":
            assert msg["content"] == DAPO_TEMPLATE.format(problem=row["extra_info"]["raw_problem"])
    return rows


# --- one test per public data set -------------------------------------------------------------


def test_math500(tmp_path, shared):
    report, out = prepare(tmp_path, [shared / "math500.jsonl"], decontaminate=["aime24", "aime25"])
    assert report["rows_read"] == 500
    assert report["kept_unchanged"] == 315
    assert report["transformed"]["fraction"] == 59 and report["transformed"]["sqrt"] == 14
    assert sum(report["dropped"].values()) == 82
    assert report["train"] + report["validation"] == 418
    assert report["validation"] == round(418 * 0.05)
    rows = check_verl_format(out)
    frac = next(r for r in rows if r["extra_info"]["original_answer"] == "\\frac{3}{56}")
    assert frac["reward_model"]["ground_truth"] == "59"
    assert frac["extra_info"]["raw_problem"].endswith("find $m+n$.")
    assert frac["extra_info"]["rule"] == "fraction"
    assert report["samples"]["fraction"][0]["sentence"]
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(report, default=str))


def test_minerva_math_answers_from_boxed(tmp_path, shared):
    report, out = prepare(tmp_path, [shared / "minerva_math.jsonl"])
    assert report["rows_read"] == 272
    assert report["kept_unchanged"] == 64
    assert report["dropped"]["decimal"] > 100
    rows = check_verl_format(out)
    assert all(r["data_source"] == "minerva_math" for r in rows)


def test_olympiadbench_list_answers(tmp_path, shared):
    report, out = prepare(tmp_path, [shared / "olympiadbench.jsonl"], max_rows=200)
    assert report["rows_read"] == 200
    assert report["kept_unchanged"] > 50 and report["transformed"]["fraction"] > 10
    assert report["dropped"]["multiple_answers"] > 0  # "$69$,$84$"
    check_verl_format(out)


def test_amc23_float_answers(tmp_path, shared):
    report, out = prepare(tmp_path, [shared / "amc23.jsonl"], decontaminate=["aime24", "aime25", "math500"])
    assert (report["rows_read"], report["kept_unchanged"], report["dropped"]) == (40, 40, {})
    # stock phrases shared with AIME ("m and n are relatively prime positive integers") are not contamination
    assert report["contaminated"] == {"aime24": 0, "aime25": 0, "math500": 0}
    rows = check_verl_format(out)
    first = next(r for r in rows if r["extra_info"]["original_answer"] == "27.0")
    assert first["reward_model"]["ground_truth"] == "27"


def test_gsm8k_train(tmp_path, shared):
    report, out = prepare(tmp_path, [shared / "gsm8k_train.jsonl"], max_rows=400, template="boxed")
    assert (report["rows_read"], report["kept_unchanged"]) == (400, 400)
    rows = check_verl_format(out, template="boxed")
    assert rows_of(out)[0]["reward_model"]["ground_truth"] == "72"  # "... #### 72"
    assert all(r["prompt"][0]["content"].endswith("within \\boxed{}.") for r in rows)


def test_gsm8k_test(tmp_path, shared):
    report, out = prepare(tmp_path, [shared / "gsm8k_test.jsonl"], max_rows=300, template="none", decontaminate=["math500"])
    assert report["kept_unchanged"] == 300
    rows = check_verl_format(out, template="none")
    assert all(r["prompt"][0]["content"] == r["extra_info"]["raw_problem"] for r in rows)


def test_dapo_verl_parquet(tmp_path, shared):
    report, out = prepare(tmp_path, [shared / "aime-2024.dapo.parquet"], val_size=5)
    assert report["rows_read"] == 960
    assert report["duplicates"] == 930  # 30 problems x 32 repeats
    assert report["rows_per_problem"] == {"32": 30} and report["max_rows_per_problem"] == 32
    assert (report["train"], report["validation"]) == (25, 5)
    rows = check_verl_format(out)
    assert all(r["data_source"] == "math_dapo" for r in rows)
    assert not any(r["extra_info"]["raw_problem"].startswith(DAPO_PREFIX[:20]) for r in rows)  # template stripped
    assert any(r["extra_info"]["raw_problem"].startswith("Find the largest possible real part") for r in rows)
    # the same problems are AIME 2024: decontamination against the bundled copy removes them, except
    # the torus problem, which DAPO reworded (12% of its 13-grams are AIME's)
    report, out = prepare(tmp_path, [shared / "aime-2024.dapo.parquet"], name="out2", decontaminate=["aime24"])
    assert report["contaminated"] == {"aime24": 29}
    assert rows_of(out)[0]["extra_info"]["raw_problem"].startswith("Torus")



def test_zero_rows_kept_says_why(tmp_path, write_jsonl):
    aime = [json.loads(line) for line in EVAL_SETS["aime24"].paths()[0].read_text().splitlines()]
    write_jsonl(tmp_path / "a.jsonl", aime[:5] + aime[:2])
    with pytest.raises(ReasonRLError, match=r"^0 of 7 rows kept: 5 in aime24, 2 duplicate; the problems belong to evaluation sets"):
        prepare(tmp_path, [tmp_path / "a.jsonl"], decontaminate=["aime24"])
    assert not (tmp_path / "out").exists()


# --- formats and field mapping --------------------------------------------------------------------

SMALL = [
    {"problem": "What is $1+1$?", "answer": "2"},
    {"problem": "What is half of one?", "answer": "\\frac{1}{2}"},
    {"problem": "Name the pair.", "answer": "(1,2)"},
    {"problem": "What is $2 \\cdot 3$?", "answer": "6"},
]


def test_json_list_and_data_dict(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(SMALL))
    (tmp_path / "b.json").write_text(json.dumps({"data": SMALL}))
    for name in ("a.json", "b.json"):
        report, out = prepare(tmp_path, [tmp_path / name], name=f"out-{name}", val_fraction=0.0)
        assert (report["rows_read"], report["kept_unchanged"], report["transformed"], report["dropped"]) == (4, 2, {"fraction": 1}, {"tuple": 1})
        assert report["validation"] == 0 and rows_of(out, "validation") == []


def test_keep_non_integer_keeps_answers_as_written_and_counts_them(tmp_path):
    """For a reward plug-in: --keep-non-integer keeps what the integer transformation would drop or
    rewrite (with --no-integerize) / refuses (with --integerize), problem and answer as written."""
    rows = [*SMALL, {"problem": "Which color is the sky?", "answer": "blue"}, {"problem": "Blank?", "answer": "  "}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    report, out = prepare(tmp_path, [tmp_path / "a.json"], name="raw", val_fraction=0.0, integerize=False, keep_non_integer=True)
    kept = {r["extra_info"]["raw_problem"]: (r["reward_model"]["ground_truth"], r["extra_info"]["rule"]) for r in rows_of(out)}
    assert kept == {"What is $1+1$?": ("2", "integer"), "What is $2 \\cdot 3$?": ("6", "integer"),
                    "What is half of one?": ("\\frac{1}{2}", "non_integer"), "Name the pair.": ("(1,2)", "non_integer"),
                    "Which color is the sky?": ("blue", "non_integer")}
    assert (report["kept_unchanged"], report["kept_non_integer"], report["transformed"], report["kept"]) == (2, 3, {}, 5)
    assert sum(report["dropped"].values()) == 1  # the blank answer: nothing to judge
    # with --integerize, the fraction is rewritten as before and only the refused rows are kept as written
    report, out = prepare(tmp_path, [tmp_path / "a.json"], name="int", val_fraction=0.0, keep_non_integer=True)
    assert (report["kept_unchanged"], report["transformed"], report["kept_non_integer"]) == (2, {"fraction": 1}, 2)
    # without the flag, nothing changes
    report, _ = prepare(tmp_path, [tmp_path / "a.json"], name="off", val_fraction=0.0, integerize=False)
    assert (report["kept_non_integer"], report["kept"]) == (0, 2)


def test_plain_parquet_saved_dataset_and_directory(tmp_path, write_jsonl):
    import datasets

    pq.write_table(pa.Table.from_pylist(SMALL), tmp_path / "small.parquet")
    datasets.Dataset.from_list(SMALL).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(SMALL), "test": datasets.Dataset.from_list(SMALL[:2])}).save_to_disk(
        str(tmp_path / "saved_dict")
    )
    (tmp_path / "dir").mkdir()
    write_jsonl(tmp_path / "dir" / "x.jsonl", SMALL[:2])
    write_jsonl(tmp_path / "dir" / "y.jsonl", SMALL[2:])
    for name, n_read in [("small.parquet", 4), ("saved", 4), ("saved_dict", 6), ("dir", 4)]:
        report, out = prepare(tmp_path, [tmp_path / name], name=f"out-{name}")
        assert report["rows_read"] == n_read, name
        assert report["dropped"] == {"tuple": 1}, name
        assert report["duplicates"] == n_read - 4, name  # the DatasetDict's test split repeats two train rows
        check_verl_format(out)


def test_field_overrides_and_data_source(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "n.jsonl", [{"q": {"text": "What is $3+4$?"}, "meta": {"gt": "7"}}])
    report, out = prepare(tmp_path, [tmp_path / "n.jsonl"], problem_field="q.text", answer_field="meta.gt", data_source="mine")
    (row,) = rows_of(out)
    assert row["data_source"] == "mine" and row["reward_model"]["ground_truth"] == "7"
    assert row["extra_info"]["raw_problem"] == "What is $3+4$?"
    assert row["extra_info"]["source"].endswith("n.jsonl line 1")


def test_solution_without_boxed_is_dropped(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "s.jsonl", [{"problem": "P one", "solution": "so \\boxed{5}."}, {"problem": "P two", "solution": "no box"}])
    report, _ = prepare(tmp_path, [tmp_path / "s.jsonl"])
    assert report["kept_unchanged"] == 1 and report["dropped"] == {"no_answer": 1}


def test_integerize_off_keeps_only_integers(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "s.jsonl", SMALL)
    report, _ = prepare(tmp_path, [tmp_path / "s.jsonl"], integerize=False)
    assert report["kept_unchanged"] == 2 and report["dropped"] == {"not_integer": 2}
    fractions = [{"problem": f"Problem {i}", "answer": f"\\frac{{1}}{{{i + 2}}}"} for i in range(12)]
    write_jsonl(tmp_path / "f.jsonl", fractions)
    with pytest.raises(ReasonRLError, match=r"^0 of 12 rows kept: 12 not_integer; pass --integerize"):
        prepare(tmp_path, [tmp_path / "f.jsonl"], name="out2", integerize=False)


def test_duplicates_and_split(tmp_path, write_jsonl):
    rows = [{"problem": f"Find the value of item {i}.", "answer": str(i)} for i in range(40)]
    rows += [{"problem": "FIND the value of  item 3!", "answer": "3"}, {"problem": "find the value of item 4", "answer": "5"}]
    write_jsonl(tmp_path / "d.jsonl", rows)
    report, out = prepare(tmp_path, [tmp_path / "d.jsonl"], val_fraction=0.25, seed=1)
    assert report["duplicates"] == 2 and report["duplicates_with_other_answer"] == 1
    assert report["rows_per_problem"] == {"1": 38, "2": 2} and report["max_rows_per_problem"] == 2  # items 3 and 4
    console = Console(record=True, width=200)
    print_report(report, console)
    assert "kept problems × rows each │ 38 × 1, 2 × 2 (max 2)" in console.export_text()
    assert (report["train"], report["validation"]) == (30, 10)
    val = [r["extra_info"]["original_problem"] for r in rows_of(out, "validation")]
    train = [r["extra_info"]["original_problem"] for r in rows_of(out, "train")]
    assert not set(val) & set(train)
    assert [r["extra_info"]["index"] for r in rows_of(out, "validation")] == list(range(10))
    _, out_same = prepare(tmp_path, [tmp_path / "d.jsonl"], name="same", val_fraction=0.25, seed=1)
    _, out_other = prepare(tmp_path, [tmp_path / "d.jsonl"], name="other", val_fraction=0.25, seed=2)
    assert [r["extra_info"]["original_problem"] for r in rows_of(out_same, "validation")] == val
    assert [r["extra_info"]["original_problem"] for r in rows_of(out_other, "validation")] != val


def test_decontamination(tmp_path, write_jsonl):
    aime = [json.loads(line) for line in EVAL_SETS["aime24"].paths()[0].read_text().splitlines()]
    stock = "The probability can be written as $\\frac{m}{n}$, where $m$ and $n$ are relatively prime positive integers. Find $m+n$."
    rows = [
        {"problem": aime[0]["problem"], "answer": aime[0]["answer"]},  # a copy
        {"problem": "  " + aime[1]["problem"].upper() + " Show your work.", "answer": aime[1]["answer"]},  # same words
        {"problem": "Two fair dice are rolled. What is the probability that the sum is 7? " + stock, "answer": "7"},
        {"problem": "compute $99^2 + 99 + 1$ in your head", "answer": "9901"},  # a short MATH-500 problem: whole text
        {"problem": "Compute $98^2+98+1$ in your head.", "answer": "9703"},
    ]
    write_jsonl(tmp_path / "c.jsonl", rows)
    report, out = prepare(tmp_path, [tmp_path / "c.jsonl"], decontaminate=["aime24", "aime25", "math500"])
    assert report["contaminated"] == {"aime24": 2, "aime25": 0, "math500": 1}
    kept = sorted(r["reward_model"]["ground_truth"] for r in rows_of(out) + rows_of(out, "validation"))
    assert kept == ["7", "9703"]
    # an evaluation set given as a path
    write_jsonl(tmp_path / "ev.jsonl", [{"question": "Two fair dice are rolled. What is the probability that the sum is 7? " + stock}])
    report, _ = prepare(tmp_path, [tmp_path / "c.jsonl"], name="out2", decontaminate=[str(tmp_path / "ev.jsonl")])
    assert report["contaminated"] == {"ev": 1}


def test_eval_index_ignores_stock_phrases():
    from reasonrl.data.decontaminate import EvalIndex

    stock = "can be written as m/n where m and n are relatively prime positive integers. Find m+n."
    index = EvalIndex(n=5)
    index.add("ev", [f"Problem number {i} is about {w} things and {stock}" for i, w in enumerate(["red", "blue", "green"])])
    index.add("ev2", ["A frog jumps along the number line from zero to ten in unit steps; count the paths."])
    assert index.match("A new question about dogs that " + stock) is None  # shared by 3 eval problems: ignored
    assert index.match("problem number 1 is about blue things and " + stock) == "ev"
    assert index.match("Hint: a frog jumps along the number line from zero to ten in unit steps; count the paths!") == "ev2"
    assert index.sizes == {"ev": 3, "ev2": 1}


# --- outputs and errors -------------------------------------------------------------------------


def test_manifest_load_prepared_and_overwrite(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "s.jsonl", SMALL)
    report, out = prepare(tmp_path, [tmp_path / "s.jsonl"])
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["stage"] == "prepare-data" and manifest["config"]["inputs"] == [str(tmp_path / "s.jsonl")]
    assert (out / MANIFEST).stat().st_mtime_ns >= max((out / f).stat().st_mtime_ns for f in ("train.parquet", "validation.parquet", "report.json"))
    before = {f.name: f.read_bytes() for f in out.iterdir() if f.name != LOCK}  # (the lock file holds the last holder's PID)
    with pytest.raises(ReasonRLError, match="already holds a finished artifact: pass --overwrite"):
        prepare(tmp_path, [tmp_path / "s.jsonl"])
    # a failing run leaves a finished output untouched
    with pytest.raises(ReasonRLError):
        prepare(tmp_path, [tmp_path / "missing.jsonl"], overwrite=True)
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.name != LOCK} == before
    report2, _ = prepare(tmp_path, [tmp_path / "s.jsonl"], overwrite=True, template="none")
    assert rows_of(out)[0]["prompt"][0]["content"] == rows_of(out)[0]["extra_info"]["raw_problem"]


def test_load_prepared_errors(tmp_path):
    with pytest.raises(MissingArtifactError, match="run `reasonrl prepare-data` first"):
        load_prepared(tmp_path / "nothing")
    (tmp_path / "half").mkdir()
    with pytest.raises(MissingArtifactError, match="reasonrl prepare-data"):
        load_prepared(tmp_path / "half")
    with pytest.raises(ReasonRLError, match="split must be one of"):
        load_prepared(tmp_path, "test")


def test_load_prepared_reads_a_verl_parquet_file(shared):
    rows = load_prepared(shared / "aime-2024.dapo.parquet")
    assert len(rows) == 960 and rows[0]["reward_model"]["ground_truth"] == "540"


BROKEN = [
    ("broken_json", b'{"problem": "P1", "answer": "1"}\n{"problem": "P2", "answer": \n{"problem": "P3", "answer": "3"}\n', "line 2: not valid JSON"),
    ("missing_answer", b'{"problem": "P1", "answer": "1"}\n{"problem": "P2"}\n{"problem": "P3", "answer": "3"}\n', "line 2: no answer field"),
    ("not_utf8", b'{"problem": "P1", "answer": "1"}\n{"problem": "P\xff\xfe2", "answer": "2"}\n{"problem": "P3", "answer": "3"}\n', "line 2: not UTF-8"),
]


@pytest.mark.parametrize("name, content, message", BROKEN, ids=[b[0] for b in BROKEN])
def test_malformed_rows_stop_with_file_and_line(tmp_path, name, content, message):
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(content)
    with pytest.raises(ReasonRLError) as err:
        prepare(tmp_path, [path])
    text = str(err.value)
    assert "\n" not in text and str(path) in text and message in text and "--skip-bad-rows" in text
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.parametrize("name, content, message", BROKEN, ids=[b[0] for b in BROKEN])
def test_malformed_rows_are_skipped_on_request(tmp_path, name, content, message):
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(content)
    report, out = prepare(tmp_path, [path], skip_bad_rows=True)
    assert report["bad_rows_skipped"] == 1
    (bad,) = report["bad_rows"]
    assert bad["file"] == str(path) and bad["where"] == "line 2" and message.split(": ", 1)[1] in bad["error"]
    assert report["rows_read"] == 3 and report["kept_unchanged"] == 2 and report["kept"] == 2


def test_input_errors(tmp_path):
    with pytest.raises(ReasonRLError, match=r"input .*nope\.jsonl not found: pass an existing"):
        prepare(tmp_path, [tmp_path / "nope.jsonl"])
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ReasonRLError, match="0 rows read from .*empty.jsonl"):
        prepare(tmp_path, [tmp_path / "empty.jsonl"])
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ReasonRLError, match="unknown format"):
        prepare(tmp_path, [tmp_path / "x.csv"])
    (tmp_path / "bad.json").write_text('[{"problem": "P", "answer": "1"},\n oops]')
    with pytest.raises(ReasonRLError, match=r"bad\.json line 2: not valid JSON"):
        prepare(tmp_path, [tmp_path / "bad.json"])
    with pytest.raises(ReasonRLError, match="decontamination set nowhere.jsonl not found"):
        prepare(tmp_path, [tmp_path / "empty.jsonl"], decontaminate=["nowhere.jsonl"])


def test_config_validation_and_docs():
    for kw, msg in [
        ({"inputs": []}, "inputs is empty"),
        ({"template": "chatml"}, "template must be one of dapo, boxed, none"),
        ({"val_fraction": 1.5}, "val_fraction must be in"),
        ({"ngram": 0}, "ngram must be"),
        ({"max_rows": 0}, "max_rows must be"),
    ]:
        with pytest.raises(ReasonRLError, match=msg):
            PrepareConfig(**{"inputs": ["a.jsonl"], **kw})
    assert all(f.metadata.get("help") for f in dataclasses.fields(PrepareConfig))
    cfg = build_config(PrepareConfig, {"inputs": "a.jsonl, b.parquet", "val_size": "3", "max_rows": "none", "integerize": "false", "decontaminate": ""})
    assert (cfg.inputs, cfg.val_size, cfg.max_rows, cfg.integerize, cfg.decontaminate) == (["a.jsonl", "b.parquet"], 3, None, False, [])
    assert PrepareConfig(inputs=["a"]).decontaminate == ["aime24", "aime25", "math500"]
    assert all(p.is_file() for s in EVAL_SETS.values() for p in s.paths())


def test_print_report(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "s.jsonl", SMALL)
    report, _ = prepare(tmp_path, [tmp_path / "s.jsonl"])
    console = Console(record=True, width=160)
    print_report(report, console)
    text = console.export_text()
    for needle in ("rows read", "fraction", "tuple", "sample rewrites", "\\frac{1}{2}"):
        assert needle in text


def test_rewriter_hook_reaches_the_rows(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "s.jsonl", SMALL)
    report = run_prepare(
        PrepareConfig(inputs=[str(tmp_path / "s.jsonl")], out=str(tmp_path / "out"), decontaminate=[], val_fraction=0),
        rewriter=lambda problem, rule, sentence: f"({rule}) Give m+n.",
    )
    assert report["rewriter"] is True
    half = next(r for r in load_prepared(tmp_path / "out") if r["extra_info"]["rule"] == "fraction")
    assert half["extra_info"]["raw_problem"].endswith("(fraction) Give m+n.") and half["reward_model"]["ground_truth"] == "3"


def test_a_json_error_names_the_file_line_and_column(tmp_path):
    """Issue 40 item 19: a raw tab in a string read "not valid JSON (Invalid control character at, column 29)"."""
    line = '{"problem": "What is 1 +\t1?", "answer": "2"}'
    assert line.index("\t") + 1 == 25
    for name, content, where in (("t.jsonl", '{"problem": "P1", "answer": "1"}\n' + line + "\n", "line 2"), ("t.json", "[\n" + line + "\n]", "line 2")):
        path = tmp_path / name
        path.write_text(content)
        with pytest.raises(ReasonRLError) as err:
            prepare(tmp_path, [path])
        text = str(err.value)
        assert f"{path} {where}: not valid JSON: invalid control character at column 25 (a raw tab or line break inside a string: write it as \\t or \\n)" in text, text
        assert "at," not in text and "at)" not in text


def test_answers_with_control_characters_emoji_or_bidi_controls_are_dropped(tmp_path):
    """Issue 40 item 19: the ground truths prepare-data drops as unreadable (a NUL, an emoji, a right-to-left override that
    shows '81' as '18'), with --keep-non-integer too, by the check `eval file` shares (reasonrl.data.readers.answer_flaw)."""
    from reasonrl.data.readers import answer_flaw

    bad = {"\x00": "U+0000", "😀": "U+1F600", "\u202e81": "U+202E", "4\u200b2": "U+200B"}
    for answer, code in bad.items():
        assert code in (answer_flaw(answer) or ""), answer
    for fine in ("42", "\\frac{1}{2}", "90°", "x^2 + 1", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "(1,\n2)", "π", "√2", "½"):
        assert answer_flaw(fine) is None, fine
    rows = [{"problem": f"Problem {i}?", "answer": a} for i, a in enumerate([*bad, "7"])]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for keep in (False, True):
        report, out = prepare(tmp_path, [tmp_path / "a.jsonl"], name=f"o{keep}", val_fraction=0.0, keep_non_integer=keep)
        assert report["dropped"] == {"bad_characters": 4} and report["kept"] == 1, report["dropped"]
        assert [r["reward_model"]["ground_truth"] for r in rows_of(out)] == ["7"]
