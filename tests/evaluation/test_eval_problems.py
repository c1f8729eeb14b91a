"""Replicated rows of an evaluation set merge into one problem; a conflicting answer is an error."""

from __future__ import annotations

import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.evaluation.problems import merge_replicas


def row(problem: str, truth: str, source: str = "s") -> dict:
    return {"prompt": [{"role": "user", "content": problem}], "reward_model": {"ground_truth": truth}, "data_source": source}


def test_replicas_merge_in_order_of_first_row() -> None:
    rows = [row("A", "1"), row("B", "2"), row("A", "1"), row("C", "3"), row("A", "01"), row("B", "2"), row("D", "1")]
    p = merge_replicas(rows)
    assert [r["prompt"][0]["content"] for r in p.rows] == ["A", "B", "C", "D"]
    assert p.rows[0] is rows[0]  # the first row of each problem is kept
    assert p.copies == [3, 2, 1, 1]  # "01" is the integer 1: the same ground truth
    assert (p.total_rows, p.merged_rows) == (7, 3)
    assert p.rows_per_problem() == {"1": 2, "2": 1, "3": 1}


def test_same_text_under_another_template_is_another_prompt() -> None:
    two_turns = {**row("A", "1"), "prompt": [{"role": "user", "content": "A"}, {"role": "user", "content": "A"}]}
    assert len(merge_replicas([row("A", "1"), two_turns]).rows) == 2


def test_same_prompt_with_another_answer_names_both_rows() -> None:
    rows = [row("A", "1"), row("B", "2"), row("A", "7")]
    with pytest.raises(ReasonRLError, match=r"^f.parquet row 1 and f.parquet row 3 have the same prompt but different ground truths \('1' vs '7'\)"):
        merge_replicas(rows, [f"f.parquet row {i}" for i in (1, 2, 3)])
    with pytest.raises(ReasonRLError, match="^row 1 and row 3 "):
        merge_replicas(rows)
