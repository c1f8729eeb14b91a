"""`reasonrl prepare-data`: math data sets in, verl-format train/validation parquet out.

Steps: read the inputs (jsonl, json, parquet, verl RL parquet, saved ``datasets`` directories) ->
map fields to (problem, answer) -> make every answer an integer (:func:`integerize`; with
``integerize = false`` only rows whose answer is already an integer are kept) -> drop duplicate
problems -> drop problems that overlap an evaluation set (n-grams) -> apply the prompt template ->
split train/validation by seed -> write ``train.parquet``, ``validation.parquet``, ``report.json``
and ``manifest.json`` (last).

Output rows follow verl's RL format: ``data_source``, ``prompt`` (``[{"role": "user", "content"}]``),
``ability`` ("math"), ``reward_model`` (``{"style": "rule", "ground_truth": "<int>"}``) and
``extra_info`` (``index``, ``split``, ``raw_problem``, ``original_problem``, ``original_answer``,
``rule``, ``source``).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.artifacts import open_new, write_json, write_manifest
from reasonrl.config import check, check_seed, opt, to_dict
from reasonrl.data.decontaminate import EvalIndex, normalise_text
from reasonrl.data.prepared import SPLITS, STAGE
from reasonrl.data.transform import IntegerProblem, Rewriter, integerize
from reasonrl.data.readers import BadRow, NoAnswer, answer_flaw, extract_fields, input_files, read_records
from reasonrl.data.templates import ALL_TEMPLATES, messages_for
from reasonrl.errors import ReasonRLError
from reasonrl.evaluation.sets import EVAL_SETS
from reasonrl.interrupts import last_write
from reasonrl.progress import Display, open_bar
from reasonrl.rundir import RunDir, claim, releases_claims
from reasonrl.stages.options import ProgressOpts

MAX_BAD_ROWS_LISTED = 50


#: The rule of a row kept with its non-integer answer as written (--keep-non-integer).
NON_INTEGER = "non_integer"


@dataclass
class PrepareConfig(ProgressOpts):
    """Configuration of ``reasonrl prepare-data``."""

    inputs: list[str] = opt([], help="Math data to read: .jsonl/.json/.parquet files (verl RL parquet included), saved `datasets` directories, directories of such files, or hub datasets hf:ORG/NAME[:CONFIG][@SPLIT] (through datasets.load_dataset; default split: train).")
    out: str = opt("runs/data", help="Output directory for train.parquet, validation.parquet, report.json and manifest.json.")
    integerize: bool = opt(True, help="Rewrite problems whose answer is not an integer (m/n -> m+n, a*sqrt(b) -> a+b, ...; DAPO section 3.5); false keeps only rows whose answer already is an integer.")
    keep_non_integer: bool = opt(False, help="Keep rows whose answer is not an integer (with --integerize: that no rule can rewrite) with their problem and answer as written, "
                                 "for a reward plug-in (--reward FILE.py:FUNCTION, docs/rewards.md); counted as kept_non_integer in the report. Empty answers are still dropped.")
    template: str = opt("dapo", help="Prompt template: 'dapo' (SPEC.md's DAPO template, answer on an 'Answer:' line), 'boxed' (answer in \\boxed{}), 'none' (the raw problem), 'fewshot' / 'dapo-fewshot' (two worked 'Answer: N' examples as earlier chat turns, then the problem raw / in the DAPO template), or 'chains' / 'chains-direct' (for data/chains.jsonl: two addition chains as long as the problem, worked one addition a line / answered at once), 'chains-choice' (the first worked, the second answered at once: the form is the policy's choice) or 'chains-instruct' (an instruction alone, no examples).")
    val_fraction: float = opt(0.05, help="Fraction of the kept rows held out for validation (at least 1 row when > 0 and 2+ rows are kept); ignored when val_size is set.")
    val_size: int | None = opt(None, help="Exact number of validation rows (overrides val_fraction).")
    seed: int = opt(0, help="Seed of the deterministic train/validation split.")
    decontaminate: list[str] = opt(["aime24", "aime25", "math500"], help=f"Evaluation sets whose problems are removed from the data: names from the eval-set registry ({', '.join(EVAL_SETS)}) or .jsonl/.json/.parquet paths; [] to skip.")
    ngram: int = opt(13, help="Word n-gram size for decontamination over normalised text (problems shorter than n words are compared whole).")
    min_overlap: float = opt(0.3, help="A problem is contaminated when the n-grams it shares with one evaluation problem cover this fraction of the shorter one's n-grams (a copy shares all; stock phrases like 'where m and n are relatively prime positive integers' share under 10%).")
    max_rows: int | None = opt(None, help="Read at most this many rows from the inputs (all when unset).")
    skip_bad_rows: bool = opt(False, help="Skip and count unreadable rows (broken JSON, non-UTF-8 bytes, missing fields) instead of stopping at the first one.")
    problem_field: str | None = opt(None, help="Field holding the problem (dotted for nested fields); default: problem, question or prompt.")
    answer_field: str | None = opt(None, help="Field holding the answer (dotted for nested fields); default: answer, final_answer, reward_model.ground_truth, ground_truth, or the last \\boxed{} of solution.")
    data_source: str | None = opt(None, help="data_source column of every row; default: the input's own data_source, else the input file's name.")
    overwrite: bool = opt(False, help="Replace a finished output directory.")
    sample_per_rule: int = opt(3, help="Rewrites (before/after) shown in the report for each rule and refusals for each reason.")
    rewriter: str | None = opt(None, help="A model ('default', an HF directory or a hub name ORG/NAME[@REVISION]) that rephrases each rewrite's sentence through the generation engine; the integer is always computed by the rules, and a phrasing that drops any number or formula of the original sentence is rejected.")
    rewriter_engine: str = opt("hf", help="Generation engine for --rewriter: hf, vllm or auto.")

    def __post_init__(self) -> None:
        check_seed(self.seed)
        check(isinstance(self.inputs, list) and len(self.inputs) > 0, "inputs is empty: pass one or more data files or directories")
        check(bool(str(self.out).strip()), "out is empty: pass an output directory with --out")
        check(self.template in ALL_TEMPLATES, f"template must be one of {', '.join(ALL_TEMPLATES)}, got '{self.template}'")
        check(0.0 <= self.val_fraction < 1.0, f"val_fraction must be in [0, 1), got {self.val_fraction}")
        check(self.val_size is None or self.val_size >= 0, f"val_size must be >= 0, got {self.val_size}")
        check(self.ngram >= 1, f"ngram must be >= 1, got {self.ngram}")
        check(0.0 < self.min_overlap <= 1.0, f"min_overlap must be in (0, 1], got {self.min_overlap}")
        check(self.max_rows is None or self.max_rows >= 1, f"max_rows must be >= 1 (or unset), got {self.max_rows}")
        check(self.sample_per_rule >= 0, f"sample_per_rule must be >= 0, got {self.sample_per_rule}")


@dataclass
class _Row:
    source: str
    where: str
    data_source: str
    original_problem: str
    original_answer: str
    item: IntegerProblem


def _resolve_eval(name: str) -> tuple[str, list[Path]]:
    if name in EVAL_SETS:
        return name, EVAL_SETS[name].paths()
    if not name.strip():
        raise ReasonRLError("an empty decontamination set name: pass set names or paths, or [] to skip")
    p = Path(name)
    if not p.exists():
        known = ", ".join(EVAL_SETS)
        raise ReasonRLError(f"decontamination set {name} not found: pass a .jsonl/.json/.parquet path or one of {known} (or [] to skip)")
    return p.stem, [p]


def _load_eval_index(cfg: PrepareConfig) -> tuple[EvalIndex, dict[str, list[Path]]]:
    index = EvalIndex(cfg.ngram, cfg.min_overlap)
    paths: dict[str, list[Path]] = {}
    for entry in cfg.decontaminate:
        name, set_paths = _resolve_eval(entry)
        problems: list[str] = []
        for f in (f for p in set_paths for f in input_files(p)):
            for rec in read_records(f, skip_bad_rows=True, bad=[]):
                try:
                    problems.append(extract_fields(rec, problem_field=None, answer_field=None).problem)
                except (BadRow, NoAnswer):
                    text = rec.data.get("problem") or rec.data.get("question")
                    if isinstance(text, str):
                        problems.append(text)
        if not problems:
            raise ReasonRLError(f"decontamination set {entry} holds no problems: pass a file with a problem/question field")
        index.add(name, problems)
        paths[name] = set_paths
    return index, paths


def _answer_text(answer: Any) -> str:
    if isinstance(answer, str):
        return answer
    if isinstance(answer, (list, dict)):
        return json.dumps(answer, ensure_ascii=False)
    return str(answer)


def _zero_kept_message(n_read: int, dropped: Counter, duplicates: int, contaminated: Counter, bad: int, integerize_on: bool) -> str:
    causes: Counter = Counter(dropped)
    if duplicates:
        causes["duplicate"] = duplicates
    for name, n in contaminated.items():
        causes[f"in {name}"] += n
    if bad:
        causes["bad_row"] = bad
    listed = ", ".join(f"{n} {k}" for k, n in causes.most_common(6))
    top = causes.most_common(1)[0][0] if causes else ""
    if top == "not_integer" and not integerize_on:
        hint = "pass --integerize to rewrite non-integer answers"
    elif top.startswith("in "):
        hint = "the problems belong to evaluation sets: pass other data, or set decontaminate to other sets ([] for none)"
    elif top == "bad_row":
        hint = "fix the input rows"
    elif top == "no_answer":
        hint = "pass --answer-field naming the answer field"
    else:
        hint = "check the answer field (--answer-field) and the data"
    return f"0 of {n_read} rows kept: {listed}; {hint}"


def _schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("index", pa.int64()),
                        ("split", pa.string()),
                        ("raw_problem", pa.string()),
                        ("original_problem", pa.string()),
                        ("original_answer", pa.string()),
                        ("rule", pa.string()),
                        ("source", pa.string()),
                    ]
                ),
            ),
        ]
    )


def _write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows, schema=_schema())
    tmp = path.with_name(path.name + ".tmp")
    with open_new(tmp, "wb") as f:  # (a link planted at the temporary path is removed, never written through)
        pq.write_table(table, f)
    os.replace(tmp, path)


def _verl_row(row: _Row, split: str, index: int, template: str) -> dict[str, Any]:
    return {
        "data_source": row.data_source,
        "prompt": messages_for(template, row.item.problem),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(row.item.answer)},
        "extra_info": {
            "index": index,
            "split": split,
            "raw_problem": row.item.problem,
            "original_problem": row.original_problem,
            "original_answer": row.original_answer,
            "rule": row.item.rule,
            "source": f"{row.source} {row.where}",
        },
    }


@releases_claims
def run_prepare(cfg: PrepareConfig, *, rewriter: Rewriter | None = None, console: Any = None) -> dict[str, Any]:
    from rich.console import Console

    with Display(console or Console(stderr=True), quiet=cfg.quiet):
        if rewriter is None and cfg.rewriter:
            from reasonrl.data.rewriter import ModelRewriter

            tok, engine = _rewriter_engine(cfg)
            try:
                rw = ModelRewriter(engine, tok, seed=cfg.seed)
                report = _run_prepare(cfg, rewriter=rw)
                report["rewriter_stats"] = rw.stats
                return report
            finally:
                engine.close()
        return _run_prepare(cfg, rewriter=rewriter)


def _rewriter_engine(cfg: PrepareConfig) -> tuple[Any, Any]:
    """The --rewriter model's tokenizer and a generation engine on it (--rewriter-engine); the caller closes the engine."""
    from reasonrl.engines.base import EngineOptions
    from reasonrl.engines.registry import make_engine
    from reasonrl.models.loading import load_tokenizer, resolve_model

    md = resolve_model(cfg.rewriter, what="--rewriter")
    tok = load_tokenizer(md)
    return tok, make_engine(EngineOptions(engine=cfg.rewriter_engine), str(md), seed=cfg.seed, max_model_len=2048)


