"""Issue 38, part 5: does training on off-policy tokens still learn? Reads the ablation of
`bench/offpolicy.toml` (synchronous, --async-steps 1, --partial-rollout-len 40; the main job's DAPO
recipe, 3 seeds) and reports, per rung:

- the validation avg@2 at the last step with its interval, and the paired difference to the
  synchronous rung (both from the ablation's own table, ``ablation.json``: seeds × problems crossed);
- per step, mean over seeds (and each seed's curve in the JSON): the rollout/trainer mismatch
  (``rollout/mismatch_kl``: k3 estimate of KL(π_sampler ‖ π_old) per token; ``rollout/mismatch_k1``),
  the staleness (``rollout/staleness_mean``, ``_max``, ``rollout/stale_token_frac``), the default
  correction's mean weight and truncated share (``actor/correction_*``), and the seconds per step.

    python bench/offpolicy.py runs/ablate-offpolicy --out bench/results/offpolicy/summary.json

Reads finished and unfinished runs alike (the JSON says which), so it can run while the ablation goes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

KEYS = ("rollout/mismatch_kl", "rollout/mismatch_k1", "rollout/staleness_mean", "rollout/staleness_max", "rollout/stale_token_frac",
        "actor/correction_weight_mean", "actor/correction_truncated_frac", "rollout/response_length_mean", "perf/step_s")


def _jsonl(p: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.is_file() else []


def _mean(xs: list[Any]) -> float | None:
    xs = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return statistics.fmean(xs) if xs else None


def run_curves(run: Path) -> dict[str, Any]:
    """One run's per-step values of ``KEYS`` (None where a step did not log one: no update, or no stale token)."""
    rows = {int(m["step"]): m for m in _jsonl(run / "metrics.jsonl") if "step" in m}
    steps = sorted(rows)
    return {"finished": (run / "manifest.json").is_file(), "steps": steps, **{k: [rows[s].get(k) for s in steps] for k in KEYS}}


def summarise(abl: Path) -> dict[str, Any]:
    table = json.loads((abl / "ablation.json").read_text()) if (abl / "ablation.json").is_file() else {"rungs": []}
    rows = {r["name"]: r for r in table["rungs"]}
    plan = json.loads((abl / "plan.json").read_text())
    out: dict[str, Any] = {"ablation": str(abl), "interval": table.get("interval"), "rungs": {}}
    for r in plan["rungs"]:
        seeds = {s: run_curves(abl / r["name"] / f"seed-{s}") for s in plan["seeds"]}
        seeds = {s: c for s, c in seeds.items() if c["steps"]}
        row = rows.get(r["name"], {})
        mean = {k: _mean([v for c in seeds.values() for v in c[k]]) for k in KEYS}
        by_step: dict[str, list[float | None]] = {}
        steps = sorted({s for c in seeds.values() for s in c["steps"]})
        for k in KEYS:
            by_step[k] = [_mean([c[k][c["steps"].index(st)] for c in seeds.values() if st in c["steps"]]) for st in steps]
        out["rungs"][r["name"]] = {"overrides": r["sets"], "seeds_finished": row.get("seeds_finished", []), "final": row.get("final"),
                                   "vs": row.get("vs_previous"), "mean_over_steps": mean, "max_staleness": max(
                                       (v for c in seeds.values() for v in c["rollout/staleness_max"] if v is not None), default=None),
                                   "steps": steps, "by_step": by_step, "seeds": {str(s): c for s, c in seeds.items()}}
    return out


def _pct(d: dict[str, Any] | None, signed: bool = False) -> str:
    if not d:
        return "-"
    f = "{:+.1f}" if signed else "{:.1f}"
    ci = d.get("ci")
    return f.format(100 * d["value"]) + (f" [{f.format(100 * ci[0])}, {f.format(100 * ci[1])}]" if ci else "")


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else fmt.format(x)


def markdown(doc: dict[str, Any]) -> str:
    lines = ["| rung | seeds | val avg@2 at step 8 [95% CI] | Δ to synchronous (paired) | mismatch KL (k3) | staleness mean / max | stale tokens | correction weight / truncated | s/step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in doc["rungs"].items():
        m = r["mean_over_steps"]
        vs = r["vs"]["final"] if r["vs"] else None
        lines.append(f"| {name} | {len(r['seeds_finished'])} | {_pct(r['final'])} | {_pct(vs, signed=True)} | {_num(m['rollout/mismatch_kl'], '{:.4f}')} | "
                     f"{_num(m['rollout/staleness_mean'], '{:.2f}')} / {_num(r['max_staleness'], '{:.0f}')} | {_num(m['rollout/stale_token_frac'], '{:.2f}')} | "
                     f"{_num(m['actor/correction_weight_mean'], '{:.3f}')} / {_num(m['actor/correction_truncated_frac'], '{:.4f}')} | {_num(m['perf/step_s'], '{:.1f}')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ablation", type=Path)
    ap.add_argument("--out", type=Path, help="the summary JSON")
    a = ap.parse_args()
    doc = summarise(a.ablation)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))
    for name, r in doc["rungs"].items():
        kl = ", ".join(_num(x, "{:.4f}") for x in r["by_step"]["rollout/mismatch_kl"])
        st = ", ".join(_num(x, "{:.2f}") for x in r["by_step"]["rollout/staleness_mean"])
        print(f"{name}: mismatch_kl by step [{kl}]; staleness_mean by step [{st}]")


if __name__ == "__main__":
    main()
