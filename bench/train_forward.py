"""Training forward + backward in the plain, shared-prompt and packed modes, side by side.

    .venv/bin/python bench/train_forward.py            # the main job's shape: 4 prompts x 6 samples, 12-row micro-batches
    .venv/bin/python bench/train_forward.py --shape long --prompts 8 --modes shared,packed
    .venv/bin/python bench/train_forward.py --dtypes fp32,bf16 --rounds 2
    .venv/bin/python bench/train_forward.py --modes packed --dtypes bf16,bf16w --rounds 3   # autocast vs a bf16 weight copy (bf16 CPUs)
    .venv/bin/python bench/train_forward.py --shape long --prompts 8 --modes packed-dense,packed   # per-segment attention

Shapes: ``main`` is the main job's (bundled addition problems in the few-shot template, SmolLM2's
chat format, ``--group`` samples per prompt, response lengths uniform in [L/2, L] for
``--response-len`` L = 32); ``long`` is a long-CoT tail (8 samples per prompt, L = 512, lengths
heavy-tailed: 85% log-normal around 48 tokens, 15% at the cap, as truncated reasoning is).
Response tokens are random (timing does not depend on their values); micro-batches of ``--rows``
rows are drawn in a random order as the trainer's mini-batches are. Each round times
``response_logits`` + log-probabilities + backward for the whole step, once per mode, alternating
modes so that load from other jobs hits all alike; the best round per mode, the ratios to the
first mode, the largest log-prob and gradient differences from the first mode, and what
``reasonrl.train.batch.forward_costs`` predicts (and ``auto`` would pick) are printed. bf16 runs
under ``torch.autocast`` as the trainer does (``reasonrl.devices.autocast_ctx``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))

SHAPES = {"main": {"group": 6, "response_len": 32, "rows": 12}, "long": {"group": 8, "response_len": 512, "rows": 8}}


def lengths(shape: str, n: int, cap: int, g) -> list[int]:
    import torch

    if shape == "main":
        return [int(torch.randint(cap // 2, cap + 1, (1,), generator=g)) for _ in range(n)]
    out = []
    for _ in range(n):
        if float(torch.rand(1, generator=g)) < 0.15:
            out.append(cap)
        else:
            out.append(max(1, min(cap, int(math.exp(math.log(48) + 0.8 * float(torch.randn(1, generator=g)))))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--template", default="fewshot")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="main")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=None, help="samples per prompt (the shape's by default)")
    ap.add_argument("--response-len", type=int, default=None, help="L_max (the shape's by default)")
    ap.add_argument("--rows", type=int, default=None, help="rows per micro-batch (the shape's by default)")
    ap.add_argument("--modes", default="plain,shared,packed", help="comma-separated; the first is the reference (packed-dense: packed "
                    "with the dense N x N attention everywhere, as before per-segment attention)")
    ap.add_argument("--dtypes", default="fp32", help="comma list of fp32, bf16 (autocast over fp32 weights, as the trainer), "
                    "bf16w (a bf16 copy of the weights, no autocast: what a bf16 weight copy would save in casts)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    sh = SHAPES[args.shape]
    group, cap, rows_per = args.group or sh["group"], args.response_len or sh["response_len"], args.rows or sh["rows"]
    modes = args.modes.split(",")

    import torch
    from harness import chat_prompt_ids, random_response

    from reasonrl.algos import logprobs_from_logits
    from reasonrl.devices import autocast_ctx
    from reasonrl.models import load_tokenizer, resolve_model
    from reasonrl.models.loading import load_causal_lm
    from reasonrl.train import segments
    from reasonrl.train.batch import ForwardCost, build_batch, cheapest, forward_costs, pack, response_logits

    model_dir = resolve_model(args.model)
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(str(model_dir), dtype=torch.float32, device="cpu")
    model.train()
    data = [json.loads(x) for x in (ROOT / "data" / "addition.jsonl").read_text().splitlines()[: args.prompts]]
    g = torch.Generator().manual_seed(0)
    prompts, responses = [], []
    for r in data:
        ids = chat_prompt_ids(tok, args.template, r["problem"])
        for n in lengths(args.shape, group, cap, g):
            prompts.append(ids)
            responses.append(random_response(tok, n, g))
    batch = build_batch(prompts, responses, pad_id=tok.pad_token_id or 0)
    perm = torch.randperm(len(prompts), generator=g).tolist()
    micros = [perm[i : i + rows_per] for i in range(0, len(perm), rows_per)]
    p_len = sum(len(p) for p in prompts) / len(prompts)
    lens = sorted(len(r) for r in responses)
    q = [lens[int(f * (len(lens) - 1))] for f in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)]
    print(f"{model_dir.name} | {args.shape}: {args.prompts} prompts x {group} samples, prompt {p_len:.0f} tokens, responses <= {cap} "
          f"(min/p25/median/p75/p90/max {'/'.join(map(str, q))}, mean {sum(lens) / len(lens):.0f}), "
          f"micro-batches of {rows_per} rows (random order) | torch threads {torch.get_num_threads()}")
    cost = ForwardCost.of(model.config)
    mbs = [batch.select(idx) for idx in micros]
    pred = {m: sum(forward_costs(mb, cost)[m] for mb in mbs) for m in ("plain", "shared", "packed")}
    real = sum(int(mb.valid.sum()) for mb in mbs)
    padded = sum(mb.input_ids.numel() for mb in mbs)
    print(f"  tokens: {real} response tokens, {padded} padded columns | predicted GFLOP (forward) "
          + ", ".join(f"{m} {v / 1e9:.0f}" for m, v in pred.items())
          + f" | auto picks {'/'.join(cheapest(forward_costs(mb, cost)) for mb in mbs)} (per micro-batch), {cheapest(pred)} (summed)")
    spans = [pack(mb).spans for mb in mbs]
    print(f"  packed attention: per segment {sum(s.pairs() for s in spans) / sum(s.n * s.n for s in spans):.2f} of the dense N x N pairs; "
          f"per segment in {sum(segments.segments_pay(s.pairs(), s.n) for s in spans)} of {len(spans)} micro-batches")

    copies: dict[str, Any] = {}

    def net(dtype: str) -> Any:
        """The model a dtype runs: bf16w is a bf16 copy of the weights (no autocast, no per-call casts)."""
        if dtype != "bf16w":
            return model
        if dtype not in copies:
            copies[dtype] = copy.deepcopy(model).to(torch.bfloat16)
        return copies[dtype]

    def step(mode: str, dtype: str) -> tuple[float, torch.Tensor, dict[str, torch.Tensor]]:
        m = net(dtype)
        m.zero_grad(set_to_none=True)
        below = segments.SEGMENTS_BELOW
        if mode == "packed-dense":  # the packed forward with its dense N x N attention only
            mode, segments.SEGMENTS_BELOW = "packed", -1.0
        t0 = time.perf_counter()
        lps = []
        try:
            for mb in mbs:
                with autocast_ctx("fp32" if dtype == "bf16w" else dtype):
                    logp = logprobs_from_logits(response_logits(m, mb, mode=mode), mb.response_ids) * mb.valid
                logp.sum().backward()
                lps.append(logp.detach().float())
        finally:
            segments.SEGMENTS_BELOW = below
        dt = time.perf_counter() - t0
        grads = {n: p.grad.float() for n, p in m.named_parameters() if p.grad is not None}
        return dt, torch.cat([x.flatten() for x in lps]), grads

    by_dtype: dict[str, tuple[float, dict[str, torch.Tensor]]] = {}
    for dtype in args.dtypes.split(",") if args.rounds > 0 else []:
        best: dict[str, float] = {}
        last: dict[str, tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}
        for r in range(args.rounds):
            for mode in modes:
                dt, lp, gr = step(mode, dtype)
                best[mode] = min(best.get(mode, dt), dt)
                last[mode] = (lp, gr)
                print(f"  {dtype} round {r + 1} {mode:7s}: {dt:7.2f} s", flush=True)
        ref = modes[0]
        line = [f"{dtype}: " + ", ".join(f"{m} {best[m]:.2f} s" for m in modes)]
        for m in modes[1:]:
            lp_diff = float((last[m][0] - last[ref][0]).abs().max())
            g_diff = max(float((last[m][1][n] - last[ref][1][n]).abs().max() / (last[ref][1][n].abs().max() + 1e-12)) for n in last[ref][1])
            line.append(f"{m} {best[ref] / best[m]:.2f}x {ref} (max |logprob diff| {lp_diff:.1e}, max relative grad diff {g_diff:.1e})")
        print(" | ".join(line), flush=True)
        by_dtype[dtype] = (best[modes[0]], last[modes[0]][1])
    if len(by_dtype) > 1:  # the first mode across dtypes: time and gradients against the first dtype
        (ref, (t_ref, g_ref)), *rest = by_dtype.items()
        for dtype, (t, g) in rest:
            diff = max(float((g[n] - g_ref[n]).abs().max() / (g_ref[n].abs().max() + 1e-12)) for n in g_ref)
            print(f"{modes[0]}: {dtype} {t_ref / t:.2f}x {ref} (max relative grad diff {diff:.1e})", flush=True)


if __name__ == "__main__":
    main()
