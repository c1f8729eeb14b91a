"""Where vLLM's decoding time goes on this machine: seconds per decode step against the rows decoded
together, with reasonrl's own vLLM engine (the trainer's settings), every row forced to the same
length so each call is exactly ``--tokens`` decode steps.

    .venv/bin/python bench/decode_step.py                      # SmolLM2-135M, rows 1, 8, 64, 256, 64 steps each
    .venv/bin/python bench/decode_step.py --model /tmp/tiny --rows 1,8 --tokens 8   # smoke
    .venv/bin/python bench/decode_step.py --variants bare,seed,logprobs,ours --rows 1,8,64   # what of the step is ours
    .venv/bin/python bench/decode_step.py --variants ours --rows 1,8,64 --compiled          # torch.compile instead of eager (CPU)

``--variants`` times what reasonrl asks of each request against a bare one, side by side: ``bare``
(no seed, no log-probs), ``seed`` (a per-request seed: vLLM samples those rows with their own
generators), ``logprobs`` (the sampled token's log-probability, ``logprobs=0``, flat), ``ours``
(both, as ``VLLMEngine`` samples). The engine is built as the trainer builds it
(``logprobs_mode="processed_logprobs"``), so the variants differ only in the request.

A decode step's time is ``a + b * rows``: ``a`` is what a step costs whatever its batch (the
scheduler, the sampler, kernel launches, streaming the weights), ``b`` each row's compute and KV
reads. A line fitted through the points separates them; the GEMM-only time per row (2 x params
FLOPs at the measured bf16/fp32 GEMM throughput at that shape) is printed beside it. Prefill (a
short prompt, prefix-cached after the first round) is timed apart and taken out.
"""

from __future__ import annotations

import argparse
import statistics
import time

import harness  # noqa: F401  (this tree's reasonrl first on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default="default")
    ap.add_argument("--rows", default="1,8,64,256", help="rows decoded together (comma list)")
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per call (every row forced to this length)")
    ap.add_argument("--rounds", type=int, default=3, help="calls per row count (the best is kept)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--compiled", action="store_true", help="build the engine with torch.compile (enforce_eager=False) instead of the CPU default of eager mode")
    ap.add_argument("--variants", default="seed", help=f"comma list of: {', '.join(VARIANTS)} (default: seed, the bench's original)")
    a = ap.parse_args()
    bad = [v for v in a.variants.split(",") if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant {bad[0]}: choose from {', '.join(VARIANTS)}")

    import torch
    from transformers import AutoConfig
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from reasonrl.engines.vllm_engine import VLLMEngine
    from reasonrl.models import resolve_model
    from reasonrl.perf import ModelShape, gemm_flops, phase_gemms

    model_dir = str(resolve_model(a.model))
    t_build = time.perf_counter()
    eng = VLLMEngine(model_dir, dtype=a.dtype, seed=0, max_model_len=a.tokens + 64, enforce_eager=not a.compiled)
    t_build = time.perf_counter() - t_build
    prompt = [TokensPrompt(prompt_token_ids=list(range(10, 42)))]  # 32 tokens

    def timed(rows: int, tokens: int, variant: str) -> float:
        sp = SamplingParams(n=rows, temperature=1.0, max_tokens=tokens, min_tokens=tokens, **VARIANTS[variant])
        best = float("inf")
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            eng.llm.generate(prompt, sp, use_tqdm=False)
            best = min(best, time.perf_counter() - t0)
        return best

    shape = ModelShape.from_config(AutoConfig.from_pretrained(model_dir))
    print(f"{model_dir} | vLLM engine dtype {eng.dtype}, {'compiled' if a.compiled else 'eager'}, built in {t_build:.1f} s | torch threads {torch.get_num_threads()} | "
          f"{a.tokens} decode steps per call, best of {a.rounds}")
    variants = a.variants.split(",")
    pts: dict[str, list[tuple[int, float]]] = {v: [] for v in variants}
    for rows in map(int, a.rows.split(",")):
        products = [p for ps in phase_gemms(shape, rows, kind="decode").values() for p in ps]
        gemm = sum(2 * m * k * n * c for m, k, n, c in products) / gemm_flops(products, dtype="bf16" if "bfloat16" in str(eng.dtype) else "fp32")
        for v in variants:  # side by side at each row count, so load from other jobs hits every variant alike
            one = timed(rows, 1, v)  # prefill + one sampled token
            full = timed(rows, a.tokens + 1, v)
            per_step = (full - one) / a.tokens
            pts[v].append((rows, per_step))
            print(f"  rows {rows:4d} {v:8s}: {per_step * 1e3:8.2f} ms per decode step ({rows / per_step:8.1f} tok/s) | GEMMs alone at this shape "
                  f"{gemm * 1e3:7.2f} ms ({gemm / per_step:5.1%} of the step)", flush=True)
    for v, vp in pts.items():
        if len(vp) >= 2:
            xs, ys = [p[0] for p in vp], [p[1] for p in vp]
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            print(f"fit {v:8s}: {(my - b * mx) * 1e3:.2f} ms per step + {b * 1e3:.3f} ms per row")
    eng.close()


#: What a request asks of vLLM beyond its tokens (see the module's docstring).
VARIANTS: dict[str, dict[str, object]] = {
    "bare": {},
    "seed": {"seed": 0},
    "logprobs": {"logprobs": 0, "flat_logprobs": True},
    "ours": {"seed": 0, "logprobs": 0, "flat_logprobs": True},
}


if __name__ == "__main__":
    main()
