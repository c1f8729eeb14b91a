"""`reasonrl train --async-steps 1` against the synchronous loop, end to end, on this machine.

    nice -n 10 .venv/bin/python bench/async_steps.py                      # SmolLM2-135M-Instruct, vLLM, 5 steps, each mode once
    nice -n 10 .venv/bin/python bench/async_steps.py --model tiny --engine hf --steps 3   # a smoke run

The same `reasonrl train` run (DAPO on the main job's addition chains, data/chains.jsonl through
`prepare-data` with stages/prepare-data-cpu.toml; dynamic sampling off, so that every step trains
its whole batch: a step whose groups were all filtered out would have no update to hide generation
behind) five ways, one after the other, each in its own process:

- (a) synchronous, both cores: engine and trainer in one process, torch's threads (one per core);
- (a1) synchronous, one thread (OMP_NUM_THREADS=1): the same work done sequentially;
- (b) one step off: `--async-steps 1 --engine-cpus 1 --engine-threads 1`, the engine's process on
  core 1, the trainer pinned to core 0 (`taskset -c 0`, one thread);
- (b2) one step off as a user gets it without options: `--async-steps 1`, nothing pinned, the
  engine's process and the trainer each with half of torch's threads (the default since 2026-12-05);
- (b3) `--async-steps 1 --engine-threads N` with N all of the cores: each process with every core
  (the default before), twice as many threads as cores.

Reported per mode: the wall time of the steps after the first (the first step of (b) generates its
batch unhidden, as a synchronous step does: the steady state is steps 2..N, the sum of
``perf/step_s``), the whole command's wall time, and (b)'s time waiting for its batch
(``perf/ahead_wait_s``): 0 means generation was entirely hidden behind training. Speedup =
(a)'s steps / (b)'s steps (and (b2)'s, (b3)'s). The machine is shared: the load average (``os.getloadavg``) is printed
beside each mode; figures are as measured. Results go to ``--out`` (JSON) as well.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _model_dir(name: str) -> Path:
    sys.path.insert(0, str(ROOT))
    if name == "tiny":
        from reasonrl.models.tiny import build_tiny_model

        d = Path(tempfile.gettempdir()) / "reasonrl-bench-tiny"
        return d if (d / "config.json").is_file() else build_tiny_model(d)
    from reasonrl.models.loading import resolve_model

    return resolve_model(name)


def _cli(*args: object, env: dict[str, str], prefix: list[str] = ()) -> float:
    t0 = time.perf_counter()
    subprocess.run([*prefix, sys.executable, "-m", "reasonrl.cli", *[str(a) for a in args]], env=env, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="'tiny', 'default' (SmolLM2-135M-Instruct) or an HF directory")
    ap.add_argument("--engine", default="vllm")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-response-len", type=int, default=64)
    ap.add_argument("--modes", default="a,a1,b,b2,b3", help="which of a, a1, b, b2, b3 to run, in that order")
    ap.add_argument("--work", default=None, help="directory for the runs (default: a temporary one)")
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    a = ap.parse_args()

    model = _model_dir(a.model)
    work = Path(a.work or tempfile.mkdtemp(prefix="reasonrl-async-bench-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    data = work / "data"
    if not (data / "manifest.json").is_file():
        _cli("prepare-data", ROOT / "data" / "chains.jsonl", "--config", ROOT / "stages" / "prepare-data-cpu.toml", "--out", data,
             "--val-size", "8", "--overwrite", env=env)
    common = ["train", "--algo", "dapo", "--model", model, "--data", data, "--engine", a.engine, "--steps", a.steps,
              "--prompts-per-step", a.prompts_per_step, "--group-size", a.group_size, "--max-response-len", a.max_response_len,
              "--mini-batch-size", a.prompts_per_step * a.group_size, "--micro-batch-size", a.group_size, "--max-gen-rounds", "1", "--no-dynamic-sampling",
              "--lr", "1e-6", "--seed", "0", "--overwrite", "--quiet", "--report-to", "none"]
    if a.engine == "vllm":
        common += ["--kv-cache-gib", "0.5"]
    modes = {
        "a": ("synchronous, torch's threads", [], {}, []),
        "a1": ("synchronous, 1 thread", [], {"OMP_NUM_THREADS": "1"}, []),
        "b": ("--async-steps 1: engine on core 1, trainer on core 0", ["--async-steps", "1", "--engine-cpus", "1", "--engine-threads", "1"],
              {"OMP_NUM_THREADS": "1"}, ["taskset", "-c", "0"]),
        "b2": ("--async-steps 1, nothing pinned (the default: each process half of the threads)", ["--async-steps", "1"], {}, []),
        "b3": ("--async-steps 1, nothing pinned, each process every core's thread", ["--async-steps", "1", "--engine-threads", str(len(os.sched_getaffinity(0)))], {}, []),
    }
    results = {}
    for name in a.modes.split(","):
        what, extra, more_env, prefix = modes[name]
        out = work / f"run-{name}"
        load0 = os.getloadavg()[0]
        wall = _cli(*common, "--out", out, *extra, env={**env, **more_env}, prefix=prefix)
        m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        steady = sum(r["perf/step_s"] for r in m if r["step"] > 1)
        waits = [round(r.get("perf/ahead_wait_s", 0.0), 2) for r in m if r["step"] > 1]
        results[name] = {"what": what, "steps_2_to_n_s": round(steady, 2), "wall_s": round(wall, 1), "step1_s": round(m[0]["perf/step_s"], 2),
                         "ahead_wait_s": waits if name.startswith("b") else None, "staleness_max": [r.get("rollout/staleness_max", 0) for r in m],
                         "load": [round(load0, 1), round(os.getloadavg()[0], 1)]}
        print(f"({name}) {what}: steps 2..{a.steps} {steady:.1f} s, step 1 {m[0]['perf/step_s']:.1f} s, command {wall:.1f} s"
              + (f", waited for the batch {waits} s" if name.startswith("b") else "") + f" (load {load0:.1f} → {os.getloadavg()[0]:.1f})", flush=True)
    for b in ("b", "b2", "b3"):
        for ref in ("a", "a1"):
            if b in results and ref in results:
                print(f"speedup ({b}) vs ({ref}), steps 2..{a.steps}: {results[ref]['steps_2_to_n_s'] / results[b]['steps_2_to_n_s']:.2f}×")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"args": vars(a), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
