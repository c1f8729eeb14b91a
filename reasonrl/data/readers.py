"""Reading math data sets: jsonl, json, parquet (plain or verl's RL format), saved datasets and hub
datasets (``hf:ORG/NAME[:CONFIG][@SPLIT]``: :func:`hub_data_file`).

:func:`read_records` yields every record of the inputs with where it came from (file and line or
row). :func:`extract_fields` maps one record to ``(problem, answer)``:

* problem: ``--problem-field``, else ``problem`` / ``question`` / ``prompt`` (OlympiadBench's
  ``context`` is put before its ``question``); in verl's RL format (``prompt`` is a list of chat
  messages) the user message with its prompt template stripped (``extra_info.raw_problem`` when the
  template is unknown).
* answer: ``--answer-field``, else ``answer`` (GSM8K: the text after the last ``####``),
  ``final_answer`` (OlympiadBench: a list of LaTeX strings), ``reward_model.ground_truth`` (verl),
  ``ground_truth``, or the last ``\\boxed{}`` of ``solution`` (Minerva).

A record that cannot be read at all (broken JSON, non-UTF-8 bytes, no problem or answer field)
is a *bad row*: :class:`BadRow` names its file and line.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from reasonrl.answers import braced
from reasonrl.data.templates import strip_template
from reasonrl.errors import ReasonRLError

SUFFIXES = (".jsonl", ".json", ".parquet")
PROBLEM_FIELDS = ("problem", "question", "prompt")
ANSWER_FIELDS = ("answer", "final_answer", "reward_model.ground_truth", "ground_truth", "solution")


class BadRow(Exception):
    """One unreadable record; ``str()`` is ``"<file> line <n>: <what is wrong>"``."""

    def __init__(self, source: str, where: str, error: str):
        self.source, self.where, self.error = source, where, error
        super().__init__(f"{source} {where}: {error}")

    def as_dict(self) -> dict[str, str]:
        return {"file": self.source, "where": self.where, "error": self.error}


@dataclass
class Record:
    """A record of an input file, with its position for messages (``line 7``, ``row 12``)."""

    source: str
    where: str
    data: dict[str, Any]


def input_files(path: str | Path) -> list[Path]:
    """The readable files (or saved dataset directories) an input path stands for; a hub dataset
    name ``hf:ORG/NAME[:CONFIG][@SPLIT]`` stands for its split, as a parquet file (:func:`hub_data_file`)."""
    from reasonrl.models.hub import is_hub_data

    if is_hub_data(path) and not Path(path).exists():
        return [hub_data_file(str(path))]
    p = Path(path)
    if not p.exists():
        raise ReasonRLError(f"input {p} not found: pass an existing .jsonl, .json or .parquet file, or a directory")
    if p.is_file():
        if p.suffix.lower() not in SUFFIXES:
            raise ReasonRLError(
                f"input {p} has an unknown format: pass a .jsonl, .json or .parquet file, or a directory saved with datasets' save_to_disk"
            )
        return [p]
    if _is_saved_dataset(p):
        return [p]
    files = sorted(q for q in p.rglob("*") if q.is_file() and q.suffix.lower() in SUFFIXES and not q.name.startswith("."))
    if not files:
        raise ReasonRLError(f"input directory {p} holds no .jsonl, .json or .parquet file nor a saved dataset: pass the data files")
    return files


def _datasets_cache() -> str | None:
    """datasets' cache as the environment says now (``HF_DATASETS_CACHE``, ``$HF_HOME/datasets``), else its default."""
    import os

    if os.environ.get("HF_DATASETS_CACHE"):
        return os.environ["HF_DATASETS_CACHE"]
    return str(Path(os.environ["HF_HOME"]) / "datasets") if os.environ.get("HF_HOME") else None


