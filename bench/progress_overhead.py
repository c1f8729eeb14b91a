"""What the live generation bar costs: the vLLM engine with and without its progress callback.

    .venv/bin/python bench/progress_overhead.py            # 32 prompts x 4 samples x 64 tokens, 3 rounds each

Progress rides on vLLM's own per-request hook (``LLM.generate(use_tqdm=callable)``) inside the same
single call, so the batch is scheduled exactly as without it; this measures the rest (the callback
and its rich redraws, here into a terminal console writing to /dev/null). Rounds alternate, seeded
identically, so load from other jobs hits both alike; the ratios of the medians and of the best
rounds are reported, and the outputs are checked to be the same tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()

    from rich.console import Console

    from reasonrl.engines.base import SamplingParams
    from reasonrl.engines.vllm_engine import VLLMEngine
    from reasonrl.models.loading import load_tokenizer, resolve_policy
    from reasonrl.progress import Display

    model = resolve_policy("default")
    tok = load_tokenizer(model)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {17 * i + 3} + {i + 11}?"}], tokenize=False, add_generation_prompt=True)
               for i in range(a.prompts)]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    eng = VLLMEngine(str(model), dtype="fp32", seed=0, max_model_len=512)
    params = SamplingParams(n=a.n, temperature=1.0, max_tokens=a.max_tokens, seed=1)
    eng.generate(ids[:2], params)  # warm-up
    console = Console(file=open(os.devnull, "w"), force_terminal=True, width=160)
    times: dict[str, list[float]] = {"plain": [], "progress": []}
    outs: dict[str, list] = {}
    for _ in range(a.rounds):
        for mode in ("plain", "progress"):
            t0 = time.perf_counter()
            if mode == "plain":
                out = eng.generate(ids, params)
            else:
                with Display(console) as d, d.phase("generate", len(ids) * a.n) as bar:
                    out = eng.generate(ids, params, progress=bar.generated)
            times[mode].append(time.perf_counter() - t0)
            outs[mode] = [[c.token_ids for c in g] for g in out]
    eng.close()
    tokens = sum(len(t) for g in outs["plain"] for t in g)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.prompts} prompts x {a.n} samples x <= {a.max_tokens} tokens ({tokens} tokens), {a.rounds} alternating rounds, vLLM fp32")
    for k, v in times.items():
        print(f"  {k:9s} " + "  ".join(f"{x:.2f}s" for x in v) + f"   median {med[k]:.2f}s")
    best = {k: min(v) for k, v in times.items()}
    print(f"  progress / plain: median {med['progress'] / med['plain']:.3f}, best round {best['progress'] / best['plain']:.3f}; "
          f"same tokens: {outs['plain'] == outs['progress']}")


if __name__ == "__main__":
    main()
