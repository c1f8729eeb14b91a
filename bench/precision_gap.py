"""The sampler/trainer gap in fp16, bf16 and fp32, side by side on the same steps.

"Defeating the Training-Inference Mismatch via FP16" (arXiv 2510.26788) reports that sampling and
training in fp16 instead of bf16 removes most of the mismatch between the engine's log-probs and
the trainer's, which TIS-like corrections patch. This runs the main job's DAPO recipe
(``stages/train-dapo-cpu.toml``: SmolLM2-135M-Instruct on the addition chains, vLLM) for a few
steps in each precision with the same seed, and tabulates per step the mismatch metrics the trainer
logs (``rollout/logprob_diff_mean`` = mean |log π_engine − log π_trainer| over response tokens,
``rollout/logprob_diff_max``, ``rollout/mismatch_kl`` = the k3 estimate of KL(π_engine ‖ π_trainer)
per token), the loss scale and the step time. Runs are resumable: a precision whose run logged the steps asked for (or finished) is read back.

    .venv/bin/reasonrl prepare-data data/chains.jsonl --config stages/prepare-data-cpu.toml --out runs/main/data
    .venv/bin/python bench/precision_gap.py [--steps 4] [--dtypes fp16,bf16,fp32] [--out runs/bench-precision]

Writes ``bench/results/precision/gap.json`` and prints a markdown table. The step time is of one
run at a time on whatever else the machine was doing (its load average is recorded): compare the
precisions' ratios, not the absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/mismatch_kl", "actor/loss_scale", "actor/overflow", "perf/step_s",
        "perf/generate_s", "rollout/acc_mean")


def _metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _cpu_flags() -> list[str]:
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f in ("avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dtypes", default="fp16,bf16,fp32")
    ap.add_argument("--data", default="runs/main/data")
    ap.add_argument("--out", default="runs/bench-precision")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=str(ROOT / "bench/results/precision/gap.json"))
    a = ap.parse_args()
    rows: dict[str, list[dict]] = {}
    for dtype in a.dtypes.split(","):
        run = Path(a.out) / dtype
        logged = len(_metrics(run)) if (run / "metrics.jsonl").is_file() else 0
        if logged < a.steps and not (run / "manifest.json").is_file():
            cmd = [sys.executable, "-m", "reasonrl.cli", "train", "--config", str(ROOT / "stages/train-dapo-cpu.toml"), "--data", a.data,
                   "--out", str(run), "--dtype", dtype, "--steps", str(a.steps), "--val-every", "0", "--seed", str(a.seed), "--quiet",
                   "--save-every", "1"] + (["--resume"] if (run / "checkpoints").is_dir() else [])
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
        rows[dtype] = [{k: m.get(k) for k in ("step", *KEYS)} for m in _metrics(run)][: a.steps]
    result = {"command": "python bench/precision_gap.py " + " ".join(sys.argv[1:]), "machine": platform.processor() or platform.machine(),
              "cpu_flags": _cpu_flags(), "loadavg": os.getloadavg(), "steps": a.steps, "seed": a.seed, "runs": rows}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    print("| dtype | step | mean abs log-prob diff | max abs log-prob diff | mismatch KL (k3) | loss scale | step s |")
    print("|---|---|---|---|---|---|---|")
    for dtype, ms in rows.items():
        for m in ms:
            f = lambda k, fmt: (fmt.format(m[k]) if m.get(k) is not None else "-")  # noqa: E731
            print(f"| {dtype} | {m['step']} | {f('rollout/logprob_diff_mean', '{:.2e}')} | {f('rollout/logprob_diff_max', '{:.2e}')} | "
                  f"{f('rollout/mismatch_kl', '{:.2e}')} | {f('actor/loss_scale', '{:.0f}')} | {f('perf/step_s', '{:.1f}')} |")
    for dtype, ms in rows.items():
        mean = lambda k: sum(m[k] for m in ms if m.get(k) is not None) / max(1, sum(m.get(k) is not None for m in ms))  # noqa: E731
        print(f"{dtype}: mean over steps |dlogp| {mean('rollout/logprob_diff_mean'):.2e}, mismatch KL {mean('rollout/mismatch_kl'):.2e}, "
              f"step {mean('perf/step_s'):.1f} s")


if __name__ == "__main__":
    main()
