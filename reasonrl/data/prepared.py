"""Reading a prepare-data output (or any verl-format RL parquet), its columns checked.

Every row needs ``prompt``: the chat messages, a list of ``{role, content}`` (text) dicts (or the
prompt as one text), and ``reward_model.ground_truth``: the answer, a non-empty text (or an
integer). A file that lacks a column, or a row whose value has another type, or an empty ground
truth (every reward of that prompt would be -1), is a one-line error naming the file, the first bad
row and the fix, before anything is trained or sampled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reasonrl.artifacts import read_manifest
from reasonrl.config import check
from reasonrl.errors import MissingArtifactError, ReasonRLError

STAGE = "prepare-data"
SPLITS = ("train", "validation")
VERL_SCHEMA = "prompt = a list of {role, content} messages and reward_model = {ground_truth: the answer as text}"


def ground_truth(row: dict[str, Any]) -> str:
    """A verl-format row's answer (``reward_model.ground_truth``; a plain row's ``answer``)."""
    rm = row.get("reward_model") or {}
    return str(rm.get("ground_truth", row.get("answer", "")))


def load_prepared(path: str | Path, split: str = "train") -> list[dict[str, Any]]:
    """The rows of a prepare-data output (``split`` is "train" or "validation"), verl-format dicts.

    ``path`` is the stage's output directory (it must hold a manifest), or a verl-format
    ``.parquet`` file made elsewhere (DAPO-Math-17k, for instance).
    """

    check(split in SPLITS, f"split must be one of {', '.join(SPLITS)}, got '{split}'")
    p = Path(path)
    if p.is_file() and p.suffix == ".parquet":
        return _read(p, "with a valid verl-format parquet file", f"a verl RL parquet holds {VERL_SCHEMA}; or run `reasonrl prepare-data {p}` and pass its output")
    if not p.exists():
        raise MissingArtifactError(f"{p} not found: run `reasonrl prepare-data` first")
    read_manifest(p, stage=STAGE, hint="reasonrl prepare-data")
    f = p / f"{split}.parquet"
    if not f.is_file():
        raise MissingArtifactError(f"{f} not found: run `reasonrl prepare-data` again")
    return _read(f, "`reasonrl prepare-data` again", "run `reasonrl prepare-data` again")


def _read(path: Path, fix: str, bad_rows_fix: str) -> list[dict[str, Any]]:
    """A parquet file's rows; a truncated or corrupt file is a one-line error (even behind a
    manifest), and so is a missing column or a bad row (:func:`row_problem`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
        rows = table.to_pylist()
    except (pa.ArrowException, OSError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:160]
        raise ReasonRLError(f"{path} is not a readable parquet file ({first}): run {fix}") from None
    missing = [c for c in ("prompt", "reward_model") if c not in table.column_names]
    if missing and rows:
        raise ReasonRLError(f"{path} has no '{missing[0]}' column (its columns: {', '.join(table.column_names) or 'none'}): {bad_rows_fix}")
    bad = [(i, problem) for i, row in enumerate(rows, start=1) if (problem := row_problem(row)) is not None]
    if bad:
        (first, problem), more = bad[0], (f"; {len(bad)} of {len(rows)} rows are bad" if len(bad) > 1 else "")
        raise ReasonRLError(f"{path} row {first}: {problem}{more}: {bad_rows_fix}")
    return rows


def row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with a verl-format row (None: nothing): ``prompt`` must be a non-empty list of
    ``{role, content}`` text messages (or a non-empty text), ``reward_model.ground_truth`` a
    non-empty text (or an integer)."""
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        if not prompt.strip():
            return "prompt is empty"
    elif not isinstance(prompt, list):
        return f"prompt is {_kind(prompt)}, not a list of {{role, content}} messages"
    elif not prompt:
        return "prompt is an empty list of messages"
    else:
        for j, m in enumerate(prompt, start=1):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                what = _kind(m) if not isinstance(m, dict) else f"{{{', '.join(f'{k}: {_kind(v)}' for k, v in m.items())}}}"
                return f"prompt message {j} is {what}, not {{role: text, content: text}}"
    rm = row.get("reward_model")
    if not isinstance(rm, dict):
        return f"reward_model is {_kind(rm)}, not {{ground_truth: text}}"
    if "ground_truth" not in rm:
        return f"reward_model has no ground_truth (its keys: {', '.join(rm) or 'none'})"
    truth = rm["ground_truth"]
    if isinstance(truth, bool) or not isinstance(truth, (str, int)):
        return f"reward_model.ground_truth is {_kind(truth)}, not the answer as text"
    if not str(truth).strip():
        return "reward_model.ground_truth is empty (every response would get reward -1)"
    return None


def _kind(v: Any) -> str:
    """A value's kind for messages: ``None``, ``a list``, ``a float (1.5)``."""
    if v is None:
        return "null"
    name = type(v).__name__
    shown = f" ({v!r})" if isinstance(v, (int, float)) else ""
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}{shown}"