def _run_prepare(cfg: PrepareConfig, *, rewriter: Rewriter | None = None) -> dict[str, Any]:
    """Run the stage; returns the report (also written to ``<out>/report.json``).

    ``rewriter(problem, rule, sentence) -> sentence`` may rephrase the sentence each rewritten
    problem ends with (the integer answer never depends on it). The phases: the inputs, the eval
    sets' index and the output checked; read + integerize; dedupe + decontaminate; the rules'
    counts; the split; the report; only then the write.
    """
    files = _input_files(cfg)
    eval_index, eval_paths = _load_eval_index(cfg)
    run = _checked_output(cfg, files)
    read = _read_and_integerize(cfg, files, rewriter)
    kept = _dedupe_and_decontaminate(read.kept, eval_index)
    rules, samples = _rule_counts(kept.final, cfg.sample_per_rule)
    if not kept.final:
        raise ReasonRLError(_zero_kept_message(read.rows_read, read.dropped, kept.duplicates, kept.contaminated, len(read.bad), cfg.integerize))
    split_rows = _split(kept.final, cfg)
    report: dict[str, Any] = {
        "stage": STAGE,
        "inputs": [str(f) for _, f in files],
        "rows_read": read.rows_read,
        "bad_rows_skipped": len(read.bad),
        "bad_rows": [b.as_dict() for b in read.bad[:MAX_BAD_ROWS_LISTED]],
        "kept_unchanged": rules.get("integer", 0),
        "transformed": {k: v for k, v in sorted(rules.items(), key=lambda kv: -kv[1]) if k not in ("integer", NON_INTEGER)},
        "kept_non_integer": rules.get(NON_INTEGER, 0),
        "dropped": dict(read.dropped.most_common()),
        "duplicates": kept.duplicates,
        "duplicates_with_other_answer": kept.conflicting,
        "rows_per_problem": {str(k): v for k, v in sorted(kept.rows_per_problem.items())},
        "max_rows_per_problem": max(kept.rows_per_problem, default=0),
        "contaminated": {name: kept.contaminated.get(name, 0) for name in eval_paths},
        "decontamination": {"ngram": cfg.ngram, "min_overlap": cfg.min_overlap, "sets": {k: ", ".join(str(p) for p in v) for k, v in eval_paths.items()}, "eval_problems": eval_index.sizes},
        "integerize": cfg.integerize,
        "template": cfg.template,
        "rewriter": rewriter is not None,
        "kept": len(kept.final),
        "train": len(split_rows["train"]),
        "validation": len(split_rows["validation"]),
        "samples": samples,
        "dropped_samples": read.dropped_samples,
    }
    _write(cfg, run, files, eval_paths, split_rows, report)
    return report


