"""An ablation's table on the console: held-out accuracy, what the training did, what it cost."""

from __future__ import annotations

import math
from typing import Any

def _pct(m: dict[str, Any] | None, signed: bool = False, ci: bool = True) -> str:
    if not m or m.get("value") is None or not math.isfinite(m["value"]):
        return "-"
    f = "{:+.1f}" if signed else "{:.1f}"
    if not ci:
        return f.format(100 * m["value"])
    lo, hi = m["ci"]
    return f"{f.format(100 * m['value'])} [{f.format(100 * lo)},{f.format(100 * hi)}]"


def _num(x: Any, f: str = "{:.3f}") -> str:
    return f.format(x) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def print_table(doc: dict[str, Any], console: Any) -> None:
    """Three tables that fit a log's 80 columns: held-out accuracy (the intervals of best and AUC are
    in ablation.json), what the training did, and what it cost."""
    from rich import box
    from rich.table import Table

    metric = next((r["metric"] for r in doc["rungs"] if r.get("metric")), "avg@n")
    acc = Table(title=f"ablation ({doc['source']}): validation {metric} in % [95% CI: seeds × problems]", box=box.SIMPLE_HEAD,
                caption="Δ: to the rung above, paired by seed and problem; AUC: the validation curve's mean level")
    for c in ("rung", "seeds", "final", "best", "AUC", "Δ final"):
        acc.add_column(c, justify="left" if c == "rung" else "right")
    train = Table(title="training (mean over steps and seeds; entropy: the last step's)", box=box.SIMPLE_HEAD)
    for c in ("rung", "entropy", "clip↑", "clip↓", "len", "trunc", "ds rnd"):
        train.add_column(c, justify="left" if c == "rung" else "right")
    cost = Table(title="cost (mean over seeds)", box=box.SIMPLE_HEAD,
                 caption="peak: a run's largest resident memory (trainer and engine); checkpoint: its last one's size (- once deleted)")
    for c in ("rung", "s/step", "peak GiB", "checkpoint MiB"):
        cost.add_column(c, justify="left" if c == "rung" else "right")
    notes = []
    for r in doc["rungs"]:
        bad = [s for s, v in r["runs"].items() if v["status"] not in ("finished", "unfinished")]
        seeds = f"{len(r['seeds_finished'])}/{len(r['runs'])}" + (f" [red]{len(bad)} failed[/]" if bad else "")
        vs = (r.get("vs_previous") or {}).get("final")
        differ = (r.get("vs_previous") or {}).get("steps_differ") or []
        if differ:  # a Δ over two training lengths: marked, and said under the table
            notes.append(f"† {r['name']}: final validations at different steps ("
                         + ", ".join(f"seed {d['seed']}: step {d['final_step']} vs {d['previous_final_step']}" for d in differ) + ")"
                         + " (early stopping, or another val_every: the Δ compares two training lengths)")
        dtypes = (r.get("vs_previous") or {}).get("dtypes_differ") or []
        if dtypes:  # a Δ over two dtypes (runs on machines where --dtype auto differs): marked, and said
            notes.append(f"‡ {r['name']}: runs in different dtypes ("
                         + ", ".join(f"seed {d['seed']}: {d['dtype']} vs {d['previous_dtype']}" for d in dtypes) + ")"
                         + " (--dtype auto on machines with and without native bf16: the Δ compares two dtypes too)")
        acc.add_row(r["name"], seeds, _pct(r.get("final")), _pct(r.get("best"), ci=False), _pct(r.get("auc"), ci=False),
                    _pct(vs, signed=True) + ("†" if differ else "") + ("‡" if dtypes else ""))
        train.add_row(r["name"], _num(r.get("entropy_final")), _num(r.get("clipfrac_upper"), "{:.4f}"), _num(r.get("clipfrac_lower"), "{:.4f}"),
                      _num(r.get("response_length"), "{:.1f}"), _num(r.get("truncated_frac"), "{:.2f}"), _num(r.get("ds_rounds"), "{:.2f}"))
        cost.add_row(r["name"], _num(r.get("step_s"), "{:.2f}"), _num(r.get("peak_rss_gib"), "{:.2f}"), _num(r.get("checkpoint_mib"), "{:.1f}"))
    named = [f"{r['name']} against {r['vs']}" for r in doc["rungs"] if r.get("vs") and r.get("vs_previous")]
    if named:
        acc.caption = f"{acc.caption}; Δ of " + ", ".join(named)
    if notes:
        acc.caption = f"{acc.caption}\n" + "\n".join(notes)
    console.print(acc)
    console.print(train)
    console.print(cost)
