"""Reading a prepare-data output (or any verl-format RL parquet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reasonrl.artifacts import read_manifest
from reasonrl.config import check
from reasonrl.errors import MissingArtifactError, ReasonRLError

STAGE = "prepare-data"
SPLITS = ("train", "validation")


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
        return _read(p, "with a valid verl-format parquet file")
    if not p.exists():
        raise MissingArtifactError(f"{p} not found: run `reasonrl prepare-data` first")
    read_manifest(p, stage=STAGE, hint="reasonrl prepare-data")
    f = p / f"{split}.parquet"
    if not f.is_file():
        raise MissingArtifactError(f"{f} not found: run `reasonrl prepare-data` again")
    return _read(f, "`reasonrl prepare-data` again")


def _read(path: Path, fix: str) -> list[dict[str, Any]]:
    """A parquet file's rows; a truncated or corrupt file is a one-line error (even behind a manifest)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:160]
        raise ReasonRLError(f"{path} is not a readable parquet file ({first}): run {fix}") from None
