"""An ablation's numbers: a finished run's validation curve and training metrics, and ablation.json,
one entry per rung: the mean over seeds with its 95% interval (``reasonrl.evaluation.scores``) and
the difference to the previous rung, paired by seed and problem."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from reasonrl.artifacts import step_records
from reasonrl.stages.ablation.jobs import Job, state
from reasonrl.stages.ablation.plan import run_dir

def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The step records of a .jsonl file (``reasonrl.artifacts.step_records``; a torn or foreign line is skipped)."""
    try:
        return [rec for _, rec in step_records(path)[0]]
    except OSError:
        return []


def _mean(xs: list[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else math.nan


def _trapezoid(steps: list[int], ys: list[float]) -> float:
    """The area under (steps, ys) over the steps' span, divided by the span: the curve's mean level
    (a single point: its value)."""
    if len(steps) == 1:
        return ys[0]
    area = math.fsum((steps[i + 1] - steps[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(len(steps) - 1))
    return area / (steps[-1] - steps[0])


def run_stats(d: Path) -> dict[str, Any] | None:
    """A finished run's numbers for the table: its validation curve (``validation.jsonl``: per
    problem) and its training metrics (``metrics.jsonl``), or None when it has no validation."""
    from reasonrl.train.checkpoint import latest_checkpoint

    val = sorted(read_jsonl(d / "validation.jsonl"), key=lambda r: r["step"])
    key = next((k for r in val for k in r if re.fullmatch(r"avg@\d+", k)), None)
    val = [r for r in val if key and isinstance(r.get(key), list) and r[key] and isinstance(r.get("where"), list) and len(r["where"]) == len(r[key])]
    if not val or key is None:
        return None
    where = val[-1]["where"]
    val = [r for r in val if r["where"] == where]  # (always: one run validates one set of problems)
    curve = [(r["step"], [float(x) for x in r[key]]) for r in val]
    means = [_mean(v) for _, v in curve]
    best = max(range(len(curve)), key=lambda i: (means[i], -i))  # (the first to reach the best)
    steps = [s for s, _ in curve]
    auc = [_trapezoid(steps, [v[p] for _, v in curve]) for p in range(len(where))]
    metrics = [m for m in read_jsonl(d / "metrics.jsonl") if m["step"] >= 1]

    def avg(k: str) -> float:
        xs = [float(m[k]) for m in metrics if isinstance(m.get(k), (int, float)) and not isinstance(m.get(k), bool)]
        return _mean(xs)

    ent = [float(m["actor/entropy"]) for m in metrics if isinstance(m.get("actor/entropy"), (int, float))]
    return {"metric": key, "dtype": _dtype(d), "where": where, "curve": [[s, _mean(v)] for s, v in curve], "final": curve[-1][1], "final_step": curve[-1][0],
            "best": curve[best][1], "best_step": curve[best][0], "auc": auc, "entropy_final": ent[-1] if ent else math.nan,
            "clipfrac_upper": avg("actor/clipfrac_upper"), "clipfrac_lower": avg("actor/clipfrac_lower"),
            "response_length": avg("rollout/response_length_mean"), "truncated_frac": avg("rollout/truncated_frac"),
            "ds_rounds": avg("rollout/ds_rounds"), "step_s": avg("perf/step_s"),
            "peak_rss_gib": max((float(m["perf/peak_rss_gib"]) for m in metrics if isinstance(m.get("perf/peak_rss_gib"), (int, float))), default=math.nan),
            "checkpoint_mib": _size_mib(latest_checkpoint(d))}


def _dtype(d: Path) -> str | None:
    """The dtype a train run computed in (its config.json's ``dtype_resolved``: ``--dtype auto``
    resolved on the machine it ran on), or None when config.json does not say."""
    try:
        v = json.loads((d / "config.json").read_text(encoding="utf-8")).get("dtype_resolved")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, str) else None


def _size_mib(d: Path | None) -> float:
    """A directory's files in MiB (NaN when there is none: a run's checkpoints may be deleted once it finished)."""
    return math.fsum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / 2**20 if d is not None else math.nan


def _with_ci(per_seed: list[list[float]], n_boot: int, crossed: bool, bounds: tuple[float, float] = (0.0, 1.0)) -> dict[str, Any]:
    """The mean over seeds of each seed's mean over problems. ``crossed`` (every seed scored on the
    same problems, in the same order: ablate's design): ``ci`` is the crossed random-effects
    interval (:func:`~reasonrl.evaluation.scores.crossed_mean_ci`: seeds and problems both random,
    a problem's difficulty shared by the seeds), ``ci_problems`` the bootstrap over the problems of
    their mean over seeds (one draw of problems for all the seeds, the runs taken as fixed). Not
    crossed (runs that validated different problems): the nested design's two-level bootstrap (the
    seeds, then each drawn seed's problems) and the bootstrap over the pooled (seed, problem) values."""
    from reasonrl.evaluation.scores import bootstrap_ci, crossed_mean_ci, two_level_bootstrap_ci

    if crossed:
        ci = crossed_mean_ci(per_seed, bounds=bounds)
        problems = [_mean([v[p] for v in per_seed]) for p in range(len(per_seed[0]))]
    else:
        ci = two_level_bootstrap_ci(per_seed, n_boot=n_boot, seed=0)
        problems = [x for v in per_seed for x in v]
    return {"value": _mean([_mean(v) for v in per_seed]), "ci": list(ci), "ci_problems": list(bootstrap_ci(problems, n_boot=n_boot, seed=0)),
            "design": "crossed" if crossed else "nested", "per_seed": [_mean(v) for v in per_seed]}


def _crossed(stats: list[dict[str, Any]]) -> bool:
    """Whether the runs validated the same problems in the same order (seeds × problems crossed)."""
    return all(st["where"] == stats[0]["where"] for st in stats)


def _paired(after: dict[int, dict[str, Any]], before: dict[int, dict[str, Any]], key: str, n_boot: int) -> dict[str, Any] | None:
    """``after − before`` paired by seed and problem (the seeds both finished, the same problems):
    per seed, the difference on each problem; intervals as :func:`_with_ci`'s over those differences."""
    seeds = [s for s in sorted(after) if s in before and after[s]["where"] == before[s]["where"]]
    if not seeds:
        return None
    diffs = [[float(a) - float(b) for a, b in zip(after[s][key], before[s][key], strict=True)] for s in seeds]
    return {**_with_ci(diffs, n_boot, _crossed([after[s] for s in seeds]), bounds=(-1.0, 1.0)), "problems": sum(map(len, diffs)), "seeds": seeds}


def _steps_differ(after: dict[int, dict[str, Any]], before: dict[int, dict[str, Any]]) -> list[dict[str, int]]:
    """The paired seeds whose final validations are at different steps (early stopping, or another
    ``val_every`` in a run made elsewhere): their Δ final compares two training lengths, and their
    Δ AUC curves of two spans."""
    return [{"seed": s, "final_step": after[s]["final_step"], "previous_final_step": before[s]["final_step"]} for s in sorted(after)
            if s in before and after[s]["where"] == before[s]["where"] and after[s]["final_step"] != before[s]["final_step"]]


def _dtypes_differ(after: dict[int, dict[str, Any]], before: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The paired seeds whose runs computed in different dtypes (a ladder whose runs ran on machines
    where ``--dtype auto`` means bf16 and fp32: job-array nodes, sessions on other CPUs): their Δ
    compares two dtypes as well as two rungs."""
    return [{"seed": s, "dtype": after[s]["dtype"], "previous_dtype": before[s]["dtype"]} for s in sorted(after)
            if s in before and after[s].get("dtype") and before[s].get("dtype") and after[s]["dtype"] != before[s]["dtype"]]


def summarise(plan_doc: dict[str, Any], out: Path, jobs: dict[str, Job], n_boot: int) -> dict[str, Any]:
    """ablation.json: one entry per rung (the numbers of its finished runs) and each run's status."""
    rows: list[dict[str, Any]] = []
    prev: dict[int, dict[str, Any]] | None = None
    prev_name = None
    by_name: dict[str, dict[int, dict[str, Any]]] = {}
    for r in plan_doc["rungs"]:
        stats: dict[int, dict[str, Any]] = {}
        runs: dict[str, Any] = {}
        for s in plan_doc["seeds"]:
            d = run_dir(out, r["name"], s)
            j = jobs.get(f"{r['name']}/seed-{s}")
            finished = state(d, "train") == "finished"
            st = run_stats(d) if finished else None
            status = "finished" if finished else (j.status if j is not None and j.status in ("failed", "blocked") else "unfinished")
            if finished and st is None:
                status = "no validation"
            runs[str(s)] = {"dir": str(d), "status": status, **({"error": j.error} if j is not None and j.error and not finished else {})}
            if st is not None:
                stats[s] = st
        row: dict[str, Any] = {"name": r["name"], "overrides": r["sets"], "pretrained_critic": r["pretrained_critic"], **({"vs": r["vs"]} if r.get("vs") else {}), "runs": runs,
                               "seeds_finished": sorted(stats)}
        if stats:
            vals = list(stats.values())
            row["metric"] = vals[0]["metric"]
            crossed = _crossed(vals)
            row["final"] = _with_ci([v["final"] for v in vals], n_boot, crossed)
            row["best"] = _with_ci([v["best"] for v in vals], n_boot, crossed)
            row["auc"] = _with_ci([v["auc"] for v in vals], n_boot, crossed)
            for k in ("entropy_final", "clipfrac_upper", "clipfrac_lower", "response_length", "truncated_frac", "ds_rounds", "step_s", "peak_rss_gib",
                      "checkpoint_mib"):
                row[k] = _mean([v[k] for v in vals])
            row["curves"] = {str(s): v["curve"] for s, v in stats.items()}
            row["dtypes"] = {str(s): v["dtype"] for s, v in stats.items()}
            other, other_name = (by_name.get(r["vs"]), r["vs"]) if r.get("vs") else (prev, prev_name)  # (the rung above, or the one it names)
            if other:
                row["vs_previous"] = {"rung": other_name, "final": _paired(stats, other, "final", n_boot), "auc": _paired(stats, other, "auc", n_boot)}
                differ = _steps_differ(stats, other)
                if differ:
                    row["vs_previous"]["steps_differ"] = differ
                dtypes = _dtypes_differ(stats, other)
                if dtypes:
                    row["vs_previous"]["dtypes_differ"] = dtypes
        rows.append(row)
        prev, prev_name = stats, r["name"]
        by_name[r["name"]] = stats
    bad = [f"{r['name']}/seed-{s}" for r in rows for s, v in r["runs"].items() if v["status"] in ("failed", "blocked", "no validation")]
    critics = {label: {"dir": str(j.dir), "status": j.status, **({"error": j.error} if j.error else {})} for label, j in jobs.items() if j.stage == "pretrain-value"}
    bad += [k for k, v in critics.items() if v["status"] in ("failed", "blocked")]
    missing = [f"{r['name']}/seed-{s}" for r in rows for s, v in r["runs"].items() if v["status"] == "unfinished"]
    return {"source": plan_doc["source"], "base": plan_doc["base"], "seeds": plan_doc["seeds"], "steps": plan_doc["steps"], "val_every": plan_doc["val_every"],
            "bootstrap": n_boot, "interval": ("95%, seeds × problems crossed (design 'crossed'): the two-way random-effects t interval, Satterthwaite's df "
                                              "(ci; reasonrl.evaluation.scores.crossed_mean_ci); the percentile bootstrap over the problems of their mean over "
                                              "seeds, the runs taken as fixed (ci_problems). Runs on different problems (design 'nested'): the two-level "
                                              "bootstrap, seeds then each seed's problems (ci), and over the pooled values (ci_problems). vs_previous: "
                                              "against the rung above (or the one the rung names with vs: vs_previous.rung), paired by seed and problem"),
            "rungs": rows, "critics": critics, "failed": bad, "unfinished": missing, "complete": not bad and not missing}