def _input_files(cfg: PrepareConfig) -> list[tuple[str, Path]]:
    """(--input, file) for every file of every --input."""
    files: list[tuple[str, Path]] = []
    for inp in cfg.inputs:
        files.extend((inp, f) for f in input_files(inp))
    return files


def _checked_output(cfg: PrepareConfig, files: list[tuple[str, Path]]) -> RunDir:
    """--out, claimed (``reasonrl.rundir``): not a file, holding no input, no one else's files, and no
    finished artifact unless --overwrite. Nothing in it is removed until the write."""
    run = claim(cfg.out, stage=STAGE, inputs=[f for _, f in files])
    if run.finished and not cfg.overwrite:
        raise ReasonRLError(f"{cfg.out} already holds a finished artifact: pass --overwrite or choose another --out")
    return run


@dataclass
class _Read:
    """What reading and integerizing gave: the rows kept, the bad rows, the drop counts and samples."""

    kept: list[_Row]
    bad: list[BadRow]
    n_read: int  # readable records (the unreadable lines are in ``bad``)
    dropped: Counter
    dropped_samples: dict[str, list[str]]

    @property
    def rows_read(self) -> int:
        """Every row met: readable records and unreadable lines."""
        return self.n_read + len(self.bad)


def _read_and_integerize(cfg: PrepareConfig, files: list[tuple[str, Path]], rewriter: Rewriter | None) -> _Read:
    """Read every record (up to --max-rows), take its problem and answer, and keep it when its answer
    is (or, with --integerize, becomes) an integer; the others are counted by reason. No readable
    row at all is an error."""
    r = _Read(kept=[], bad=[], n_read=0, dropped=Counter(), dropped_samples={})
    bar = open_bar("prepare-data: read + integerize", unit="rows")
    for _inp, f in files:
        if cfg.max_rows is not None and r.n_read + len(r.bad) >= cfg.max_rows:
            break
        for rec in read_records(f, skip_bad_rows=cfg.skip_bad_rows, bad=r.bad):
            if cfg.max_rows is not None and r.n_read + len(r.bad) >= cfg.max_rows:
                break
            r.n_read += 1
            if bar is not None:
                bar.advance()
            try:
                fields = extract_fields(rec, problem_field=cfg.problem_field, answer_field=cfg.answer_field)
            except BadRow as e:
                if not cfg.skip_bad_rows:
                    raise ReasonRLError(f"{e}, or pass --skip-bad-rows to skip bad rows") from None
                r.bad.append(e)
                r.n_read -= 1  # counted in `bad`
                continue
            except NoAnswer as e:
                r.dropped["no_answer"] += 1
                _sample(r.dropped_samples, "no_answer", f"{rec.source} {rec.where}: {e}", cfg.sample_per_rule)
                continue
            answer_text = _answer_text(fields.answer)
            if answer_flaw(answer_text):  # (the check `eval` shares: it skips such rows too)
                r.dropped["bad_characters"] += 1
                _sample(r.dropped_samples, "bad_characters", f"{rec.source} {rec.where}: {answer_text!r}", cfg.sample_per_rule)
                continue
            result = integerize(fields.problem, fields.answer, rewriter=rewriter if cfg.integerize else None)
            if isinstance(result, IntegerProblem) and not cfg.integerize and result.rule != "integer":
                reason = "not_integer"
            elif isinstance(result, IntegerProblem):
                reason = ""
            else:
                reason = result.reason if cfg.integerize else "not_integer"
            if reason and cfg.keep_non_integer and answer_text.strip():
                # kept as written: the ground truth is the answer's text, for a reward plug-in to judge
                result, reason = IntegerProblem(fields.problem, answer_text, NON_INTEGER), ""  # type: ignore[arg-type]
            if reason:
                r.dropped[reason] += 1
                _sample(r.dropped_samples, reason, answer_text, cfg.sample_per_rule)
                continue
            assert isinstance(result, IntegerProblem)
            data_source = cfg.data_source or fields.data_source or Path(rec.source).stem
            r.kept.append(_Row(rec.source, rec.where, data_source, fields.problem, answer_text, result))
    if bar is not None:
        bar.close()
    if r.n_read == 0:
        where = ", ".join(str(f) for _, f in files)
        if r.bad:
            raise ReasonRLError(f"0 readable rows in {where}: all {len(r.bad)} rows are bad (first: {r.bad[0]}); fix the input")
        raise ReasonRLError(f"0 rows read from {where}: the inputs are empty; pass files that hold data")
    return r


