"""How often the learning tests pass: each --algo row of tests/train/test_learning.py over seeds,
thread counts and dtypes, each run in its own process (clean torch state, OMP_NUM_THREADS set).

Records every run's per-step reward and accuracy (``--steps`` steps; the LR is constant, so the
first 8 steps of a 12-step run are the 8-step run) to ``OUT/runs.jsonl``, one line per run, and
prints for each row how often the test's assertion (``test_learning.learned``) holds. Resumable:
a rerun skips the runs already recorded.

    .venv/bin/python bench/learning_seeds.py --seeds 0-4 --threads 1,2 --dtypes fp32,bf16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = ["grpo", "dapo", "gspo", "cispo", "drgrpo", "vapo"]

WORKER = r"""
import json, sys
sys.path[:0] = [{tests!r}, {tests_train!r}]
import test_learning as tl
algo, seed, dtype, steps, fmt, data, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]
hist = tl.run_row(algo, fmt, data, out, seed=seed, dtype=dtype, steps=steps)
print("RESULT " + json.dumps({{"reward": [h["rollout/reward_mean"] for h in hist], "acc": [h["rollout/acc_mean"] for h in hist]}}))
"""

SETUP = r"""
import sys
sys.path[:0] = [{tests!r}, {tests_train!r}]
from pathlib import Path
import test_learning as tl
from reasonrl.models.tiny import build_tiny_model
from toyhelp import sft_answer_format
w = Path(sys.argv[1])
sft_answer_format(build_tiny_model(w / "tiny"), w / "fmt")
tl.prepare_toy(w / "data")
"""


def _ints(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "learning_seeds"))
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tag", default="", help="a name for the test's settings measured (recorded with each run; runs of another tag are not redone)")
    a = ap.parse_args()
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "train")]
    import test_learning as tl

    out = Path(a.out)
    work = out / "work"
    out.mkdir(parents=True, exist_ok=True)
    fmts = dict(tests=str(ROOT / "tests"), tests_train=str(ROOT / "tests" / "train"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    if not (work / "data" / "manifest.json").exists():
        subprocess.run([sys.executable, "-c", SETUP.format(**fmts), str(work)], check=True, env={**env, "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    log = out / "runs.jsonl"
    done = {(r["algo"], r["seed"], r["dtype"], r["threads"], r["steps"], r.get("tag", "")) for r in map(json.loads, log.read_text().splitlines())} if log.exists() else set()
    combos = [(algo, s, d, t) for d in a.dtypes.split(",") for t in _ints(a.threads) for s in _ints(a.seeds) for algo in a.rows.split(",")]
    for algo, seed, dtype, threads in combos:
        if (algo, seed, dtype, threads, a.steps, a.tag) in done:
            continue
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", WORKER.format(**fmts), algo, str(seed), dtype, str(a.steps), str(work / "fmt"), str(work / "data"),
                            str(work / f"run_{algo}_{seed}_{dtype}_{threads}{a.tag}")], env={**env, "OMP_NUM_THREADS": str(threads)}, cwd=ROOT,
                           capture_output=True, text=True)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode != 0 or not line:
            print(f"{algo} seed {seed} {dtype} t{threads}: failed (rc {p.returncode}): {p.stderr.strip().splitlines()[-1:]}", flush=True)
            continue
        rec = {"algo": algo, "tag": a.tag, "seed": seed, "dtype": dtype, "threads": threads, "steps": a.steps, "seconds": round(time.perf_counter() - t0, 1),
               **json.loads(line[0][len("RESULT "):])}
        with log.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        ok = tl.learned(rec["reward"][: tl.STEPS], rec["acc"][: tl.STEPS])
        print(f"{algo:7s}{a.tag} seed {seed} {dtype} t{threads}: {'pass' if ok else 'FAIL'}  reward {[round(r, 2) for r in rec['reward']]}", flush=True)
    summarize(log, tl)


def summarize(log: Path, tl) -> None:
    recs = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    print(f"\n{'row':12s} {'dtype':5s} {'thr':>3s}  passes (test's assertion at {tl.STEPS} steps)")
    keys = sorted({(r["algo"] + r.get("tag", ""), r["dtype"], r["threads"]) for r in recs})
    for k in keys:
        rs = [r for r in recs if (r["algo"] + r.get("tag", ""), r["dtype"], r["threads"]) == k]
        ok = sum(tl.learned(r["reward"][: tl.STEPS], r["acc"][: tl.STEPS]) for r in rs)
        print(f"{k[0]:12s} {k[1]:5s} {k[2]:3d}  {ok}/{len(rs)}")


if __name__ == "__main__":
    main()