def hub_data_file(spec: str) -> Path:
    """The split a hub dataset name ``hf:ORG/NAME[:CONFIG][@SPLIT]`` names, as a parquet file.

    The repository's data files come through huggingface_hub's cache (``reasonrl.models.hub``:
    ``HF_HOME``, ``HF_HUB_OFFLINE``, ``HF_TOKEN``; its main branch), then ``datasets.load_dataset``
    reads them with CONFIG (default: the dataset's default); SPLIT defaults to ``train``, else the
    only split. The split is written once per commit, config and split under the reasonrl cache
    (``$REASONRL_CACHE/hub-data/ORG--NAME/COMMIT/CONFIG/SPLIT/NAME.parquet``, so rows are named
    ``NAME.parquet row N`` and ``data_source`` defaults to NAME); the commit, config, split and the
    dataset's fingerprint are recorded for the manifest (``reasonrl.models.hub.manifest_records``).
    """
    import os

    from reasonrl.console import error_line, library_bars
    from reasonrl.models.hub import DATA_FILES, hub_snapshot, record_resolved, resolved, split_hub_data
    from reasonrl.models.loading import cache_dir

    repo_id, config, split = split_hub_data(spec)
    snap = hub_snapshot(repo_id, None, repo_type="dataset", allow_patterns=DATA_FILES, what=f"dataset {spec}",
                        local_hint="pass a local data file")
    org, name = repo_id.split("/")
    folder = cache_dir() / "hub-data" / f"{org}--{name}" / snap.name / (config or "default")
    known = resolved(spec)
    if known and known.get("commit") == snap.name and known["path"] == str(folder / known["split"] / f"{name}.parquet") and Path(known["path"]).is_file():
        return Path(known["path"])  # (resolved already in this process, at the same commit, into this cache)
    import datasets

    if not library_bars():  # (quiet: the libraries' bars are off unless --verbose, reasonrl.console)
        datasets.disable_progress_bars()
    try:
        loaded = datasets.load_dataset(str(snap), config, cache_dir=_datasets_cache())
    except ValueError as e:  # an unknown config, or files it cannot read
        raise ReasonRLError(f"dataset {spec}: {error_line(e, 200)}: pass one of its configs as hf:{repo_id}:CONFIG, or a local data file") from None
    except Exception as e:  # noqa: BLE001 - datasets raises many types for unreadable repositories
        raise ReasonRLError(f"dataset {spec}: datasets.load_dataset cannot read {repo_id} ({error_line(e, 200)}): pass a local data file") from None
    splits = list(loaded)
    chosen = split or ("train" if "train" in splits else splits[0] if len(splits) == 1 else None)
    if chosen not in splits:
        raise ReasonRLError(f"dataset {spec}: " + (f"no split '{split}'" if split else "no 'train' split") +
                            f" (its splits: {', '.join(splits) or 'none'}): name one as hf:{repo_id}{':' + config if config else ''}@SPLIT")
    ds = loaded[chosen]
    out = folder / chosen / f"{name}.parquet"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            ds.to_parquet(str(tmp))
            os.replace(tmp, out)  # (whole or not at all; two processes write the same rows)
        finally:
            tmp.unlink(missing_ok=True)
    record_resolved(spec, {"kind": "dataset", "repo_id": repo_id, "commit": snap.name, "config": config or "default", "split": chosen,
                           "fingerprint": getattr(ds, "_fingerprint", None), "rows": len(ds), "path": str(out)})
    return out


def _is_saved_dataset(p: Path) -> bool:
    return p.is_dir() and ((p / "dataset_dict.json").is_file() or (p / "state.json").is_file())


def read_records(path: Path, *, skip_bad_rows: bool, bad: list[BadRow]) -> Iterator[Record]:
    """Every record of one file or saved dataset; unreadable ones raise, or go to ``bad`` when skipping."""
    if path.is_dir():
        yield from _read_saved(path)
    elif path.suffix.lower() == ".jsonl":
        yield from _read_jsonl(path, skip_bad_rows=skip_bad_rows, bad=bad)
    elif path.suffix.lower() == ".json":
        yield from _read_json(path)
    else:
        yield from _read_parquet(path)


def json_why(e: json.JSONDecodeError) -> str:
    """What is wrong with a JSON line, and where on it: ``json``'s message ("Invalid control
    character at") made a phrase ("invalid control character at column 29"), with the fix for the
    commonest case (a raw tab or line break inside a string)."""
    msg = e.msg[:1].lower() + e.msg[1:]
    msg = msg.removesuffix(" at") + f" at column {e.colno}"
    if e.msg.startswith("Invalid control character"):
        msg += " (a raw tab or line break inside a string: write it as \\t or \\n)"
    return msg