@dataclass
class _Deduped:
    """The rows left after dedupe and decontamination, and what was removed."""

    final: list[_Row]
    duplicates: int
    conflicting: int  # duplicates whose answer differs from the kept row's
    contaminated: Counter  # eval set → rows matching one of its problems
    rows_per_problem: Counter  # rows per kept problem → problems


def _dedupe_and_decontaminate(kept: list[_Row], eval_index: EvalIndex) -> _Deduped:
    """Duplicates (normalised problem text; the first occurrence is kept) and contamination (a
    match in an eval set's index) removed."""
    seen: dict[str, int] = {}
    copies: Counter = Counter()  # normalised problem → rows that held it
    final_keys: list[str] = []
    d = _Deduped(final=[], duplicates=0, conflicting=0, contaminated=Counter(), rows_per_problem=Counter())
    bar = open_bar("prepare-data: dedupe + decontaminate", len(kept), unit="rows")
    for row in kept:
        if bar is not None:
            bar.advance()
        key = normalise_text(row.original_problem)
        copies[key] += 1
        if key in seen:
            d.duplicates += 1
            if seen[key] != row.item.answer:
                d.conflicting += 1
            continue
        seen[key] = row.item.answer
        hit = eval_index.match(row.original_problem)
        if hit is not None:
            d.contaminated[hit] += 1
            continue
        d.final.append(row)
        final_keys.append(key)
    d.rows_per_problem = Counter(copies[key] for key in final_keys)
    if bar is not None:
        bar.close()
    return d


