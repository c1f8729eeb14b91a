"""The learner's part of a step (prepare + policy update), variants side by side in one process.

    .venv/bin/python bench/update_step.py                                  # fewshot shape, the three variants, micro-batch 16
    .venv/bin/python bench/update_step.py --regime math                    # decode-heavy shape (responses near 256)
    .venv/bin/python bench/update_step.py --variants default --micro 8,16,32,64   # the micro-batch size
    .venv/bin/python bench/update_step.py --rollouts RUN/rollouts/step_2.parquet  # a real step's prompts and responses
    .venv/bin/python bench/update_step.py --variants default --chunk-bytes 805306368,2097152   # log-prob/entropy chunks: 1024 rows vs cache-sized
    .venv/bin/python bench/update_step.py --variants default --rounds 2 --profile 25  # where the update's time goes (torch.profiler, top ops)

The batch: 8 prompts x 8 samples of the regime's prepared prompts (bench/harness.py), responses of
random tokens (timing does not depend on their values) with lengths drawn like the regime's
(``fewshot``: ~17 tokens, a few at the cap of 64; ``math``: 70% at the cap of 256, the rest
60..255), or a real step's rollouts (``reasonrl train --keep-rollouts``). GRPO's loss
(token-mean, eps 0.2/0.28), one update per batch, the run's dtype (``--dtype auto``: bf16 here).

Variants (one model and optimizer; every run starts from the same weights):

- ``separate``: the old log-probs from a separate no-grad pass, micro-batches cut in the
  mini-batch's random order (reasonrl before issue 12);
- ``fused``: the old log-probs from the update's own forward (decided in ``Learner.prepare``), random order;
- ``default``: fused, and micro-batches arranged by prompt / length (``Learner.micro_batches``:
  ``reasonrl.train.micro.plan`` / ``arrange``): what ``reasonrl train`` does.

The random-order variants replace the learner's ``micro_batches`` (the one place a mini-batch is cut
for the updates) with a cut in the mini-batch's own order; the script stops if the learner no longer
has it (it used to set a ``Learner.arrange`` that no longer existed: silently, every variant was arranged).

Rounds alternate the variants so load from other jobs hits all alike; the first round is a warm-up
(first-call allocations, AdamW state) and is left out; the median of the rest is reported, and each
variant's ratio to the first, and its gradients (last round) against the first variant's, and the
tokens its cut of one mini-batch order makes the shared-prompt forward run (``fwd tokens``: the
random-order cut computes a prompt once per micro-batch it is in, and pads more).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import harness as H


def batch_groups(a: argparse.Namespace, tok: Any) -> list[list[Any]]:
    from reasonrl.data import load_prepared
    from reasonrl.rollouts import Sample, prompt_text
    from reasonrl.train.collector import DataStream

    if a.rollouts:
        import pyarrow.parquet as pq

        recs = [r for r in pq.read_table(a.rollouts).to_pylist() if r.get("kept", True)]
        by: dict[int, list[Any]] = {}
        for r in recs:
            by.setdefault(r["group"], []).append(Sample(**{k: r[k] for k in Sample.__dataclass_fields__ if k in r}))
        return list(by.values())
    regime = H.REGIMES[a.regime]
    rows, _ = DataStream(load_prepared(H.prepare(regime, H.Path(a.workdir)), "train"), 0).take(a.prompts)
    rng = random.Random(0)
    cap = regime.max_response_len

    def length() -> int:
        if a.regime == "math":
            return cap if rng.random() < 0.7 else rng.randint(60, cap - 1)
        return cap if rng.random() < 0.02 else max(5, min(cap, round(rng.gauss(17, 6))))

    groups = []
    for g, row in enumerate(rows):
        ids = tok(prompt_text(row, tok), add_special_tokens=False)["input_ids"]
        group = []
        for j in range(a.group_size):
            n = length()
            resp = [rng.randrange(3, len(tok)) for _ in range(n)]
            correct = (g + j) % 2 == 0
            group.append(Sample(group=g, prompt_index=g, prompt="", prompt_ids=ids, response="", response_ids=resp, logprobs=[-1.0] * n,
                                finish_reason="length" if n == cap else "stop", truncated=n == cap, ground_truth="0",
                                reward=1.0 if correct else -1.0, correct=correct, shaped_reward=1.0 if correct else -1.0))
        groups.append(group)
    return groups


def cut_tokens(learner: Any, st: Any) -> int:
    """Tokens the shared-prompt forward runs (padding included) over ``learner``'s micro-batches of
    one mini-batch order (the batch shuffled by a fixed seed): the cost its cut makes."""
    import torch

    from reasonrl.train.micro import minibatches, row_lengths

    n = st.batch.input_ids.shape[0]
    order = minibatches(n, epochs=1, size=n, gen=torch.Generator().manual_seed(0))[0]
    group = st.group.tolist() if st.group is not None else list(range(n))
    lens = row_lengths(st.batch.attention_mask, st.batch.valid, st.batch.prompt_len, group, "shared")
    return sum(lens.cost(m) for m in learner.micro_batches(st, order))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default="default")
    ap.add_argument("--regime", default="fewshot", choices=sorted(H.REGIMES))
    ap.add_argument("--rollouts", default=None, help="a rollouts parquet (reasonrl train --keep-rollouts) instead of the synthetic batch")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--variants", default="separate,fused,default", help="comma list of: separate, fused, default")
    ap.add_argument("--micro", default="16", help="micro-batch sizes (comma list): every variant at each")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--chunk-bytes", default=None, help="comma list of reasonrl.algos.logits.CPU_CHUNK_BYTES values to time (the default chunk's size on CPU)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (the first is a warm-up)")
    ap.add_argument("--workdir", default="/tmp/reasonrl-bench")
    ap.add_argument("--profile", type=int, default=0, help="after the rounds, one more step of the first variant under torch.profiler: its top N ops by self CPU time")
    a = ap.parse_args()

    import torch

    from reasonrl.algos import Sampling, get_algo
    from reasonrl.devices import resolve_dtype
    from reasonrl.models import load_tokenizer, resolve_model
    from reasonrl.models.loading import load_causal_lm
    from reasonrl.train.backend import TorchBackend
    from reasonrl.train.learner import Learner
    from reasonrl.train.micro import by_rows

    model_dir = resolve_model(a.model)
    tok = load_tokenizer(model_dir)
    dtype = resolve_dtype(a.dtype)
    groups = batch_groups(a, tok)
    flat = [s for g in groups for s in g]
    n = len(flat)
    spec = get_algo("grpo").replace(loss_agg="token-mean", eps_high=0.28)
    print(f"{model_dir.name} | {len(groups)} prompts x {len(groups[0])} samples, prompt {statistics.fmean(len(s.prompt_ids) for s in flat):.0f} "
          f"tokens, responses mean {statistics.fmean(s.length for s in flat):.1f} max {max(s.length for s in flat)} | {dtype} | "
          f"torch threads {torch.get_num_threads()}")

    torch.manual_seed(0)
    model = load_causal_lm(model_dir)
    backend = TorchBackend(model, lr=1e-6, weight_decay=0.1, grad_clip=1.0, warmup_steps=0, dtype=dtype)
    snap = {k: v.clone() for k, v in model.state_dict().items()}  # every run starts from these weights
    runs: dict[str, Any] = {}
    import reasonrl.algos.logits as L

    chunks = [int(x) for x in a.chunk_bytes.split(",")] if a.chunk_bytes else [L.CPU_CHUNK_BYTES]
    for micro, chunk, v in [(m, c, v) for m in map(int, a.micro.split(",")) for c in chunks for v in a.variants.split(",")]:
        learner = Learner(spec=spec, policy=model, policy_backend=backend, critic_backend=None, ref_model=None, sampling=Sampling(),
                          pad_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id, max_len=max(s.length for s in flat),
                          micro_batch_size=micro, mini_batch_size=n, ppo_epochs=1, dtype=dtype, seed=0, fuse_old_logp=v != "separate")
        if v != "default":  # the micro-batches cut in the mini-batch's random order, as before issue 12
            if not callable(getattr(learner, "micro_batches", None)):
                raise SystemExit("reasonrl.train.learner.Learner has no micro_batches (the cut of a mini-batch): update this bench's random-order variants")
            learner.micro_batches = lambda st, rows, m=micro: by_rows(rows, m)  # type: ignore[method-assign]
        name = f"{v} micro {micro}" + (f" chunk {chunk >> 10} KiB" if a.chunk_bytes else "")
        runs[name] = {"learner": learner, "chunk": chunk, "prepare": [], "update": []}

    for rnd in range(a.rounds):
        for name, r in runs.items():
            learner = r["learner"]
            L.CPU_CHUNK_BYTES = r["chunk"]
            model.load_state_dict(snap)
            t0 = time.perf_counter()
            st = learner.prepare(groups, step=rnd + 1)
            t1 = time.perf_counter()
            learner.advantages(st, group_size=len(groups[0]))
            learner.update_policy(st)
            t2 = time.perf_counter()
            if rnd:
                r["prepare"].append(t1 - t0)
                r["update"].append(t2 - t1)
            r["grads"] = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
            r["tokens"] = cut_tokens(learner, st)
            print(f"  round {rnd + 1} {name:32s} prepare {t1 - t0:6.2f} s  update {t2 - t1:6.2f} s  total {t2 - t0:6.2f} s"
                  + ("  (warm-up)" if not rnd else ""), flush=True)
    base = None
    print(f"\n{'variant':32s} {'prepare s':>9s} {'update s':>9s} {'total s':>8s} {'x first':>8s} {'max rel grad diff':>18s} {'fwd tokens':>10s}")
    for name, r in runs.items():
        p, u = statistics.median(r["prepare"]), statistics.median(r["update"])
        tot = statistics.median([x + y for x, y in zip(r["prepare"], r["update"])])
        base = base or (tot, r["grads"])
        diff = max(float((r["grads"][k] - base[1][k]).abs().max() / (base[1][k].abs().max() + 1e-12)) for k in base[1])
        print(f"{name:32s} {p:9.2f} {u:9.2f} {tot:8.2f} {base[0] / tot:7.2f}x {diff:18.1e} {r['tokens']:10d}")
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        name, r = next(iter(runs.items()))
        model.load_state_dict(snap)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            st = r["learner"].prepare(groups, step=a.rounds + 1)
            r["learner"].advantages(st, group_size=len(groups[0]))
            r["learner"].update_policy(st)
        print(f"\nprofile of one step ({name}), top {a.profile} ops by self CPU time:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.profile, max_name_column_width=48))


if __name__ == "__main__":
    main()
