"""What an evaluation reads: a bundled set (``EVAL_SETS``), a data file (or a folder of them), or a
prepare-data directory's validation split, as prompt rows in the prepared (verl) shape. Used by
``reasonrl eval`` and by training's validation (``train --val-data``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reasonrl.errors import ReasonRLError
from reasonrl.evaluation.sets import EVAL_SETS

__all__ = ["dataset_files", "is_prepared", "load_problems"]


def is_prepared(dataset: str) -> bool:
    """Whether ``dataset`` is a prepare-data directory (its validation split is what is evaluated)."""
    return dataset not in EVAL_SETS and (Path(dataset) / "validation.parquet").is_file()


def dataset_files(dataset: str) -> list[Path]:
    """The files a ``--dataset`` value reads: a bundled set's, a prepare-data directory's
    validation split, or a data file (a directory of them)."""
    from reasonrl.data.readers import input_files
    from reasonrl.models.hub import is_hub_data

    if dataset in EVAL_SETS:
        return EVAL_SETS[dataset].paths()
    p = Path(dataset)
    if is_hub_data(dataset) and not p.exists():  # hf:ORG/NAME[:CONFIG][@SPLIT] (reasonrl.data.readers.hub_data_file)
        return input_files(dataset)
    if is_prepared(dataset):
        return [p / "validation.parquet"]
    if not p.exists():
        raise ReasonRLError(f"dataset '{dataset}' not found: use one of {', '.join(EVAL_SETS)} or a data file path")
    return input_files(p)


def load_problems(dataset: str, template: str, *, problem_field: str | None = None, answer_field: str | None = None,
                  skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows in the prepared (verl) shape: prompt messages, reward_model.ground_truth, data_source,
    and ``extra_info.where`` (file and row, for messages). Replicated rows are kept: see
    :func:`reasonrl.evaluation.problems.merge_replicas`. ``problem_field`` / ``answer_field``
    name the fields of a data file's rows (default: found by name, ``reasonrl.data.readers``).
    A row whose ground truth `prepare-data` would drop (``reasonrl.data.readers.answer_flaw``: a
    control character, an emoji, …) is left out, and named in ``skipped``."""
    from reasonrl.data.readers import BadRow, NoAnswer, answer_flaw, extract_fields, read_records
    from reasonrl.data.templates import messages_for

    def usable(answer: str, where: str) -> bool:
        flaw = answer_flaw(answer)
        if flaw and skipped is not None:
            skipped.append(f"{where}: {flaw}")
        return flaw is None

    if is_prepared(dataset) and (problem_field or answer_field):
        raise ReasonRLError(f"--problem-field / --answer-field name the fields of a data file, but {dataset} is a prepare-data directory "
                            "(its rows have fixed fields): drop them, or pass the data file itself")
    if is_prepared(dataset):
        from reasonrl.data import load_prepared

        from reasonrl.data.prepared import ground_truth

        rows = load_prepared(dataset, "validation")
        for i, row in enumerate(rows, start=1):
            row["extra_info"] = {**(row.get("extra_info") or {}), "where": f"validation.parquet row {i}"}
        return [row for row in rows if usable(ground_truth(row), row["extra_info"]["where"])]
    rows = []
    for f in dataset_files(dataset):
        bad: list[BadRow] = []
        records = list(read_records(f, skip_bad_rows=True, bad=bad))
        if bad:  # (`eval` reads every row: no --skip-bad-rows)
            raise ReasonRLError(f"{bad[0]}: fix that line (an evaluation set is read whole)")
        for rec in records:
            try:
                fields = extract_fields(rec, problem_field=problem_field, answer_field=answer_field)
                if not str(fields.answer).strip():
                    raise NoAnswer(f"{fields.answer_field} is empty")
            except BadRow as e:
                raise ReasonRLError(f"{e}: every evaluation row needs a problem and an answer") from None
            except NoAnswer as e:
                raise ReasonRLError(f"{f.name} {rec.where}: {e}: every evaluation row needs an answer") from None
            if not usable(str(fields.answer), f"{f.name} {rec.where}"):
                continue
            rows.append({
                "prompt": messages_for(template, fields.problem),
                "reward_model": {"style": "rule", "ground_truth": str(fields.answer)},
                "data_source": f.stem,
                "extra_info": {"where": f"{f.name} {rec.where}"},
            })
    if not rows:
        raise ReasonRLError(f"dataset '{dataset}' has no rows" + (f" with a usable ground truth ({len(skipped)} skipped, e.g. {skipped[0]})" if skipped else ""))
    return rows
