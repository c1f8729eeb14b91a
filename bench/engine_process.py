"""Generation in its own process overlapping training, against the synchronous loop, on this machine.

    nice -n 10 .venv/bin/python bench/engine_process.py --steps 3 --max-tokens 32 --train-rows 4 --sync-threads 2,1   # SmolLM2-135M-Instruct, 3 repeats
    nice -n 10 .venv/bin/python bench/engine_process.py --model tiny --repeats 1   # a smoke run

Each repeat runs the same ``--steps`` training steps twice, side by side:

- (a) synchronous, both cores: vLLM in this process generates the step's batch (torch threads = all
  cores, or ``--sync-threads``), then the training workload runs on it (the same threads), then the new weights go into the
  engine (``VLLMEngine.update_weights``).
- (b) one step off: vLLM in a child process (``reasonrl.engines.process.EngineProcess``, pinned to
  the last core, 1 torch thread) generates step s+1's batch while this process (pinned to the first
  core, 1 thread) trains on step s's; after each step the weights go to the child
  (``update_weights``: a shared in-memory file), applied before step s+2's generation (staleness 1).

The training workload: forward + backward of the policy (fp32, transformers) on ``--train-rows``
rows of the generated batch (prompt + completion), then an SGD step (no optimizer state: the
memory of this shared machine). Reported per mode: the wall time of the steps, the time generating
(in (b), the child's own clock) and training; speedup = wall(a) / wall(b); "generation hidden" = the
share of the child's generation time, over steps 1.. (step 0's batch has no training to hide
behind), during which the trainer was not waiting for it: 1 − wait / generation. Also the weight
update: the parent writing the state dict to shared memory, the child loading it, and the
in-process engine's update, with the bytes moved. The machine is shared: the load (``os.getloadavg``) is
printed beside each repeat; figures are as measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _model_dir(name: str) -> Path:
    if name == "tiny":
        from reasonrl.models.tiny import build_tiny_model

        d = Path(tempfile.gettempdir()) / "reasonrl-bench-tiny"
        return d if (d / "config.json").is_file() else build_tiny_model(d)
    from reasonrl.models.loading import resolve_model

    return resolve_model(name)


def _prompts(model_dir: Path, n: int, step: int) -> list[list[int]]:
    from reasonrl.models.loading import load_tokenizer

    tok = load_tokenizer(model_dir)
    texts = [f"What is {17 * (i + step) % 97} + {31 * (i + 2 * step) % 89}? Think step by step." for i in range(n)]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _train(model, opt, prompts, out, rows: int) -> float:
    """Forward + backward on ``rows`` of the batch (prompt + completion), one SGD step; seconds."""
    import torch

    t0 = time.perf_counter()
    seqs = [p + c.token_ids for p, g in zip(prompts, out) for c in g][:rows]
    L = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), L), dtype=torch.long)
    attn = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
    labels = ids.masked_fill(attn == 0, -100)
    model.train()
    loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="'tiny', 'default' (SmolLM2-135M-Instruct) or an HF directory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--train-rows", type=int, default=8)
    ap.add_argument("--dtype", default="auto", help="the engines' dtype (the trainer computes in fp32)")
    ap.add_argument("--sync-threads", default=None, help="torch threads of (a), a comma list run in turn (default: one per core; "
                    "'2,1' also shows (a) on one thread: the overlap apart from what a second OpenMP thread costs on a loaded machine)")
    ap.add_argument("--no-pin", action="store_true", help="(b) without pinning: the child and the trainer may each run on either core")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()

    import torch

    from reasonrl.console import quiet_libraries
    from reasonrl.engines.base import EngineOptions, SamplingParams
    from reasonrl.engines.process import EngineProcess
    from reasonrl.engines.vllm_engine import VLLMEngine
    from reasonrl.models.loading import load_causal_lm

    quiet_libraries()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("needs 2 cores")
    both, trainer_core, engine_core = set(cores), cores[0], cores[-1]
    model_dir = _model_dir(a.model)
    params = SamplingParams(n=a.n, temperature=1.0, max_tokens=a.max_tokens, seed=0)
    print(f"model {model_dir.name} | {a.prompts} prompts x {a.n} samples x {a.max_tokens} tokens, train on {a.train_rows} rows | "
          f"steps {a.steps} | cores {cores} | load {os.getloadavg()}", flush=True)

    torch.set_num_threads(len(cores))
    t0 = time.perf_counter()
    local = VLLMEngine(str(model_dir), dtype=a.dtype, seed=0, max_model_len=512, kv_cache_gib=0.5)
    print(f"in-process vLLM built in {time.perf_counter() - t0:.1f} s ({local.dtype})", flush=True)
    t0 = time.perf_counter()
    child = EngineProcess(EngineOptions(engine="vllm", dtype=a.dtype, kv_cache_gib=0.5), str(model_dir), seed=0, max_model_len=512,
                          threads=1, cpus=None if a.no_pin else [engine_core])
    print(f"child vLLM built in {time.perf_counter() - t0:.1f} s (pid {child.pid}, {'any core' if a.no_pin else f'core {engine_core}'}, 1 thread)",
          flush=True)
    model = load_causal_lm(model_dir, dtype=torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    sd = model.state_dict()
    nbytes = sum(v.numel() * v.element_size() for v in {v.data_ptr(): v for v in sd.values()}.values())

    warm = _prompts(model_dir, a.prompts, 99)  # (each engine's first generation pays one-off costs: not timed)
    local.generate(warm, params)
    child.generate(warm, params)
    rows = []
    sync_threads = [int(t) for t in a.sync_threads.split(",")] if a.sync_threads else [len(cores)]
    for rep in range(a.repeats):
        row: dict[str, float] = {"repeat": rep}
        # (a) synchronous, this process on both cores, `threads` torch threads
        for threads in sync_threads:
            os.sched_setaffinity(0, both)
            torch.set_num_threads(threads)
            load_a = os.getloadavg()[0]
            gen_a = train_a = sync_a = 0.0
            t_a = time.perf_counter()
            for s in range(a.steps):
                prompts = _prompts(model_dir, a.prompts, s)
                t0 = time.perf_counter()
                out = local.generate(prompts, params)
                gen_a += time.perf_counter() - t0
                train_a += _train(model, opt, prompts, out, a.train_rows)
                t0 = time.perf_counter()
                local.update_weights(model.state_dict())
                sync_a += time.perf_counter() - t0
            wall_a = time.perf_counter() - t_a
            row.update({f"wall_a{threads}": wall_a, f"gen_a{threads}": gen_a, f"train_a{threads}": train_a, f"sync_a{threads}": sync_a,
                        f"load_a{threads}": load_a})
            print(f"repeat {rep}: (a) sync, {threads} thread(s) on 2 cores: wall {wall_a:.1f} s = gen {gen_a:.1f} + train {train_a:.1f} "
                  f"+ sync {sync_a:.1f} (load {load_a:.1f})", flush=True)

        # (b) one step off: the child generates step s+1 while this process trains on step s
        os.sched_setaffinity(0, both if a.no_pin else {trainer_core})
        torch.set_num_threads(1)
        load_b = os.getloadavg()[0]
        gen_b = train_b = write_b = 0.0
        gen_later = wait_later = 0.0  # (steps >= 1: the generations that had a training step to hide behind)
        applied_before = len(child.applied)
        t_b = time.perf_counter()
        pending = child.submit(_prompts(model_dir, a.prompts, 0), params)
        for s in range(a.steps):
            prompts = _prompts(model_dir, a.prompts, s)
            t0 = time.perf_counter()
            out = child.result(pending)
            if s:
                wait_later += time.perf_counter() - t0
                gen_later += child.last_generate_seconds
            gen_b += child.last_generate_seconds
            if s + 1 < a.steps:
                pending = child.submit(_prompts(model_dir, a.prompts, s + 1), params)
            train_b += _train(model, opt, prompts, out, a.train_rows)
            child.update_weights(model.state_dict(), version=(rep, s))
            write_b += child.last_update_seconds
        wall_b = time.perf_counter() - t_b
        child.generate([[1]], SamplingParams(max_tokens=1, temperature=0))  # (waits for the last update to be applied)
        apply_b = sum(sec for _, sec in child.applied[applied_before:])
        hidden = 1 - wait_later / gen_later if gen_later else float("nan")
        row.update({"load_b": load_b, "wall_b": wall_b, "gen_b": gen_b, "train_b": train_b, "write_b": write_b, "apply_b": apply_b,
                    "hidden": hidden, **{f"speedup{t}": row[f"wall_a{t}"] / wall_b for t in sync_threads}})
        rows.append(row)
        print(f"repeat {rep}: (b) one step off, 1+1 threads{' unpinned' if a.no_pin else ', pinned'}: wall {wall_b:.1f} s, gen {gen_b:.1f} (child), train {train_b:.1f}, "
              f"write {write_b:.2f}, child applies {apply_b:.2f} (load {load_b:.1f}) | generation hidden behind training (steps >= 1): "
              f"{hidden:.2f} | speedup " + ", ".join(f"{row[f'wall_a{t}'] / wall_b:.2f}x over (a) {t} thread(s)" for t in sync_threads), flush=True)

    per = lambda k: statistics.median(r[k] for r in rows) / a.steps  # noqa: E731
    t0 = sync_threads[0]
    print(f"weights: {nbytes / 1e6:.0f} MB per update; per update (median): parent writes {per('write_b'):.2f} s, child loads "
          f"{per('apply_b'):.2f} s; in-process engine update {per(f'sync_a{t0}'):.2f} s")
    print(f"median over {len(rows)} repeats: " + ", ".join(f"speedup over (a) {t} thread(s) {statistics.median(r[f'speedup{t}'] for r in rows):.2f}x"
                                                            for t in sync_threads)
          + f"; generation hidden {statistics.median(r['hidden'] for r in rows):.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "weights_bytes": nbytes, "rows": rows}, indent=1))
    child.close()
    local.close()


if __name__ == "__main__":
    main()