#: Characters no answer holds: emoji and pictographs (U+1F000–U+1FAFF, U+2600–U+27BF), the emoji
#: variation selector and the combining keycap.
_EMOJI = ((0x1F000, 0x1FAFF), (0x2600, 0x27BF), (0xFE0F, 0xFE0F), (0x20E3, 0x20E3))


def answer_flaw(answer: str) -> str | None:
    """Why ``answer`` cannot be a ground truth, or None: a control character (other than a tab or a
    line break), an invisible or bidirectional formatting character (U+202E shows "81" as "18"), a
    surrogate, private-use or unassigned code point, or an emoji. `prepare-data` drops such rows
    (counted as ``bad_characters``) and `eval` skips them (counted), by this one check."""
    import unicodedata

    for ch in answer:
        if ch in "\t\n\r":
            continue
        cat, code = unicodedata.category(ch), ord(ch)
        what = {"Cc": "a control character", "Cf": "an invisible or bidirectional formatting character", "Cs": "a lone surrogate",
                "Co": "a private-use character", "Cn": "an unassigned code point"}.get(cat)
        if what is None and any(lo <= code <= hi for lo, hi in _EMOJI):
            what = "an emoji"
        if what is not None:
            return f"the answer holds {what} (U+{code:04X})"
    return None


def _skip_hint() -> str:
    return "fix that line or pass --skip-bad-rows to skip bad rows"


def _read_jsonl(path: Path, *, skip_bad_rows: bool, bad: list[BadRow]) -> Iterator[Record]:
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            err: str | None = None
            data: Any = None
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                err = f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
            else:
                if not text.strip():
                    continue
                try:
                    data = json.loads(text)
                except json.JSONDecodeError as e:
                    err = f"not valid JSON: {json_why(e)}"
                else:
                    if not isinstance(data, dict):
                        err = f"not a JSON object (a {type(data).__name__})"
            if err is not None:
                row = BadRow(str(path), f"line {lineno}", err)
                if not skip_bad_rows:
                    raise ReasonRLError(f"{row}: {_skip_hint()}")
                bad.append(row)
                continue
            yield Record(str(path), f"line {lineno}", data)


