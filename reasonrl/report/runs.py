"""Reading run directories for the report: what each stage left on disk, read defensively.

A *run* is a directory a stage wrote (its ``manifest.json`` names the stage): ``train`` and
``pretrain-value`` (``metrics.jsonl``, ``config.json``, ``bias.json``), ``eval`` (``results.json``:
only ``metrics``, ``problems``, ``n`` and ``by_source`` are read). A directory without a manifest
holding run directories (the main job's ``runs/main``, or a ``runs/`` folder) stands for all of
them. A run still in progress (``metrics.jsonl`` but no manifest yet) is read and marked
incomplete. Nothing is filled in: a missing file is a missing curve, noted in the report.

What cannot be read is skipped and counted, never fatal: a line of ``metrics.jsonl`` that is not
UTF-8, not JSON or not an object, or whose ``step`` is not an integer; a metric value that is not a
number where the report needs one; a JSON file that is not an object; an eval metric without a
numeric ``value``. Each is one *skipped record* of its file (:meth:`Run.skip`), named in the report.
Non-finite numbers (NaN, ±inf: JSON as Python writes it) are read as they are: the figures mark them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reasonrl.artifacts import MANIFEST, json_error, kind, shown, step_records
from reasonrl.errors import ReasonRLError

PLOTTED_STAGES = ("train", "pretrain-value", "eval")
ORDER = {"prepare-data": 0, "pretrain-value": 1, "train": 2, "eval": 3}
MAX_STEP = 2**53  # steps beyond this are not exact as floats (the axes' numbers)


def number(v: Any) -> float | None:
    """``v`` as a float when it is a JSON number (non-finite included), else None (a bool is not one)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:  # an integer beyond float range
        return math.inf if v > 0 else -math.inf


def numbers(v: Any) -> list[float] | None:
    """``v`` as a list of floats when it is a list of JSON numbers, else None."""
    if not isinstance(v, list):
        return None
    out = [number(x) for x in v]
    return None if any(x is None for x in out) else out  # type: ignore[misc]


def load_json(path: Path) -> tuple[Any, str | None]:
    """(value, None) of a JSON file, or (None, why it cannot be read)."""
    try:
        return json.loads(path.read_bytes().decode("utf-8")), None
    except (OSError, ValueError, RecursionError) as e:
        return None, json_error(e)


