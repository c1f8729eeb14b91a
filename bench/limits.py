"""This machine's limits and a training step's bound: GEMM throughput at the shapes a step uses,
memory bandwidth, and from them the least time each phase of the step can take.

    .venv/bin/python bench/limits.py                       # SmolLM2-135M, the main job's step shape (below)
    .venv/bin/python bench/limits.py --run runs/train      # a finished run: its shapes, each phase's time and share of its bound
    .venv/bin/python bench/limits.py --model /tmp/tiny --seconds 0.02   # smoke

GEMMs are timed in fp32, and in bf16 where the CPU computes it natively (``--dtype auto`` is bf16
where the CPU has AVX512-BF16 / AMX, ``reasonrl.devices``), at each phase's rows: decode = the
sequences decoded together (prompts × G), prefill = a step's distinct prompt tokens, forward (old
log-probs) and train (the forward's products and the backward's two per linear) = a micro-batch's
tokens; for each linear of the model (qkv, o, gate_up, down fused as engines fuse them; lm_head). A phase's throughput is its
products' FLOPs over their summed time. Bandwidth: the larger of a 256 MiB copy and STREAM's triad.
The bound arithmetic is ``reasonrl.perf`` (``phase_bounds``; docs/metrics.md, the perf/…_bound_frac rows, and docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

import harness as H  # (this tree's reasonrl first on sys.path)


def measure(shape: Any, rows: dict[str, int], dtypes: list[str], seconds: float) -> dict[str, dict[str, dict[str, float]]]:
    """FLOP/s by dtype → kind → linear (and "all": the kind's FLOPs over its summed time)."""
    from reasonrl.perf import gemm_flops, phase_gemms

    out: dict[str, dict[str, dict[str, float]]] = {}
    for dt in dtypes:
        for kind, n in rows.items():
            per, flops, secs = {}, 0.0, 0.0
            for name, products in phase_gemms(shape, n, kind=kind).items():
                f = sum(2 * m * k * nn * c for m, k, nn, c in products)
                per[name] = gemm_flops(products, dtype=dt, seconds=seconds)
                flops, secs = flops + f, secs + f / per[name]
            per["all"] = flops / secs
            out.setdefault(dt, {})[kind] = per
    return out


def load_run(run: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if not (run / "metrics.jsonl").is_file():
        raise SystemExit(f"{run} has no metrics.jsonl: pass a `reasonrl train` run directory")
    cfg = json.loads((run / "config.json").read_text())
    return cfg, [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--run", default=None, help="a `reasonrl train` run directory: shapes, dtype and phase times from its config.json + metrics.jsonl")
    ap.add_argument("--model", default=None, help="HF model dir or 'default' (default: the run's model, else the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--skip-first", type=int, default=1, help="--run: steps left out of the means (start-up effects)")
    g = ap.add_argument_group("the step's shape without --run (default: the main job's regime, bench/vs_trl.py's 'fewshot')")
    g.add_argument("--prompts", type=int, default=8)
    g.add_argument("--group-size", type=int, default=8)
    g.add_argument("--prompt-len", type=float, default=107, help="mean prompt tokens")
    g.add_argument("--response-len", type=float, default=17, help="mean response tokens")
    g.add_argument("--decode-steps", type=int, default=64, help="decode steps of the batch (its longest response; at most L_max)")
    g.add_argument("--micro-batch-size", type=int, default=16)
    g.add_argument("--dtype", default="auto", help="the step's dtype (auto: reasonrl's resolution on this machine)")
    ap.add_argument("--seconds", type=float, default=0.2, help="timing per GEMM product")
    ap.add_argument("--json", default=None, help="--run: also write each phase's bound, measured seconds and share here (bench/vs_trl.py --results reads it)")
    a = ap.parse_args()

    import torch

    from reasonrl.devices import hardware_bf16, resolve_dtype
    from reasonrl.models.loading import resolve_policy
    from reasonrl.perf import DTYPE_BYTES, Limits, ModelShape, StepCounts, memory_bandwidth, phase_bounds, step_work

    cfg, lines = load_run(Path(a.run)) if a.run else ({}, [])
    model_dir = resolve_policy(a.model or cfg.get("model", "default"))
    shape = ModelShape.from_config(json.loads((model_dir / "config.json").read_text()))
    dtype = cfg.get("dtype_resolved") or resolve_dtype(a.dtype)
    micro = cfg.get("micro_batch_size", a.micro_batch_size)
    if cfg:
        G = cfg["group_size"]
        world = cfg.get("world_size", 1)  # bounds per process: each does its share of the step
        steps = [(m, c) for m in lines if (c := StepCounts.from_metrics(m, group_size=G, epochs=cfg.get("ppo_epochs", 1),
                                                                        mini_batch_size=cfg.get("mini_batch_size", 0) // world or None, world=world))]
        if not steps:
            raise SystemExit(f"{a.run}: no step with an update in metrics.jsonl")
        timed = steps[a.skip_first:] or steps
        c0 = timed[0][1]
    else:
        rows = a.prompts * a.group_size
        c0 = StepCounts(gen_prompts=a.prompts, gen_rows=rows, gen_tokens=round(rows * a.response_len), decode_steps=a.decode_steps,
                        prompt_len=a.prompt_len, train_prompts=a.prompts, train_rows=rows, train_tokens=round(rows * (a.prompt_len + a.response_len)))
        timed = [({}, c0)]

    cpu = H.cpu_name()
    print(f"machine: {cpu}, {len(os.sched_getaffinity(0))} CPUs, torch {torch.__version__} threads {torch.get_num_threads()}, "
          f"native bf16 {hardware_bf16()} -> --dtype auto = {resolve_dtype('auto')}, CUDA {torch.cuda.is_available()}")
    print(f"model {model_dir.name}: {shape.params() / 1e6:.1f}M params, hidden {shape.hidden}, {shape.layers} layers, "
          f"{shape.heads}/{shape.kv_heads} heads of {shape.head_dim}, vocab {shape.vocab}")
    train_rows_tokens = round(micro * (c0.prompt_len + c0.train_response_tokens / c0.train_rows))
    rows = {"decode": round(c0.gen_rows), "prefill": round(c0.gen_prompts * c0.prompt_len), "forward": train_rows_tokens, "train": train_rows_tokens}
    print(f"step: {c0.gen_prompts:g} prompts x {c0.gen_rows / c0.gen_prompts:g} samples, prompt {c0.prompt_len:.0f} tokens, "
          f"{c0.gen_tokens / c0.gen_rows:.1f} response tokens per row, {c0.decode_steps} decode steps, micro-batch {micro} rows "
          f"({train_rows_tokens} tokens), step dtype {dtype}")

    # bf16 only where the CPU computes it (without AVX512-BF16 / AMX one bf16 GEMM of a step's
    # LM head takes minutes: emulated), and always the step's own dtype.
    thr = measure(shape, rows, list(dict.fromkeys(["fp32", *(["bf16"] if hardware_bf16() else []), dtype])), a.seconds)
    names = [*shape.linears(), "all"]
    print(f"\nGEMM throughput, GFLOP/s\n{'kind':8s} {'rows':>6s} {'dtype':5s} " + " ".join(f"{n:>8s}" for n in names))
    for dt, kinds in thr.items():
        for kind, per in kinds.items():
            print(f"{kind:8s} {rows[kind]:6d} {dt:5s} " + " ".join(f"{per[n] / 1e9:8.1f}" if n in per else f"{'-':>8s}" for n in names))
    bw = memory_bandwidth(seconds=a.seconds)
    print(f"memory bandwidth: copy {bw['copy'] / 1e9:.1f} GB/s, triad {bw['triad'] / 1e9:.1f} GB/s")

    t = thr[dtype if dtype in thr else "fp32"]
    lim = Limits(decode=t["decode"]["all"], prefill=t["prefill"]["all"], forward=t["forward"]["all"], train=t["train"]["all"],
                 bandwidth=max(bw.values()))
    eb = DTYPE_BYTES[dtype]
    critic, ref = bool(cfg.get("resolved_algo", {}).get("use_critic")), bool(cfg.get("resolved_algo", {}).get("kl_coef"))
    bounds = [phase_bounds(step_work(shape, c, engine_bytes=eb), c, lim, engine_bytes=eb, critic=critic, ref=ref) for _, c in timed]
    w = step_work(shape, c0, engine_bytes=eb)
    decode_side = "memory" if w.decode_bytes / lim.bandwidth > w.decode_flops / lim.decode else "compute"
    print(f"\nbound of a step ({dtype}; generation: prefill {w.prefill_flops / 1e9:.1f} GFLOP, decode {w.decode_flops / 1e9:.1f} GFLOP / "
          f"{w.decode_bytes / 1e9:.2f} GB -> {decode_side}-bound; forward {w.forward_flops / 1e9:.1f} GFLOP, update {w.update_flops / 1e9:.1f} GFLOP)")
    head = f"{'phase':14s} {'bound s':>9s}" + (f" {'measured s':>10s} {'share':>6s}" if cfg else "")
    print(head + (f"   (means over steps {timed[0][0].get('step')}..{timed[-1][0].get('step')})" if cfg else ""))
    doc: dict[str, Any] = {"cpu": cpu, "dtype": dtype, "phases": {}}
    for phase in [*(k for k in bounds[0] if k != "step"), "step"]:
        b = statistics.fmean(x[phase] for x in bounds)
        line = f"{phase:14s} {b:9.3f}"
        if cfg:
            got = [m.get(f"perf/{phase}_s") for m, _ in timed]
            if all(x for x in got):
                share = sum(x[phase] for x in bounds) / sum(got)
                doc["phases"][phase] = {"bound_s": b, "measured_s": statistics.fmean(got), "share": share}
                line += f" {statistics.fmean(got):10.3f} " + (f"{share:6.1%}" if b > 0 else f"{'-':>6s}   (no work: the old log-probs are the update's own forward)")
        print(line)
    if cfg:
        other = statistics.fmean(m["perf/step_s"] - sum(m.get(f"perf/{p}_s", 0.0) for p in ("generate", "prepare", "update_critic", "update_actor", "weight_sync"))
                                 for m, _ in timed)
        print(f"{'(score+other)':14s} {0.0:9.3f} {other:10.3f}   reward scoring and bookkeeping: no bound")
        if a.json:
            Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
