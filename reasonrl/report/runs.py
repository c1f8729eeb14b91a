"""Reading run directories for the report: what each stage left on disk, read defensively.

A *run* is a directory a stage wrote (its ``manifest.json`` names the stage): ``train`` and
``pretrain-value`` (``metrics.jsonl``, ``config.json``, ``bias.json``), ``eval`` (``results.json``:
only ``metrics``, ``problems``, ``n`` and ``by_source`` are read). A directory without a manifest
holding run directories (the main job's ``runs/main``, or a ``runs/`` folder) stands for all of
them. A run still in progress (``metrics.jsonl`` but no manifest yet) is read and marked
incomplete. Nothing is filled in: a missing file is a missing curve, noted in the report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reasonrl.artifacts import MANIFEST
from reasonrl.errors import ReasonRLError

PLOTTED_STAGES = ("train", "pretrain-value", "eval")
ORDER = {"prepare-data": 0, "pretrain-value": 1, "train": 2, "eval": 3}


@dataclass
class Run:
    path: Path
    stage: str  # train | pretrain-value | eval
    label: str = ""
    metrics: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl, one dict per step
    config: dict[str, Any] = field(default_factory=dict)
    bias: dict[str, Any] | None = None  # pretrain-value's bias.json
    results: dict[str, Any] | None = None  # eval's results.json
    notes: list[str] = field(default_factory=list)

    def series(self, key: str) -> tuple[list[int], list[Any]]:
        """(steps, values) of a metric over the steps that logged it (never filled in)."""
        pts = [(int(m["step"]), m[key]) for m in self.metrics if "step" in m and m.get(key) is not None]
        return [s for s, _ in pts], [v for _, v in pts]

    def has(self, key: str) -> bool:
        return any(m.get(key) is not None for m in self.metrics)


def _read_json(path: Path, notes: list[str]) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        notes.append(f"{path.name} unreadable ({type(e).__name__}): skipped")
        return None


def _stage_of(d: Path) -> tuple[str | None, bool]:
    """(stage, complete) of a run directory; (None, False) when it is not one."""
    man = d / MANIFEST
    if man.is_file():
        try:
            return str(json.loads(man.read_text(encoding="utf-8")).get("stage")), True
        except (OSError, ValueError):
            return None, False
    if (d / "metrics.jsonl").is_file():  # still running: config.json tells train from pretrain-value
        return ("pretrain-value" if (d / "critic").exists() or not (d / "config.json").is_file() else "train"), False
    if (d / "results.json").is_file():
        return "eval", False
    return None, False


def read_run(d: Path, stage: str, complete: bool) -> Run:
    run = Run(path=d, stage=stage)
    if not complete:
        run.notes.append("incomplete (no manifest.json yet): plotted as far as it got")
    if stage in ("train", "pretrain-value"):
        mpath = d / "metrics.jsonl"
        if mpath.is_file():
            bad = 0
            for line in mpath.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                try:
                    run.metrics.append(json.loads(line))
                except ValueError:
                    bad += 1
            if bad:
                run.notes.append(f"{bad} unreadable line(s) in metrics.jsonl skipped")
        else:
            run.notes.append("no metrics.jsonl")
        cfg = d / "config.json"
        if cfg.is_file():
            run.config = _read_json(cfg, run.notes) or {}
        elif (d / MANIFEST).is_file():
            run.config = (_read_json(d / MANIFEST, run.notes) or {}).get("config") or {}
        if (d / "bias.json").is_file():
            run.bias = _read_json(d / "bias.json", run.notes)
    elif stage == "eval":
        res = _read_json(d / "results.json", run.notes) if (d / "results.json").is_file() else None
        if isinstance(res, dict) and isinstance(res.get("metrics"), dict):
            run.results = {k: res.get(k) for k in ("metrics", "problems", "n", "by_source")}
        else:
            run.notes.append("no readable results.json")
    return run


def collect_runs(paths: list[str | Path]) -> tuple[list[Run], list[str]]:
    """Runs under ``paths`` (in order; a folder of runs expands to its runs, sorted), labelled by
    their path relative to the common parent; plus notes on what was passed over."""
    found: list[tuple[Path, str, bool]] = []
    skipped: list[str] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise ReasonRLError(f"{p} is not a run directory: pass directories written by train, pretrain-value, eval or main-job")
        stage, complete = _stage_of(p)
        if stage is not None:
            (found.append((p, stage, complete)) if stage in PLOTTED_STAGES else skipped.append(f"{p} ({stage}): nothing to plot"))
            continue
        children = [(c, *_stage_of(c)) for c in sorted(p.iterdir()) if c.is_dir()]
        children = sorted((c for c in children if c[1] is not None), key=lambda c: ORDER.get(c[1], len(ORDER)))  # pipeline order, then name
        if not children:
            raise ReasonRLError(f"{p} holds no run (no manifest.json, metrics.jsonl or results.json, nor run directories inside): "
                                "pass directories written by train, pretrain-value, eval or main-job")
        for c, stage, complete in children:
            (found.append((c, stage, complete)) if stage in PLOTTED_STAGES else skipped.append(f"{c} ({stage}): nothing to plot"))
    if not found:
        raise ReasonRLError(f"no train, pretrain-value or eval run in {', '.join(map(str, paths))}: run one of those stages first")
    runs = [read_run(d, s, c) for d, s, c in found]
    resolved = [r.path.resolve() for r in runs]
    base = Path(*resolved[0].parts[: _common(resolved)]) if len(resolved) > 1 else resolved[0].parent
    for r, rp in zip(runs, resolved):
        r.label = str(rp.relative_to(base)) if rp != base else rp.name
    return runs, skipped


def _common(paths: list[Path]) -> int:
    """Number of leading path parts all paths share, leaving each at least its own name."""
    n = min(len(p.parts) for p in paths) - 1
    i = 0
    while i < n and len({p.parts[i] for p in paths}) == 1:
        i += 1
    return i
