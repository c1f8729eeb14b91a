"""The long-CoT ladders' curves (issue 39): from a `reasonrl ablate` directory whose runs kept their
rollouts (`keep_rollouts = true`), per rung and seed and step, what the policy wrote and how it did.

    python bench/long_cot.py runs/ablate-length --name length --out docs/ablations

Per step, from ``rollouts/step_N.parquet`` (every response generated that step, kept by dynamic
sampling or not): the mean response length (tokens), of the right and of the wrong ones apart (and
within a prompt: the wrong ones' length minus the right ones' in each group that has both), the
share that writes the steps (bench/cot_task.py's rule: at least 2 ``=`` before the last
``Answer:``), the share that runs on past its answer (more than 20 characters after the first
``Answer: <integer>``), of the right and the wrong ones apart, the accuracy. From
``metrics.jsonl``: entropy, the clipped fractions (upper, lower), validation accuracy and response
length at each validation; on a run with a critic (PPO, VC-PPO) also its value against the return
it is trained on, explained variance and value loss per step, and value and advantage by position at
the first and the last step. From ``validation.jsonl``: the change of validation accuracy from
step 0 to the last validation, paired by seed and problem, with the crossed interval `reasonrl
ablate` uses (seeds × problems, reasonrl.evaluation.scores.crossed_mean_ci).

Writes ``<out>/<name>-curves.json`` (per rung: the summary and every seed's curves),
``<out>/<name>-curves.png`` and, where rungs have a critic, ``<out>/<name>-critic.png``. Reads
finished and unfinished runs alike (say which in the JSON), so it can be run while a ladder is still
going.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cot_task import writes_steps  # noqa: E402


# Per step, from a critic's run's metrics.jsonl (None on a run without a critic).
CRITIC_KEYS = ("value_mean", "returns_mean", "explained_variance", "vf_loss")


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.fmean(xs) if xs else None


def _jsonl(p: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.is_file() else []


_ANSWER = re.compile(r"Answer:\s*-?\d+\.?")


def runs_on(response: str) -> bool:
    """Text after the first ``Answer: <integer>`` (more than 20 characters): the response goes on
    once it has answered (an explanation, a repeat), which the reward neither pays nor punishes."""
    m = _ANSWER.search(response)
    return m is not None and len(response[m.end():].strip()) > 20


def step_stats(parquet: Path) -> dict[str, Any]:
    import pandas as pd

    d = pd.read_parquet(parquet, columns=["group", "response", "correct", "length", "kept", "finish_reason"])
    right, wrong = d[d["correct"]], d[~d["correct"]]
    steps = d["response"].map(writes_steps)
    on = d["response"].map(runs_on)
    # Within a prompt: per group with a right and an untruncated wrong response, the wrong ones' mean
    # length minus the right ones' (a harder prompt's responses are longer and more often wrong, so
    # the pooled lengths mix the prompts' difficulty into the comparison; the cut ones end at the cap).
    # The cut ones count in a second measure at the cap's length (censored: a lower bound on how long
    # they would have run), for a run whose wrong responses run on to the cap.
    within, within_cut = [], []
    for _, g in d.groupby("group"):
        r, w = g[g["correct"]], g[~g["correct"] & (g["finish_reason"] != "length")]
        if len(r) and len(w):
            within.append(float(w["length"].mean() - r["length"].mean()))
        if len(r) and (~g["correct"]).any():
            within_cut.append(float(g[~g["correct"]]["length"].mean() - r["length"].mean()))
    return {"responses": int(len(d)), "length": float(d["length"].mean()), "length_right": float(right["length"].mean()) if len(right) else None,
            "length_wrong": float(wrong["length"].mean()) if len(wrong) else None, "acc": float(d["correct"].mean()),
            "steps_share": float(steps.mean()), "acc_steps": float(d["correct"][steps].mean()) if steps.any() else None,
            "acc_direct": float(d["correct"][~steps].mean()) if (~steps).any() else None,
            "truncated": float((d["finish_reason"] == "length").mean()),
            "runs_on_share": float(on.mean()), "runs_on_right": float(on[d["correct"]].mean()) if len(right) else None,
            "runs_on_wrong": float(on[~d["correct"]].mean()) if len(wrong) else None, "wrong_minus_right_within": within,
            "wrong_minus_right_within_cut_included": within_cut}


def run_curves(run: Path) -> dict[str, Any]:
    metrics = {m["step"]: m for m in _jsonl(run / "metrics.jsonl")}
    steps = sorted(int(p.stem.split("_")[1]) for p in (run / "rollouts").glob("step_*.parquet")) if (run / "rollouts").is_dir() else []
    per_step = []
    for s in steps:
        m = metrics.get(s, {})
        per_step.append({"step": s, **step_stats(run / "rollouts" / f"step_{s}.parquet"), "entropy": m.get("actor/entropy"),
                         "clip_upper": m.get("actor/clipfrac_upper"), "clip_lower": m.get("actor/clipfrac_lower"), "step_s": m.get("perf/step_s"),
                         # a critic's runs (PPO, VC-PPO): its value against the return it is trained on, and by position
                         **{k: m.get(f"critic/{k}") for k in CRITIC_KEYS},
                         "value_bias": m["critic/value_mean"] - m["critic/returns_mean"] if "critic/value_mean" in m and "critic/returns_mean" in m else None})
    val = [{"step": s, "acc": m["val/avg@2"] if "val/avg@2" in m else next((v for k, v in m.items() if k.startswith("val/avg@") and k.count("/") == 1
                                                                           and not k.endswith(("_low", "_high"))), None),
            "length": m.get("val/response_length_mean")} for s, m in sorted(metrics.items()) if any(k.startswith("val/avg@") for k in m)]
    finished = (run / "manifest.json").is_file()
    # The bias picture over training: value and advantage by position (up to 16 bins of the positions
    # up to the step's longest response) at the first and the last step, where the run has a critic.
    logged = [s for s in steps if metrics.get(s, {}).get("critic/value_by_position")]
    by_position = {end: {"step": s, "value": metrics[s]["critic/value_by_position"], "advantage": metrics[s].get("actor/advantage_by_position")}
                   for end, s in (("first", logged[0]), ("last", logged[-1]))} if logged else None
    return {"finished": finished, "steps": per_step, "validation": val, "by_position": by_position}


def val_change(runs: list[Path]) -> dict[str, Any] | None:
    """Last validation − step 0's, paired by seed and problem, with the crossed interval (over the
    finished runs while there are some)."""
    runs = [r for r in runs if (r / "manifest.json").is_file()] or runs
    from reasonrl.evaluation.scores import bootstrap_ci, crossed_mean_ci

    diffs = []
    for run in runs:
        recs = sorted(_jsonl(run / "validation.jsonl"), key=lambda r: r["step"])
        key = next((k for r in recs for k in r if k.startswith("avg@")), None)
        if len(recs) < 2 or key is None or recs[0]["step"] != 0:
            continue
        first, last = recs[0], recs[-1]
        if first["where"] != last["where"]:
            continue
        diffs.append((last["step"], [float(b) - float(a) for a, b in zip(first[key], last[key], strict=True)]))
    if not diffs:
        return None
    last_steps = {s for s, _ in diffs}
    per_seed = [d for _, d in diffs]
    ci = crossed_mean_ci(per_seed, bounds=(-1.0, 1.0)) if len(per_seed) > 1 else bootstrap_ci(per_seed[0], n_boot=2000, seed=0)
    return {"value": statistics.fmean(statistics.fmean(d) for d in per_seed), "ci": list(ci), "seeds": len(per_seed),
            "interval": "crossed (seeds x problems)" if len(per_seed) > 1 else "one seed: bootstrap over the problems",
            "last_steps": sorted(last_steps), "per_seed": [statistics.fmean(d) for d in per_seed]}


def within_prompt(curves: dict[str, Any], lo: int, hi: int, key: str = "wrong_minus_right_within") -> dict[str, Any] | None:
    """One seed's wrong − right length within a prompt over steps lo..hi: the mean over the groups
    that have both (each group one prompt's responses at one step), with a t interval over the groups."""
    from reasonrl.evaluation.scores import student_t_quantile

    xs = [x for r in curves["steps"] if lo <= r["step"] <= hi for x in r.get(key, [])]
    if not xs:
        return None
    m = statistics.fmean(xs)
    half = student_t_quantile(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.inf
    return {"value": m, "ci": [m - half, m + half], "groups": len(xs)}


def summarise(rung_dir: Path) -> dict[str, Any]:
    runs = sorted((p for p in rung_dir.glob("seed-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    seeds = {p.name: run_curves(p) for p in runs}
    done = [c for c in seeds.values() if c["finished"] and c["steps"]]
    full = done or [c for c in seeds.values() if c["steps"]]  # (the summary is over the finished seeds while there are some)
    common = min((c["steps"][-1]["step"] for c in full), default=0)

    def at(step: int, key: str) -> float | None:
        return _mean([next((r[key] for r in c["steps"] if r["step"] == step), None) for c in full])

    def window(key: str, lo: int, hi: int) -> float | None:
        """The mean over the seeds of each seed's mean over steps lo..hi (steps where it is defined:
        a step with no right response has no length of the right ones)."""
        return _mean([_mean([r[key] for r in c["steps"] if lo <= r["step"] <= hi]) for c in full])

    first_val = _mean([c["validation"][0]["acc"] for c in full if c["validation"] and c["validation"][0]["step"] == 0])
    last_val = _mean([c["validation"][-1]["acc"] for c in full if c["validation"]])
    out = {"seeds": list(seeds), "finished": [k for k, c in seeds.items() if c["finished"]], "summary_over": "finished seeds" if done else "all seeds so far",
           "common_last_step": common,
           "length_first": at(1, "length"), "length_last": at(common, "length") if common else None,
           # right and wrong apart, over the first and the last 5 steps (a single step has few right ones)
           **{f"length_{k}_{end}5": window(f"length_{k}", *span) if common else None for k in ("right", "wrong")
              for end, span in (("first", (1, 5)), ("last", (common - 4, common)))},
           "wrong_minus_right_within_last5": {k: within_prompt(c, common - 4, common) for k, c in seeds.items()} if common else None,
           "wrong_minus_right_within_cut_included_last5": {k: within_prompt(c, common - 4, common, "wrong_minus_right_within_cut_included")
                                                           for k, c in seeds.items()} if common else None,
           **{f"runs_on_{k}_{end}5": window(f"runs_on_{k}", *span) if common else None for k in ("share", "right", "wrong")
              for end, span in (("first", (1, 5)), ("last", (common - 4, common)))},
           "truncated_first": at(1, "truncated"), "truncated_last5": window("truncated", common - 4, common) if common else None,
           "steps_share_first": at(1, "steps_share"), "steps_share_last": at(common, "steps_share") if common else None,
           "entropy_first": _mean([next((r["entropy"] for r in c["steps"] if r["entropy"] is not None), None) for c in full]),  # (a step with no update has none)
           "entropy_last": at(common, "entropy") if common else None,
           "entropy_min": _mean([min((r["entropy"] for r in c["steps"] if r["entropy"] is not None), default=None) for c in full]),
           "val_length_first": _mean([c["validation"][0]["length"] for c in full if c["validation"]]),
           "val_length_last": _mean([c["validation"][-1]["length"] for c in full if c["validation"]]),
           "val_acc_first": first_val, "val_acc_last": last_val, "val_change": val_change(runs),
           # a critic's bias: its value minus the return, the mean over the step's tokens
           **{f"value_bias_{end}5": window("value_bias", *span) if common else None for end, span in (("first", (1, 5)), ("last", (common - 4, common)))},
           "clip_upper_mean": _mean([r["clip_upper"] for c in full for r in c["steps"]]),
           "clip_lower_mean": _mean([r["clip_lower"] for c in full for r in c["steps"]]),
           "step_s_median": statistics.median([r["step_s"] for c in full for r in c["steps"] if r["step_s"]]) if full else None}
    if out["length_first"] and out["length_last"]:
        out["length_ratio"] = out["length_last"] / out["length_first"]
    return {"summary": out, "seeds": seeds}


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("length", "response length (tokens)"), ("steps_share", "share writing the steps"), ("acc", "training accuracy"),
              ("entropy", "entropy (nats/token, log scale)"), ("length_right", "length of right responses"), ("length_wrong", "length of wrong responses")]
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5))
    axes = axes.ravel()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # The thick line: the mean over the seeds every rung has (a rung's mean over other seeds than its
    # neighbours' would compare seeds, not rungs, where the seeds go different ways).
    common = sorted(set.intersection(*(set(k for k, v in r["seeds"].items() if v["steps"]) for r in doc["rungs"].values())) if doc["rungs"] else set(),
                    key=lambda k: int(k.split("-")[1]))
    for i, (rung, r) in enumerate(doc["rungs"].items()):
        c = colours[i % len(colours)]
        for j, (key, title) in enumerate(panels):
            ax = axes[j]
            for seed in r["seeds"].values():
                xs = [x["step"] for x in seed["steps"] if x.get(key) is not None]
                ys = [x[key] for x in seed["steps"] if x.get(key) is not None]
                ax.plot(xs, ys, color=c, alpha=0.25, lw=0.8)
            both = [r["seeds"][k] for k in common]
            steps = sorted({x["step"] for s in both for x in s["steps"]})
            mean = [(_mean([next((x[key] for x in s["steps"] if x["step"] == st), None) for s in both])) for st in steps]
            ax.plot([s for s, m in zip(steps, mean) if m is not None], [m for m in mean if m is not None], color=c, lw=2, label=rung)
            ax.set_title(title, fontsize=10)
            if key == "entropy":
                ax.set_yscale("log")  # (a collapse is a fall by orders of magnitude: 2 -> 0.02 against 2 -> 0.2)
        for k, (key, title) in enumerate((("acc", "validation accuracy (avg@2)"), ("length", "validation response length"))):
            ax = axes[6 + k]
            for seed in r["seeds"].values():
                ax.plot([v["step"] for v in seed["validation"]], [v[key] for v in seed["validation"]], color=c, alpha=0.35, lw=1, marker="o", ms=3)
            ax.set_title(title, fontsize=10)
    for ax in axes:
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{doc['name']}: {doc['source']} (thin: each seed; thick: the mean over {', '.join(common) or 'no seed'}, the seeds every rung has)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_critic(doc: dict[str, Any], path: Path) -> bool:
    """The critics' side of a ladder with PPO rungs: the value's bias against the return it is
    trained on and its explained variance over steps, and value and advantage by position at the
    first and the last step (each seed). False (nothing drawn) without one."""
    rungs = {n: r for n, r in doc["rungs"].items() if any(x.get("value_mean") is not None for c in r["seeds"].values() for x in c["steps"])}
    if not rungs:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    axes = axes.ravel()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = list(doc["rungs"])
    for rung, r in rungs.items():
        c = colours[names.index(rung) % len(colours)]
        for seed in r["seeds"].values():
            rows = [x for x in seed["steps"] if x.get("value_bias") is not None]
            axes[0].plot([x["step"] for x in rows], [x["value_bias"] for x in rows], color=c, alpha=0.6, lw=1,
                         label=rung if seed is next(iter(r["seeds"].values())) else None)
            rows = [x for x in seed["steps"] if x.get("explained_variance") is not None]
            axes[3].plot([x["step"] for x in rows], [max(x["explained_variance"], -1.0) for x in rows], color=c, alpha=0.6, lw=1)
        for k, (end, key) in enumerate((("first", "value"), ("last", "value"), ("first", "advantage"), ("last", "advantage"))):
            # (bins of the positions up to the step's longest response, one a position below 16
            # tokens: drawn against the position as a share of that length, each seed apart)
            for c_ in r["seeds"].values():
                v = (c_.get("by_position") or {}).get(end, {}).get(key)
                if v:
                    axes[(1, 2, 4, 5)[k]].plot([(i + 0.5) / len(v) for i in range(len(v))], v, color=c, alpha=0.6, lw=1, marker="o", ms=2)
    axes[0].axhline(0, color="grey", lw=0.5)
    axes[0].set_title("value − return, mean over the step's tokens (each seed)", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[3].set_title("explained variance (floored at −1)", fontsize=10)
    for k, title in enumerate(("value by position, first step", "value by position, last step",
                               "advantage by position, first step", "advantage by position, last step")):
        ax = axes[(1, 2, 4, 5)[k]]
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_title(f"{title} (each seed)", fontsize=10)
        ax.set_xlabel("token position / the step's longest response", fontsize=8)
    for ax in (axes[0], axes[3]):
        ax.set_xlabel("step", fontsize=8)
    fig.suptitle(f"{doc['name']}: the critics ({doc['source']})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ablation", type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "ablations")
    a = ap.parse_args()
    plan = json.loads((a.ablation / "plan.json").read_text())
    rungs = {r["name"]: summarise(a.ablation / r["name"]) for r in plan["rungs"] if (a.ablation / r["name"]).is_dir()}
    doc = {"name": a.name, "source": plan.get("source"), "command": f"python bench/long_cot.py {a.ablation} --name {a.name}",
           "steps_rule": "writes the steps: at least 2 '=' before the last 'Answer:' (bench/cot_task.py)", "rungs": rungs}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}-curves.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, a.out / f"{a.name}-curves.png")
    if plot_critic(doc, a.out / f"{a.name}-critic.png"):
        print(f"critics: {a.out / (a.name + '-critic.png')}")
    for name, r in rungs.items():
        s = r["summary"]
        vc = s["val_change"]
        print(f"{name}: seeds {len(s['seeds'])} (finished {len(s['finished'])}), steps to {s['common_last_step']}; length {s['length_first']} → "
              f"{s['length_last']}; steps share {s['steps_share_first']} → {s['steps_share_last']}; val {s['val_acc_first']} → {s['val_acc_last']}"
              + (f" (Δ {vc['value']:+.3f} [{vc['ci'][0]:+.3f}, {vc['ci'][1]:+.3f}])" if vc else ""))
        for seed, w in (s["wrong_minus_right_within_last5"] or {}).items():
            cut = (s["wrong_minus_right_within_cut_included_last5"] or {}).get(seed)
            if w:
                print(f"  {seed}: wrong − right within a prompt, last 5 steps: {w['value']:+.1f} [{w['ci'][0]:+.1f}, {w['ci'][1]:+.1f}] tokens over {w['groups']} groups"
                      + (f"; the cut ones included at the cap: {cut['value']:+.1f} [{cut['ci'][0]:+.1f}, {cut['ci'][1]:+.1f}] over {cut['groups']}" if cut else ""))


if __name__ == "__main__":
    main()
