"""A mini-batch's forward + backward cut by rows (``--micro-batch-size``) or to a token budget
(``--max-tokens-per-micro-batch``), side by side.

    .venv/bin/python bench/micro_batches.py                          # the 'long' regime's shape: 8 chains prompts x 8, L_max 512
    .venv/bin/python bench/micro_batches.py --dtype bf16 --budgets 2048,4096
    .venv/bin/python bench/micro_batches.py --model /tmp/tiny --prompts 2 --group 4 --rounds 1   # smoke

The batch: ``--prompts`` addition chains in their worked-steps template (SmolLM2's chat format), ``--group``
samples each with random response tokens (timing does not depend on their values) whose lengths are
heavy-tailed as long CoT's are: most near ``--typical`` tokens, a ``--tail`` share drawn up to L_max.
The mini-batch is the whole batch (one update per step, as the CPU recipes), in a random order; each
mode cuts it as the trainer does (``reasonrl.train.micro``), weights each micro-batch's loss by its
token share and runs ``--forward-mode``'s forward + log-probs + backward of every micro-batch. Rounds
alternate the modes; the best round per mode, the tokens it ran (padding included, but for packed), and the largest relative
gradient difference to the first mode are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--template", default="chains")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-response-len", type=int, default=512)
    ap.add_argument("--typical", type=int, default=90, help="most responses' length (the chains answer in ~60-110 tokens)")
    ap.add_argument("--tail", type=float, default=0.15, help="share of responses drawn uniformly up to L_max")
    ap.add_argument("--rows", default="8,16", help="micro-batch sizes in rows to time (comma list)")
    ap.add_argument("--budgets", default="2048,4096,8192", help="token budgets to time (comma list)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: fp32 weights under bf16 autocast, as the trainer")
    ap.add_argument("--forward-mode", default="shared", choices=["shared", "packed", "plain"],
                    help="the forward every cut runs (the budget counts its tokens: packed, the real ones)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    from harness import chat_prompt_ids, random_response

    from reasonrl.algos import logprobs_from_logits
    from reasonrl.devices import autocast_ctx
    from reasonrl.models import load_tokenizer, resolve_model
    from reasonrl.models.loading import load_causal_lm
    from reasonrl.train.batch import build_batch, response_logits
    from reasonrl.train.micro import RowLengths, arrange, by_rows, to_budget

    model_dir = resolve_model(args.model)
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(str(model_dir), dtype=torch.float32, device="cpu")
    model.train()
    rows = [json.loads(x) for x in (ROOT / "data" / "chains.jsonl").read_text().splitlines()[: args.prompts]]
    g = torch.Generator().manual_seed(0)
    prompts, responses, group = [], [], []
    for gi, r in enumerate(rows):
        ids = chat_prompt_ids(tok, args.template, r["problem"])
        for _ in range(args.group):
            if float(torch.rand((), generator=g)) < args.tail:
                n = int(torch.randint(args.typical, args.max_response_len + 1, (1,), generator=g))
            else:
                n = max(1, int(args.typical * (0.7 + 0.5 * float(torch.rand((), generator=g)))))
            prompts.append(ids)
            responses.append(random_response(tok, n, g))
            group.append(gi)
    batch = build_batch(prompts, responses, pad_id=tok.pad_token_id or 0)
    lens = RowLengths([len(p) for p in prompts], [len(r) for r in responses], group, forward=args.forward_mode)
    mini = torch.randperm(len(prompts), generator=g).tolist()
    modes: dict[str, list[list[int]]] = {}
    for r in (int(x) for x in args.rows.split(",") if x):
        modes[f"rows {r}"] = by_rows(arrange(lens, mini, r), r)
    for b in (int(x) for x in args.budgets.split(",") if x):
        modes[f"budget {b}"] = to_budget(lens, mini, b)
    total = sum(lens.response)
    resp = sorted(lens.response)
    print(f"{model_dir.name} | {args.prompts} prompts x {args.group} samples, prompt {sum(lens.prompt) / len(prompts):.0f} tokens, "
          f"responses: mean {total / len(resp):.0f}, p50 {resp[len(resp) // 2]}, p90 {resp[int(0.9 * len(resp))]}, max {resp[-1]} of L_max "
          f"{args.max_response_len} | {args.dtype}, {args.forward_mode} forward | torch threads {torch.get_num_threads()}")
    for name, micros in modes.items():
        print(f"  {name:12s}: {len(micros):2d} micro-batches, {sum(lens.cost(m) for m in micros):6d} tokens run "
              f"(rows per micro-batch {min(map(len, micros))}..{max(map(len, micros))})")

    def step(micros: list[list[int]]) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        for idx in micros:
            mb = batch.select(idx)
            with autocast_ctx(args.dtype):
                logp = logprobs_from_logits(response_logits(model, mb, mode=args.forward_mode), mb.response_ids) * mb.valid
            (logp.sum() / total).backward()
        dt = time.perf_counter() - t0
        return dt, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    step(next(iter(modes.values())))  # (warm-up: allocator, thread pools)
    best: dict[str, float] = {}
    grads: dict[str, dict[str, torch.Tensor]] = {}
    for rnd in range(args.rounds):
        for name, micros in modes.items():
            dt, grads[name] = step(micros)
            best[name] = min(best.get(name, dt), dt)
            print(f"  round {rnd + 1} {name:12s}: {dt:7.2f} s", flush=True)
    first = next(iter(modes))
    ref = grads[first]
    out = {}
    print(f"\nbest round per mode ({args.dtype}); x: against '{first}'")
    for name in modes:
        diff = max(float((grads[name][n] - ref[n]).abs().max() / (ref[n].abs().max() + 1e-12)) for n in ref)
        out[name] = {"seconds": best[name], "micro_batches": len(modes[name]), "tokens_run": sum(lens.cost(m) for m in modes[name]), "grad_rel_diff": diff}
        print(f"  {name:12s} {best[name]:7.2f} s  {best[first] / best[name]:5.2f}x  max relative grad diff {diff:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "modes": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
