"""The evaluation-set registry: ``reasonrl eval NAME`` and ``prepare-data``'s decontamination read
the same table. A new set is one row here plus its file(s) in the top-level ``data/``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reasonrl.bundled import bundled
from reasonrl.errors import ReasonRLError


@dataclass(frozen=True)
class EvalSet:
    description: str
    files: tuple[str, ...]  # under data/ (the package reasonrl.bundled)

    def paths(self) -> list[Path]:
        """The set's files; a missing one is an error that says how to restore it."""
        paths = [bundled(f) for f in self.files]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise ReasonRLError(f"bundled eval data missing ({', '.join(missing)}): reinstall reasonrl (pip install .)")
        return paths


EVAL_SETS: dict[str, EvalSet] = {
    "aime": EvalSet("AIME 2024 + AIME 2025 (60 problems)", ("aime24.jsonl", "aime25.jsonl")),
    "aime24": EvalSet("AIME 2024 (30 problems)", ("aime24.jsonl",)),
    "aime25": EvalSet("AIME 2025 (30 problems)", ("aime25.jsonl",)),
    "gsm8k": EvalSet("the GSM8K test set (1319 problems)", ("gsm8k_test.jsonl",)),
    "math500": EvalSet("MATH-500 (500 problems; non-integer answers through math-verify)", ("math500.jsonl",)),
}
"""name → bundled evaluation set."""
