"""Reading prepared data and verl RL parquet files: every column and row checked on load (issue 20,
item 13), a one-line error naming the file, the row and the fix."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reasonrl.data import load_prepared
from reasonrl.errors import ReasonRLError

MSG = [{"role": "user", "content": "What is 1 + 1?"}]
RM = {"ground_truth": "2", "style": "rule"}


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("row,needles", [
    ({"prompt": MSG, "data_source": "x"}, ["no 'reward_model' column (its columns: prompt, data_source)"]),
    ({"reward_model": RM}, ["no 'prompt' column (its columns: reward_model)"]),
    ({"prompt": 5, "reward_model": RM}, ["row 1: prompt is an int (5), not a list of {role, content} messages"]),
    ({"prompt": ["What is 1 + 1?"], "reward_model": RM}, ["row 1: prompt message 1 is a str, not {role: text, content: text}"]),
    ({"prompt": [{"role": "user"}], "reward_model": RM}, ["prompt message 1 is {role: a str}"]),
    ({"prompt": [], "reward_model": RM}, ["prompt is an empty list"]),
    ({"prompt": MSG, "reward_model": "2"}, ["reward_model is a str, not {ground_truth: text}"]),
    ({"prompt": MSG, "reward_model": {"style": "rule"}}, ["reward_model has no ground_truth (its keys: style)"]),
    ({"prompt": MSG, "reward_model": {"ground_truth": ""}}, ["reward_model.ground_truth is empty"]),
    ({"prompt": MSG, "reward_model": {"ground_truth": 2.5}}, ["reward_model.ground_truth is a float (2.5)"]),
])
def test_a_verl_parquet_with_a_bad_column_is_one_line(tmp_path, row, needles):
    f = _parquet(tmp_path / "rl.parquet", [row])
    with pytest.raises(ReasonRLError) as e:
        load_prepared(f)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(f)), msg
    for n in [*needles, "reward_model = {ground_truth: the answer as text}", f"reasonrl prepare-data {f}"]:
        assert n in msg, msg


def test_the_first_bad_row_and_the_count_are_named(tmp_path):
    good = {"prompt": MSG, "reward_model": RM}
    f = _parquet(tmp_path / "rl.parquet", [good, {**good, "reward_model": {"ground_truth": " "}}, good,
                                           {**good, "reward_model": {"ground_truth": ""}}])
    with pytest.raises(ReasonRLError, match=r"row 2: reward_model.ground_truth is empty .*; 2 of 4 rows are bad"):
        load_prepared(f)


def test_good_rows_load(tmp_path):
    for i, rows in enumerate([[{"prompt": MSG, "reward_model": RM}], [{"prompt": "What is 2 + 2?", "reward_model": {"ground_truth": 4}}]]):
        assert load_prepared(_parquet(tmp_path / f"rl{i}.parquet", rows)) == rows


def test_a_prepared_directory_with_a_bad_split_names_prepare_data(prepared, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    rows = pq.read_table(data / "train.parquet").to_pylist()
    rows[3]["reward_model"]["ground_truth"] = ""
    pq.write_table(pa.Table.from_pylist(rows), data / "train.parquet")
    with pytest.raises(ReasonRLError, match=r"train.parquet row 4: reward_model.ground_truth is empty .*: run `reasonrl prepare-data` again"):
        load_prepared(data)