@dataclass
class Run:
    path: Path
    stage: str  # train | pretrain-value | eval
    label: str = ""
    rung: str = ""  # the ablation rung (``reasonrl ablate``'s out/<rung>/seed-<k>/), else ""
    complete: bool = True  # its manifest.json is written (the stage finished)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl, one dict per step, each with an int "step"
    config: dict[str, Any] = field(default_factory=dict)
    bias: dict[str, Any] | None = None  # pretrain-value's bias.json
    results: dict[str, Any] | None = None  # eval's results.json; its "metrics": name -> {"value": float, "ci": [lo, hi] | None}
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, dict[str, None]] = field(default_factory=dict)  # file name -> why each skipped record was skipped (ordered, no repeats)

    def skip(self, file: str, why: str) -> None:
        """Count one record of ``file`` (a line, a value, the whole file) as skipped, and why."""
        self.skipped.setdefault(file, {})[why] = None

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a numeric metric over the steps that logged it (never filled in;
        non-finite values kept). A value that is not a number is skipped and counted."""
        steps, vals = [], []
        for m in self.metrics:
            x = self.value(m, key)
            if x is not None:
                steps.append(m["step"])
                vals.append(x)
        return steps, vals

    def value(self, m: dict[str, Any], key: str) -> float | None:
        """One step's (a record of :attr:`metrics`) numeric metric, None when not logged; a value
        that is not a number is skipped and counted."""
        v = m.get(key)
        x = number(v)
        if x is None and v is not None:
            self.skip("metrics.jsonl", f"{key} at step {m['step']} is {kind(v)} ({shown(v)}), not a number")
        return x

    def objects(self, key: str) -> tuple[list[int], list[dict[str, Any]]]:
        """(steps, values) of a metric logged as a JSON object (``actor/clipfrac_by_prob``);
        any other value is skipped and counted."""
        steps, vals = [], []
        for m in self.metrics:
            v = m.get(key)
            if v is None:
                continue
            if not isinstance(v, dict):
                self.skip("metrics.jsonl", f"{key} at step {m['step']} is {kind(v)} ({shown(v)}), not an object")
                continue
            steps.append(m["step"])
            vals.append(v)
        return steps, vals

    def has(self, key: str) -> bool:
        return any(m.get(key) is not None for m in self.metrics)


def read_metrics(path: Path, run: Run) -> None:
    """``metrics.jsonl`` into ``run.metrics``: one object per line with an integer ``step``; any
    other line is skipped and counted (a torn last line is a run stopped mid-write)."""
    try:
        records, skipped = step_records(path)
    except OSError as e:
        run.skip("metrics.jsonl", f"the file is {json_error(e)}")
        return
    for why in skipped:
        run.skip("metrics.jsonl", why)
    for i, rec in records:
        if not -MAX_STEP <= rec["step"] <= MAX_STEP:
            run.skip("metrics.jsonl", f"line {i}: step {shown(rec['step'])} is out of range")
            continue
        run.metrics.append(rec)


def read_object(d: Path, name: str, run: Run) -> dict[str, Any] | None:
    """A JSON file of the run that must hold an object; anything else is skipped and counted."""
    obj, why = load_json(d / name)
    if why is None and not isinstance(obj, dict):
        why = f"{kind(obj)}, not an object"
    if why is not None:
        run.skip(name, f"the file is {why}")
        return None
    return obj


def eval_metrics(res: dict[str, Any], run: Run) -> dict[str, dict[str, Any]]:
    """results.json's ``metrics`` as name -> {"value": float, "ci": [lo, hi] or None}: a metric
    without a numeric value is skipped, a malformed ``ci`` is dropped (both counted); a missing
    ``ci`` is kept as None (drawn without error bars)."""
    out: dict[str, dict[str, Any]] = {}
    for name, m in res["metrics"].items():
        if not isinstance(m, dict):
            run.skip("results.json", f"metrics.{name} is {kind(m)}, not an object")
            continue
        v = number(m.get("value"))
        if v is None:
            run.skip("results.json", f"metrics.{name}.value is {'missing' if 'value' not in m else kind(m['value']) + ' (' + shown(m['value']) + ')'}, not a number")
            continue
        ci = m.get("ci")
        if ci is not None:
            lohi = numbers(ci)
            if lohi is None or len(lohi) != 2:
                run.skip("results.json", f"metrics.{name}.ci is {shown(ci)}, not [low, high] numbers: drawn without it")
                ci = None
            elif all(map(math.isfinite, lohi + [v])) and not lohi[0] <= v <= lohi[1]:
                run.skip("results.json", f"metrics.{name}.ci {shown(ci)} does not hold the value {v:g}: drawn without it")
                ci = None
            else:
                ci = lohi
        out[str(name)] = {"value": v, "ci": ci}
    return out


def manifest_stage(d: Path) -> tuple[str | None, str | None]:
    """(stage named by ``d``'s manifest, None) or (None, why the manifest cannot be read)."""
    man, why = load_json(d / MANIFEST)
    if why is None and not isinstance(man, dict):
        why = f"{kind(man)}, not an object"
    if why is None and not isinstance(man.get("stage"), str):
        why = "it names no stage"
    return (man["stage"], None) if why is None else (None, why)


def _stage_of(d: Path) -> tuple[str | None, bool, str | None]:
    """(stage, complete, corrupt) of a run directory, (None, False, None) when it is not one;
    ``corrupt`` says why its manifest.json cannot be read (the run is then read as unfinished
    when its files tell the stage)."""
    corrupt = None
    if (d / MANIFEST).is_file():
        stage, corrupt = manifest_stage(d)
        if corrupt is None:
            return stage, True, None
    if (d / "metrics.jsonl").is_file():  # still running: config.json tells train from pretrain-value
        return ("pretrain-value" if (d / "critic").exists() or not (d / "config.json").is_file() else "train"), False, corrupt
    if (d / "results.json").is_file():
        return "eval", False, corrupt
    return None, False, corrupt


def read_run(d: Path, stage: str, complete: bool, corrupt: str | None = None) -> Run:
    run = Run(path=d, stage=stage, complete=complete and corrupt is None)
    if corrupt is not None:
        run.skip(MANIFEST, f"the file is {corrupt}")
        run.notes.append(f"{d / MANIFEST} is corrupt ({corrupt}): read as an unfinished run, as far as its files go")
    elif not complete:
        run.notes.append("incomplete (no manifest.json yet): plotted as far as it got")
    if stage in ("train", "pretrain-value"):
        mpath = d / "metrics.jsonl"
        if mpath.is_file():
            read_metrics(mpath, run)
        else:
            run.notes.append("no metrics.jsonl")
        if (d / "config.json").is_file():
            run.config = read_object(d, "config.json", run) or {}
        elif complete:
            cfg = (read_object(d, MANIFEST, run) or {}).get("config")
            run.config = cfg if isinstance(cfg, dict) else {}
        if (d / "bias.json").is_file():
            bias = read_object(d, "bias.json", run)
            bad = [w for w in ("before", "after") if bias is not None and not isinstance(bias.get(w), dict)]
            if bad and bias is not None:
                run.skip("bias.json", f"its {bad[0]} is {kind(bias.get(bad[0])) if bad[0] in bias else 'missing'}, not an object")
            run.bias = None if bad else bias
    elif stage == "eval":
        res = read_object(d, "results.json", run) if (d / "results.json").is_file() else None
        if res is not None and not isinstance(res.get("metrics"), dict):
            run.skip("results.json", f"its metrics is {'missing' if 'metrics' not in res else kind(res['metrics'])}, not an object")
            res = None
        if res is not None:
            run.results = {k: res.get(k) for k in ("metrics", "problems", "n", "by_source")}
            run.results["metrics"] = eval_metrics(res, run)
        else:
            run.notes.append("no readable results.json")
    return run


def ablation_children(p: Path) -> list[tuple[Path, str]] | None:
    """The run directories of an ablation (``reasonrl ablate``: a ``plan.json``): each rung's
    ``<rung>/seed-<k>/`` in the plan's order, then the critics; each with its rung's name ("" for
    the critics). None when ``p`` is not an ablation."""
    plan, why = load_json(p / "plan.json") if (p / "plan.json").is_file() else (None, "none")
    if why is not None or not isinstance(plan, dict) or not isinstance(plan.get("rungs"), list):
        return None
    names = [r["name"] for r in plan["rungs"] if isinstance(r, dict) and isinstance(r.get("name"), str)]

    def seeds(d: Path) -> list[Path]:
        found = [c for c in d.glob("seed-*") if c.is_dir() and c.name[5:].isdigit()] if d.is_dir() else []
        return sorted(found, key=lambda c: int(c.name[5:]))

    return [(c, n) for n in names for c in seeds(p / n)] + [(c, "") for c in seeds(p / "_critic")]


def collect_runs(paths: list[str | Path]) -> tuple[list[Run], list[str]]:
    """Runs under ``paths`` (in order; a folder of runs expands to its runs, sorted), labelled by
    their path relative to the common parent; plus notes on what was passed over."""
    found: list[tuple[Path, str, bool, str | None]] = []
    rungs: dict[Path, str] = {}  # an ablation's run → its rung
    skipped: list[str] = []
    corrupt_only = 0  # run directories passed over because their manifest cannot be read

    def corrupt_note(d: Path, why: str) -> str:
        return f"{d / MANIFEST} is corrupt: {why}; no metrics.jsonl or results.json to read instead"

    for p in map(Path, paths):
        if not p.is_dir():
            raise ReasonRLError(f"{p} is not a run directory: pass directories written by train, pretrain-value, eval or main-job")
        stage, complete, corrupt = _stage_of(p)
        ablation = ablation_children(p) if stage in (None, "ablate") else None
        if ablation is not None:  # an ablation: its runs, each tagged with its rung
            for c, rung in ablation:
                st, done, bad = _stage_of(c)
                if st in PLOTTED_STAGES:
                    found.append((c, st, done, bad))
                    rungs[c] = rung
            if not ablation:
                skipped.append(f"{p} (ablate): no run has started yet")
            continue
        if stage is not None:
            (found.append((p, stage, complete, corrupt)) if stage in PLOTTED_STAGES else skipped.append(f"{p} ({stage}): nothing to plot"))
            continue
        if corrupt is not None:  # a run directory whose manifest cannot be read, and no metrics.jsonl or results.json in it
            skipped.append(corrupt_note(p, corrupt))
            corrupt_only += 1
        children = [(c, *_stage_of(c)) for c in sorted(p.iterdir()) if c.is_dir()]
        broken = [corrupt_note(c, why) for c, stage, _, why in children if stage is None and why is not None]
        children = sorted((c for c in children if c[1] is not None), key=lambda c: ORDER.get(c[1], len(ORDER)))  # pipeline order, then name
        if not children and not broken and corrupt is None:
            raise ReasonRLError(f"{p} holds no run (no manifest.json, metrics.jsonl or results.json, nor run directories inside): "
                                "pass directories written by train, pretrain-value, eval or main-job")
        skipped += broken
        corrupt_only += len(broken)
        for c, stage, complete, corrupt in children:
            (found.append((c, stage, complete, corrupt)) if stage in PLOTTED_STAGES else skipped.append(f"{c} ({stage}): nothing to plot"))
    if not found:
        raise ReasonRLError(f"no train, pretrain-value or eval run in {', '.join(map(str, paths))}"
                            + (f" ({'; '.join(skipped)})" if skipped else "")
                            + (": rerun the stage that wrote it, or pass other runs" if corrupt_only else ": run one of those stages first"))
    runs = [read_run(*f) for f in found]
    for r in runs:
        r.rung = rungs.get(r.path, "")
    resolved = [r.path.resolve() for r in runs]
    base = Path(*resolved[0].parts[: _common(resolved)]) if len(resolved) > 1 else resolved[0].parent
    for r, rp in zip(runs, resolved):
        r.label = str(rp.relative_to(base)) if rp != base else rp.name
        if r.label.startswith("_"):  # (matplotlib leaves a label starting with "_" out of the legend: an ablation's _critic/seed-k)
            r.label = str(rp.relative_to(base.parent)) if base.parent != base else f"./{r.label}"
    return runs, skipped


def _common(paths: list[Path]) -> int:
    """Number of leading path parts all paths share, leaving each at least its own name."""
    n = min(len(p.parts) for p in paths) - 1
    i = 0
    while i < n and len({p.parts[i] for p in paths}) == 1:
        i += 1
    return i
