"""Training forward + backward with and without the shared-prompt forward, side by side.

    .venv/bin/python bench/train_forward.py            # the main job's shape: 4 prompts x 6 samples, 12-row micro-batches
    .venv/bin/python bench/train_forward.py --rows 24 --rounds 3

The batch has the main job's shape: bundled addition problems in the few-shot template
(SmolLM2's chat format), ``--group`` samples per prompt with random response tokens of up to
``--response-len`` tokens (timing does not depend on their values), micro-batches of ``--rows``
rows drawn in a random order as the trainer's mini-batches are. Each round times
``response_logits`` + log-probabilities + backward for the whole step, once per mode, alternating
modes so that load from other jobs hits both alike; the best round per mode and the ratio are
reported, and the two modes' log-probabilities and gradients are compared.
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
    ap.add_argument("--template", default="fewshot")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=6)
    ap.add_argument("--response-len", type=int, default=32)
    ap.add_argument("--rows", type=int, default=12, help="rows per micro-batch")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    import torch

    from reasonrl.algos import logprobs_from_logits
    from reasonrl.data.templates import messages_for
    from reasonrl.models import load_tokenizer, resolve_model
    from reasonrl.models.loading import load_causal_lm
    from reasonrl.train.batch import build_batch, response_logits

    model_dir = resolve_model(args.model)
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(str(model_dir), dtype=torch.float32, device="cpu")
    model.train()
    rows = [json.loads(x) for x in (ROOT / "data" / "addition.jsonl").read_text().splitlines()[: args.prompts]]
    g = torch.Generator().manual_seed(0)
    prompts, responses = [], []
    for r in rows:
        ids = tok.apply_chat_template(messages_for(args.template, r["problem"]), tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        for _ in range(args.group):
            n = int(torch.randint(args.response_len // 2, args.response_len + 1, (1,), generator=g))
            prompts.append(ids)
            responses.append(torch.randint(3, tok.vocab_size, (n,), generator=g).tolist())
    batch = build_batch(prompts, responses, pad_id=tok.pad_token_id or 0)
    perm = torch.randperm(len(prompts), generator=g).tolist()
    micros = [perm[i : i + args.rows] for i in range(0, len(perm), args.rows)]
    p_len = sum(len(p) for p in prompts) / len(prompts)
    print(f"{model_dir.name} | {args.prompts} prompts x {args.group} samples, prompt {p_len:.0f} tokens, responses <= {args.response_len}, "
          f"micro-batches of {args.rows} rows (random order) | torch threads {torch.get_num_threads()}")

    def step(share: bool) -> tuple[float, torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        lps = []
        for idx in micros:
            mb = batch.select(idx)
            logp = logprobs_from_logits(response_logits(model, mb, share_prompts=share), mb.response_ids) * mb.valid
            logp.sum().backward()
            lps.append(logp.detach())
        dt = time.perf_counter() - t0
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return dt, torch.cat([x.flatten() for x in lps]), grads

    best: dict[bool, float] = {}
    last: dict[bool, tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}
    for r in range(args.rounds):
        for share in (False, True):
            dt, lp, gr = step(share)
            best[share] = min(best.get(share, dt), dt)
            last[share] = (lp, gr)
            print(f"  round {r + 1} {'shared prompt' if share else 'plain        '}: {dt:7.2f} s", flush=True)
    lp_diff = float((last[True][0] - last[False][0]).abs().max())
    g_diff = max(float((last[True][1][n] - last[False][1][n]).abs().max() / (last[False][1][n].abs().max() + 1e-12)) for n in last[False][1])
    print(f"plain {best[False]:.2f} s, shared {best[True]:.2f} s: {best[False] / best[True]:.2f}x faster "
          f"| max |logprob diff| {lp_diff:.1e}, max relative grad diff {g_diff:.1e}")


if __name__ == "__main__":
    main()
