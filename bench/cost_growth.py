"""Cost growth: a step's time by phase as the response cap L_max and the group size G grow.

    .venv/bin/python bench/cost_growth.py                                   # L 64, 256, 1024 x G 4, 8, 16 (hours on 2 cores)
    .venv/bin/python bench/cost_growth.py --points 64x4 --steps 1 --warmup 0   # the smallest point, one step

Each point is one fresh `reasonrl train` process (the real CLI) on MATH-500 prompts in the DAPO
template (bench/vs_trl.py's decode-heavy regime: SmolLM2 fills long caps), 8 prompts per step,
one update per step, the loss of bench/vs_trl.py (--algo grpo --loss-agg token-mean --eps-high
0.28: no dynamic sampling, so every step does the same work); engine and dtype are reasonrl's
defaults unless given. The table gives the mean over the timed steps of each phase's seconds
(``perf/…_s``) and share of the step, and the step's share of its bound (``perf/step_bound_frac``).
Then the cost per token as L_max grows, per G: generation's ms per generated token and the update's
ms per trained token (prompt + response tokens, ``perf/train_tokens``), each against the smallest
L_max's at that G (the target: within ±25% from L_max 128 to 1024).

    .venv/bin/python bench/cost_growth.py --regime long --lengths 128,256,512,1024 --groups 8   # the per-token target's sweep
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path

import harness as H

PHASES = ("generate", "score", "prepare", "update_actor", "weight_sync")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default="default")
    ap.add_argument("--lengths", default="64,256,1024", help="response caps L_max")
    ap.add_argument("--groups", default="4,8,16", help="group sizes G")
    ap.add_argument("--points", default=None, help="only these LxG points, e.g. 64x4,256x8 (default: the whole grid)")
    ap.add_argument("--regime", default="math", choices=sorted(H.REGIMES), help="prompts (prepared as in bench/vs_trl.py)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of the means")
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--workdir", default="/tmp/reasonrl-bench")
    ap.add_argument("--json", default=None, help="also write the per-point means here")
    ap.add_argument("--train-args", default="", help="more `reasonrl train` options for every point, e.g. --train-args=--no-enforce-eager (one string, joined by '=')")
    ap.add_argument("--tag", default="", help="suffix of the points' run directories and logs (runs that differ only in --train-args)")
    a = ap.parse_args()
    if not 0 <= a.warmup < a.steps:
        ap.error("--warmup must be below --steps: at least one step is timed")
    from reasonrl.models import resolve_model

    model = str(resolve_model(a.model))
    grid = [(int(L), int(G)) for L in a.lengths.split(",") for G in a.groups.split(",")]
    if a.points:
        grid = [tuple(int(x) for x in p.split("x")) for p in a.points.split(",")]
    work = Path(a.workdir)
    data = H.prepare(H.REGIMES[a.regime], work)
    rows = []
    for L, G in grid:
        name = f"growth-{L}x{G}{'-' + a.tag if a.tag else ''}"
        out = work / "runs" / name
        args = ["--data", data, "--model", model, "--algo", "grpo", "--loss-agg", "token-mean", "--eps-high", "0.28", "--engine", a.engine,
                "--dtype", a.dtype, "--steps", a.steps, "--prompts-per-step", a.prompts, "--group-size", G, "--max-response-len", L,
                "--max-prompt-len", 1024, "--mini-batch-size", a.prompts * G, "--micro-batch-size", min(a.micro_batch_size, a.prompts * G), "--seed", 0, *shlex.split(a.train_args)]
        lines = H.train(args, out, work / "logs" / f"{name}.log")[a.warmup:]
        cfg = json.loads((out / "config.json").read_text())

        def mean(key: str) -> float:
            return statistics.fmean(m.get(key, 0.0) for m in lines)

        r = {"L": L, "G": G, "engine": cfg["engine_resolved"], "dtype": cfg["dtype_resolved"], "rows": a.prompts * G,
             "gen_tokens": mean("rollout/gen_tokens"), "train_tokens": mean("perf/train_tokens"), "truncated": mean("rollout/truncated_frac"), "step_s": mean("perf/step_s"),
             "bound_frac": mean("perf/step_bound_frac"), **{p: mean(f"perf/{p}_s") for p in PHASES}}
        r["other"] = r["step_s"] - sum(r[p] for p in PHASES)
        rows.append(r)
        print(f"L {L} G {G}: step {r['step_s']:.1f}s over {len(lines)} timed step(s)", flush=True)
    print(f"\n{a.prompts} prompts per step, {a.regime} prompts, engine {rows[0]['engine']}, {rows[0]['dtype']}; seconds (share of the step)")
    print(f"{'L':>5s} {'G':>3s} {'rows':>4s} {'gen tok':>8s} {'trunc':>5s} {'step s':>8s} " + " ".join(f"{p:>15s}" for p in (*PHASES, "other"))
          + f" {'of bound':>8s}")
    for r in rows:
        print(f"{r['L']:5d} {r['G']:3d} {r['rows']:4d} {r['gen_tokens']:8.0f} {r['truncated']:5.0%} {r['step_s']:8.1f} "
              + " ".join(f"{r[p]:7.1f} ({r[p] / r['step_s']:4.0%})" for p in (*PHASES, "other")) + f" {r['bound_frac']:8.1%}")
    print("\ncost per token: generation ms per generated token, update ms per trained token; x: against the smallest L_max at that G")
    print(f"{'L':>5s} {'G':>3s} {'gen ms/tok':>10s} {'x':>6s} {'upd ms/tok':>10s} {'x':>6s}")
    for r in rows:
        r["gen_ms_per_token"] = 1e3 * r["generate"] / max(r["gen_tokens"], 1)
        r["update_ms_per_token"] = 1e3 * r["update_actor"] / max(r["train_tokens"], 1)
    smallest = {r["G"]: r for r in sorted(rows, key=lambda x: -x["L"])}  # per G, its smallest L_max's row
    for r in rows:
        first = smallest[r["G"]]
        print(f"{r['L']:5d} {r['G']:3d} {r['gen_ms_per_token']:10.2f} {r['gen_ms_per_token'] / first['gen_ms_per_token']:5.2f}x "
              f"{r['update_ms_per_token']:10.3f} {r['update_ms_per_token'] / first['update_ms_per_token']:5.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "points": rows}, indent=1))


if __name__ == "__main__":
    main()
