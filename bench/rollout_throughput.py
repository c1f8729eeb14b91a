"""Rollout throughput: the vLLM engine vs the transformers engine, side by side, in one process.

    .venv/bin/python bench/rollout_throughput.py                 # 32 prompts x 8 samples x 128 tokens, bf16
    .venv/bin/python bench/rollout_throughput.py --quick         # a short run
    .venv/bin/python bench/rollout_throughput.py --engines vllm --vllm-dtypes bf16,fp32

Each engine runs the same prompts (MATH-500 problems in the model's chat template when the shared
data are present, else synthetic arithmetic) with the same sampling settings. Runs alternate between
engines (``--repeats`` rounds) so that load from other jobs hits both alike; the best round per
engine and the ratio are reported. Tokens are generated tokens (EOS included); tok/s = tokens /
wall seconds of ``generate``.

The decode bound: generating one token costs about 2 x params FLOPs (each weight is one
multiply-add; the tied embedding counts once, as the LM head); the bound is a measured GEMM
throughput at decode shape (rows = prompts x samples, the model's widest matmul) divided by that.
Attention over the context and everything that is not a GEMM is not counted: it is an upper bound.

``--load N`` runs N busy processes (one core's worth each) beside the rounds: the engines under
another job's load.

Threads: as the ``reasonrl`` CLI does, ``OMP_NUM_THREADS`` defaults to the CPUs available (vLLM's CPU
backend would otherwise drop torch to one thread); set it to compare other counts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def _prompts(tokenizer: Any, n: int) -> list[list[int]]:
    data = ROOT.parent / "shared" / "data" / "math500.jsonl"
    problems: list[str] = []
    if data.is_file():
        for line in data.read_text(encoding="utf-8").splitlines():
            if line.strip():
                problems.append(json.loads(line)["problem"])
            if len(problems) >= n:
                break
    while len(problems) < n:
        i = len(problems)
        problems.append(f"What is {17 * i + 3} times {i + 11}, plus {5 * i}?")
    out = []
    for p in problems[:n]:
        msgs = [{"role": "user", "content": p + "\nPlease reason step by step, and put your final answer within \\boxed{}."}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) if tokenizer.chat_template else p
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def _gemm_gflops(m: int, k: int, n: int, dtype: Any, seconds: float = 1.0) -> float:
    import torch

    a = torch.randn(m, k).to(dtype)
    b = torch.randn(k, n).to(dtype)
    a @ b  # warm-up
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9


def _params(model_dir: Path) -> tuple[int, dict[str, Any]]:
    """Parameter count (tied embedding once) from config.json, for a Llama-like decoder."""
    cfg = json.loads((model_dir / "config.json").read_text())
    h, i, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    n = L * per_layer + h + V * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return n, cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="HF model dir (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="dtype of both engines")
    ap.add_argument("--engines", default="vllm,hf", help="comma list of: vllm, hf")
    ap.add_argument("--repeats", type=int, default=2, help="alternating rounds; the best round per engine is reported")
    ap.add_argument("--hf-batch-size", default="64", help="rows per transformers batch, or a comma list to time several (the CLI's --gen-batch-size default is 64)")
    ap.add_argument("--vllm-dtypes", default="", help="extra vLLM dtypes to time in the same rounds, e.g. fp32")
    ap.add_argument("--vllm-variant", action="append", default=[], metavar="NAME:KEY=VAL[,KEY=VAL]",
                    help="an extra vLLM configuration timed in the same rounds, e.g. 'seqs64:max_num_seqs=64' or "
                         "'chunked:enable_chunked_prefill=1' or 'compiled:enforce_eager=0' (repeatable)")
    ap.add_argument("--vllm-per-prompt", action="store_true", help="also time vLLM with one generate() call per prompt (no cross-prompt batching)")
    ap.add_argument("--seed", type=int, default=None, help="SamplingParams.seed (per-prompt seeded sampling)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="8 prompts x 4 samples x 32 tokens, 1 round")
    ap.add_argument("--load", type=int, default=0, help="busy processes (a pure-Python loop each, one core's worth) running beside the rounds: another job on the machine")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.samples, args.max_tokens, args.repeats = 8, 4, 32, 1

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from reasonrl.engines.base import SamplingParams
    from reasonrl.models import load_tokenizer, resolve_model

    model_dir = resolve_model(args.model)
    tok = load_tokenizer(model_dir)
    prompts = _prompts(tok, args.prompts)
    params = SamplingParams(n=args.samples, temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    n_params, cfg = _params(model_dir)
    rows = args.prompts * args.samples
    print(f"model {model_dir.name}: {n_params / 1e6:.1f}M params | {args.prompts} prompts x {args.samples} samples x <= {args.max_tokens} tokens, "
          f"T={args.temperature}, {args.dtype} | prompt tokens mean {sum(map(len, prompts)) / len(prompts):.0f}")
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__} threads {torch.get_num_threads()}, "
          f"AVX512-BF16 {torch.cpu._is_avx512_bf16_supported()}, CUDA {torch.cuda.is_available()}")

    # -------- engines
    engines: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    names = [e.strip() for e in args.engines.split(",") if e.strip()]
    if "vllm" in names:
        base = dict(seed=0, max_model_len=min(4096, max(map(len, prompts)) + args.max_tokens + 16))
        for dt in [args.dtype] + [d for d in args.vllm_dtypes.split(",") if d and d != args.dtype]:
            kw = dict(base, dtype=dt)
            runs[f"vllm-{dt}"] = ("vllm", kw)
            if args.vllm_per_prompt and dt == args.dtype:
                runs[f"vllm-{dt}-per-prompt"] = ("vllm-per-prompt", kw)
        for spec in args.vllm_variant:
            name, _, rest = spec.partition(":")
            kw = dict(base, dtype=args.dtype)
            for item in filter(None, rest.split(",")):
                k, _, v = item.partition("=")
                kw[k] = int(v) if v.lstrip("-").isdigit() else (v if v not in ("true", "false") else v == "true")
            for k in ("enforce_eager", "enable_chunked_prefill", "enable_prefix_caching"):
                if k in kw:
                    kw[k] = bool(kw[k])
            runs[f"vllm-{args.dtype}-{name}"] = ("vllm", kw)
    if "hf" in names:
        for bs in [int(b) for b in str(args.hf_batch_size).split(",") if b]:
            runs[f"hf-{args.dtype}-bs{bs}"] = ("hf", dict(dtype=args.dtype, seed=0, batch_size=bs))

    def build(kind: str, kw: dict[str, Any]) -> Any:
        t0 = time.perf_counter()
        if kind.startswith("vllm"):
            from reasonrl.engines.vllm_engine import VLLMEngine

            eng = VLLMEngine(str(model_dir), **kw)
        else:
            from reasonrl.engines.hf import HFEngine

            eng = HFEngine(str(model_dir), **kw)
        print(f"  built {kind} in {time.perf_counter() - t0:.1f}s")
        return eng

    def run(kind: str, eng: Any) -> tuple[float, int, float]:
        t0 = time.perf_counter()
        if kind == "vllm-per-prompt":
            outs = [eng.generate([p], params)[0] for p in prompts]
        else:
            outs = eng.generate(prompts, params)
        dt = time.perf_counter() - t0
        toks = sum(len(c.token_ids) for g in outs for c in g)
        stops = sum(c.finish_reason == "stop" for g in outs for c in g)
        return dt, toks, stops / max(1, rows)

    results: dict[str, list[tuple[float, int, float]]] = {k: [] for k in runs}
    import subprocess

    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    if load:
        print(f"  load: {args.load} busy process(es) beside the rounds")
    vllm_labels = [k for k, (kind, _) in runs.items() if kind.startswith("vllm")]
    # Keep the main vLLM engine open across rounds when it is the only vLLM config (construction costs).
    keep_vllm = len({id(kw) for k, (kind, kw) in runs.items() if kind.startswith("vllm")}) == 1
    for r in range(args.repeats):
        for label, (kind, kw) in runs.items():
            key = "vllm-main" if (kind.startswith("vllm") and keep_vllm) else label
            if key not in engines:
                if kind.startswith("vllm"):
                    for other in [k for k in engines if k.startswith("vllm")]:
                        engines.pop(other).close()
                engines[key] = build(kind, kw)
            dt, toks, stop_frac = run(kind, engines[key])
            results[label].append((dt, toks, stop_frac))
            print(f"  round {r + 1} {label:28s} {toks:6d} tokens in {dt:7.2f}s = {toks / dt:8.1f} tok/s  (stopped early {stop_frac:.0%})", flush=True)
            if kind.startswith("vllm") and not keep_vllm:
                engines.pop(key).close()
    for eng in engines.values():
        eng.close()
    for proc in load:
        proc.kill()
        proc.wait()

    # -------- decode bound
    widest = max(cfg["intermediate_size"], cfg["hidden_size"])
    gemm = {}
    for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        gemm[name] = _gemm_gflops(rows, cfg["hidden_size"], widest, dt)
    square = {name: _gemm_gflops(1024, 1024, 1024, dt) for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
    flops_per_token = 2 * n_params

    print()
    print(f"{'engine':30s} {'best tok/s':>10s} {'tokens':>7s} {'seconds':>8s}")
    best: dict[str, float] = {}
    for label, rs in results.items():
        dt, toks, _ = max(rs, key=lambda x: x[1] / x[0])
        best[label] = toks / dt
        print(f"{label:30s} {toks / dt:10.1f} {toks:7d} {dt:8.2f}")
    hf_label = max((k for k in best if k.startswith("hf")), key=lambda k: best[k], default=None)
    if hf_label:
        for v in vllm_labels:
            print(f"ratio {v} / {hf_label}: {best[v] / best[hf_label]:.2f}x")
    print()
    print(f"GEMM at decode shape ({rows}x{cfg['hidden_size']} @ {cfg['hidden_size']}x{widest}): bf16 {gemm['bf16']:.1f} GFLOP/s, "
          f"fp32 {gemm['fp32']:.1f} GFLOP/s; 1024^3: bf16 {square['bf16']:.1f}, fp32 {square['fp32']:.1f} GFLOP/s")
    dt_gemm = gemm["fp32" if args.dtype == "fp32" else "bf16"]
    bound = dt_gemm * 1e9 / flops_per_token
    print(f"decode bound ({args.dtype}): {dt_gemm:.1f} GFLOP/s / (2 x {n_params / 1e6:.1f}M FLOPs/token) = {bound:.0f} tok/s")
    for label, v in best.items():
        print(f"  {label}: {v / bound:.0%} of the bound")


if __name__ == "__main__":
    main()