def _read_json(path: Path) -> Iterator[Record]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ReasonRLError(
            f"{path} line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x}): re-encode the file as UTF-8 (a .json file cannot be read in part; --skip-bad-rows skips rows of .jsonl files)"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReasonRLError(
            f"{path} line {e.lineno}: not valid JSON: {json_why(e)}: fix the file (a .json file cannot be read in part; --skip-bad-rows skips rows of .jsonl files)"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise ReasonRLError(f"{path}: expected a JSON list of records or {{\"data\": [...]}}: convert it, or use .jsonl")
    for i, item in enumerate(data, start=1):
        yield Record(str(path), f"item {i}", item if isinstance(item, dict) else {"__not_object__": item})


def _read_parquet(path: Path) -> Iterator[Record]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for bad files
        raise ReasonRLError(f"{path}: cannot read it as parquet ({str(e).splitlines()[0][:200]}): pass a valid .parquet file") from None
    row = 0
    for batch in pf.iter_batches(batch_size=1024):
        for item in batch.to_pylist():
            row += 1
            yield Record(str(path), f"row {row}", item)


def _read_saved(path: Path) -> Iterator[Record]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001
        raise ReasonRLError(f"{path}: cannot load the saved dataset ({str(e).splitlines()[0][:200]}): pass a directory written by save_to_disk") from None
    splits = ds.items() if isinstance(ds, datasets.DatasetDict) else [(None, ds)]
    for split, part in splits:
        for i, item in enumerate(part, start=1):
            yield Record(str(path), f"{split} row {i}" if split else f"row {i}", dict(item))


# ---------------------------------------------------------------------------------------------
# Field mapping
# ---------------------------------------------------------------------------------------------


def field_names(data: dict[str, Any], limit: int = 20) -> str:
    """The fields of a record for messages: its keys, and ``key.sub`` for a nested record's keys."""
    names = [n for k, v in data.items() for n in ([k] + ([f"{k}.{s}" for s in v] if isinstance(v, dict) else []))]
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "") if names else "none"


def _get(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    cur: Any = data
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``) in ``text``."""
    matches = list(re.finditer(r"\\(?:boxed|fbox)(?![a-zA-Z])", text))
    if not matches:
        return None
    i = matches[-1].end()
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        group = braced(text, i)
        return group[0] if group is not None else None
    token = re.match(r"[^\s$]+", text[i:])
    return token.group(0) if token else None


def _chat_problem(messages: list[Any], data: dict[str, Any]) -> str | None:
    user = [m for m in messages if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)]
    if not user:
        return None
    content = user[-1]["content"]
    raw = strip_template(content)
    if raw is not None:
        return raw
    found, extra = _get(data, "extra_info.raw_problem")
    if found and isinstance(extra, str) and extra.strip():
        return extra
    return content


@dataclass
class Fields:
    problem: str
    answer: Any  # a string, a number, a list (OlympiadBench) or None
    answer_field: str
    data_source: str | None


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class NoAnswer(Exception):
    """The record has an answer field, but no answer in it (a solution without ``\\boxed{}``)."""


def extract_fields(rec: Record, *, problem_field: str | None = None, answer_field: str | None = None) -> Fields:
    """Map a record to its problem and answer; raises :class:`BadRow` when a field is missing."""
    data = rec.data
    if "__not_object__" in data:
        raise BadRow(rec.source, rec.where, f"not a JSON object (a {type(data['__not_object__']).__name__})")
    problem: Any = None
    if problem_field:
        found, problem = _get(data, problem_field)
        if not found:
            raise BadRow(rec.source, rec.where, f"no '{problem_field}' field (from --problem-field; its fields: {field_names(data)})")
    else:
        for name in PROBLEM_FIELDS:
            if name in data and data[name] is not None:
                problem = data[name]
                break
        else:
            raise BadRow(rec.source, rec.where, f"no problem field (looked for {', '.join(PROBLEM_FIELDS)}; its fields: {field_names(data)}); "
                                                "pass --problem-field NAME")
    if isinstance(problem, list):  # verl's chat messages
        problem = _chat_problem(problem, data)
    if not isinstance(problem, str) or not problem.strip():
        raise BadRow(rec.source, rec.where, "the problem is empty or not text")
    if not _valid_unicode(problem):
        raise BadRow(rec.source, rec.where, "the problem is not valid Unicode (a lone surrogate such as \\ud800): fix the text")
    context = data.get("context") if not problem_field else None
    if isinstance(context, str) and context.strip() and context.strip() not in problem:
        problem = context.strip() + "\n\n" + problem

    names = (answer_field,) if answer_field else ANSWER_FIELDS
    for name in names:
        found, answer = _get(data, name)
        if found:
            break
    else:
        if answer_field:
            raise BadRow(rec.source, rec.where, f"no '{answer_field}' field (from --answer-field; its fields: {field_names(data)})")
        raise BadRow(rec.source, rec.where, f"no answer field (looked for {', '.join(ANSWER_FIELDS)}; its fields: {field_names(data)}); "
                                            "pass --answer-field NAME")
    if answer is None or (isinstance(answer, float) and not math.isfinite(answer)):
        raise NoAnswer(f"{name} is {answer!r}")
    if isinstance(answer, str) and not _valid_unicode(answer):
        raise BadRow(rec.source, rec.where, "the answer is not valid Unicode (a lone surrogate such as \\ud800): fix the text")
    if isinstance(answer, str):
        if "####" in answer:  # GSM8K: reasoning, then "#### N"
            answer = answer.rsplit("####", 1)[1].strip()
        elif name == "solution" or ("\\boxed" in answer and not answer.strip().startswith("\\boxed")):
            boxed = last_boxed(answer)
            if boxed is None:
                raise NoAnswer(f"{name} holds no \\boxed{{}} answer")
            answer = boxed
    source = data.get("data_source") if isinstance(data.get("data_source"), str) else None
    return Fields(problem, answer, name, source)