def _rule_counts(final: list[_Row], sample_per_rule: int) -> tuple[Counter, dict[str, list[dict[str, Any]]]]:
    """How many kept rows each rule made, and up to ``sample_per_rule`` examples of each rewrite."""
    rules: Counter = Counter()
    samples: dict[str, list[dict[str, Any]]] = {}
    for row in final:
        rules[row.item.rule] += 1
        if row.item.rule not in ("integer", NON_INTEGER):
            _sample(
                samples,
                row.item.rule,
                {
                    "original_answer": row.original_answer,
                    "form": row.item.form,
                    "answer": row.item.answer,
                    "sentence": row.item.sentence,
                    "source": f"{row.source} {row.where}",
                },
                sample_per_rule,
            )
    return rules, samples


def _split(final: list[_Row], cfg: PrepareConfig) -> dict[str, list[dict[str, Any]]]:
    """The verl rows of the train and validation splits (--val-size, or --val-fraction with at
    least one row; a seeded draw; at least one training row)."""
    n = len(final)
    if cfg.val_size is not None:
        n_val = cfg.val_size
    else:
        n_val = round(n * cfg.val_fraction)
        if cfg.val_fraction > 0 and n_val == 0 and n >= 2:
            n_val = 1
    n_val = min(n_val, n - 1)
    order = list(range(n))
    random.Random(cfg.seed).shuffle(order)
    val_ids = set(order[:n_val])
    split_rows: dict[str, list[dict[str, Any]]] = {"train": [], "validation": []}
    for i, row in enumerate(final):
        split = "validation" if i in val_ids else "train"
        split_rows[split].append(_verl_row(row, split, len(split_rows[split]), cfg.template))
    return split_rows


