"""Distinct problems of an evaluation set: replicated rows merged into one problem.

verl samples once per row, so evaluation files made for it list each problem many times (DAPO's
``aime-2024.parquet`` holds the 30 AIME 2024 problems 32 times each: 960 rows). ``reasonrl eval``
samples ``n`` responses per problem, so rows with the same prompt and the same ground truth are one
problem: its first row is kept and the others are counted. Sampling 32 per row instead would be
32× the work, and a bootstrap over 960 "problems" that are 30 gives intervals about √32 too narrow.
The same prompt with two different ground truths is an error naming both rows.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from reasonrl.answers import parse_integer
from reasonrl.errors import ReasonRLError
from reasonrl.data.prepared import ground_truth

__all__ = ["Problems", "merge_replicas"]


@dataclass
class Problems:
    """The distinct problems of a list of rows, in the order of their first row."""

    rows: list[dict[str, Any]]  # each problem's first row
    copies: list[int]  # how many rows each problem had

    @property
    def total_rows(self) -> int:
        return sum(self.copies)

    @property
    def merged_rows(self) -> int:
        """Rows merged into an earlier row of the same problem."""
        return self.total_rows - len(self.rows)

    def rows_per_problem(self) -> dict[str, int]:
        """Histogram: rows per problem → number of problems (``{"32": 30}`` for DAPO's AIME file)."""
        return {str(k): v for k, v in sorted(Counter(self.copies).items())}


def _prompt_key(row: dict[str, Any]) -> str:
    return json.dumps(row.get("prompt"), sort_keys=True, ensure_ascii=False, default=str)


def _truth_key(truth: str) -> str:
    as_int = parse_integer(truth)
    return str(as_int) if as_int is not None else truth.strip()


def merge_replicas(rows: Sequence[dict[str, Any]], where: Sequence[str] | None = None) -> Problems:
    """Merge rows with the same prompt (the chat messages the model sees) and ground truth (the
    same integer, or the same text) into one problem.

    ``where[i]`` names row i in the error raised when two rows share a prompt but not the ground
    truth (default "row i+1").
    """
    names = list(where) if where is not None else [f"row {i + 1}" for i in range(len(rows))]
    first: dict[str, int] = {}  # prompt → index of its problem
    kept: list[dict[str, Any]] = []
    kept_from: list[int] = []  # the row each problem came from
    copies: list[int] = []
    for i, row in enumerate(rows):
        key = _prompt_key(row)
        p = first.get(key)
        if p is None:
            first[key] = len(kept)
            kept.append(row)
            kept_from.append(i)
            copies.append(1)
            continue
        a, b = ground_truth(kept[p]), ground_truth(row)
        if _truth_key(a) != _truth_key(b):
            raise ReasonRLError(f"{names[kept_from[p]]} and {names[i]} have the same prompt but different ground truths "
                                f"({a[:40]!r} vs {b[:40]!r}): fix the dataset so that each problem has one answer")
        copies[p] += 1
    return Problems(kept, copies)