def _write(cfg: PrepareConfig, run: RunDir, files: list[tuple[str, Path]], eval_paths: dict[str, list[Path]],
           split_rows: dict[str, list[dict[str, Any]]], report: dict[str, Any]) -> None:
    """Everything is validated: now write. The old manifest goes first, so a crash while writing
    never leaves a manifest next to half-written files."""
    out = run.path
    outputs = [*(f"{split}.parquet" for split in SPLITS), "report.json"]
    run.clear(outputs)
    with run.writing(outputs):
        for split in SPLITS:
            _write_parquet(out / f"{split}.parquet", split_rows[split])
        write_json(out / "report.json", report)
        inputs: dict[str, str | Path | None] = {f"input{i}": f for i, (_, f) in enumerate(files)}
        inputs.update({f"decontaminate:{k}:{p.name}": p for k, v in eval_paths.items() for p in v})
        with last_write():  # (a SIGTERM or Ctrl-C from here on is only noted: the run is finished, exit 0)
            write_manifest(out, STAGE, to_dict(cfg), inputs, extra={"counts": {"train": report["train"], "validation": report["validation"]}})


def _sample(store: dict[str, list[Any]], key: str, value: Any, limit: int) -> None:
    lst = store.setdefault(key, [])
    if len(lst) < limit:
        lst.append(value)


def print_report(report: dict[str, Any], console: Any = None) -> None:
    """Print a prepare-data report as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    summary = Table(title="prepare-data", show_header=False)
    summary.add_column("what")
    summary.add_column("rows", justify="right")
    transformed = sum(report["transformed"].values())
    summary.add_row("rows read", str(report["rows_read"]))
    summary.add_row("bad rows skipped", str(report["bad_rows_skipped"]))
    summary.add_row("kept unchanged (integer)", str(report["kept_unchanged"]))
    summary.add_row("transformed to integers", str(transformed))
    if report.get("kept_non_integer"):
        summary.add_row("kept not integer (--keep-non-integer)", str(report["kept_non_integer"]))
    summary.add_row("dropped", str(sum(report["dropped"].values())))
    summary.add_row("duplicates", str(report["duplicates"]))
    if report.get("duplicates"):
        hist = ", ".join(f"{v} × {k}" for k, v in report["rows_per_problem"].items())
        summary.add_row("kept problems × rows each", f"{hist} (max {report['max_rows_per_problem']})")
    summary.add_row("contaminated", str(sum(report["contaminated"].values())))
    summary.add_row("train", str(report["train"]))
    summary.add_row("validation", str(report["validation"]))
    console.print(summary)

    def counts(title: str, data: dict[str, int], key: str) -> None:
        if not data:
            return
        t = Table(title=title)
        t.add_column(key)
        t.add_column("rows", justify="right")
        for k, v in data.items():
            t.add_row(k, str(v))
        console.print(t)

    counts("transformed, per rule", report["transformed"], "rule")
    counts("dropped, per reason", report["dropped"], "reason")
    counts("contaminated, per evaluation set", report["contaminated"], "evaluation set")
    if report.get("samples"):
        t = Table(title="sample rewrites")
        t.add_column("rule")
        t.add_column("before")
        t.add_column("after", justify="right")
        t.add_column("sentence added")
        for rule, items in report["samples"].items():
            for s in items:
                t.add_row(rule, s["original_answer"], str(s["answer"]), s["sentence"])
        console.print(t)
    if report.get("bad_rows"):
        t = Table(title=f"bad rows skipped ({report['bad_rows_skipped']})")
        t.add_column("file")
        t.add_column("where")
        t.add_column("error")
        for b in report["bad_rows"][:10]:
            t.add_row(b["file"], b["where"], b["error"])
        console.print(t)
