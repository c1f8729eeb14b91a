"""Fixed-rollout update check for the training backends (run by tests/train/test_deepspeed.py).

Every process builds the same synthetic batch of GRPO groups (fixed prompts, responses and
rewards: no sampling), keeps its share of the groups (``groups[rank::world]``, as ``Collector.collect``
shares prompts), and runs the real ``Learner`` update: ``prepare`` (old log-probs from the current
policy) → ``advantages`` → ``update_policy`` (GRPO's loss + the positive-example NLL) → ``scheduler_step``, for ``--steps`` steps. After
step ``steps - 1`` it saves the model and the backend state, and at the end it resumes from them
into a fresh model + backend and redoes the last step. A config ending in "v" runs value
pretraining's update instead (``run_value``: the critic alone, the stage's own row); one ending in
"l" trains a LoRA adapter (``--lora-rank``'s: the base frozen, the adapter saved and resumed as
`train` does); "t" cuts micro-batches to a token budget; "a" runs ``--forward-mode auto``. Rank 0 writes everything to ``--out``.

    python tests/train/ds_worker.py --model DIR --backend torch --work W --out ref.pt
    torchrun --nproc_per_node 2 tests/train/ds_worker.py --model DIR --backend deepspeed --zero 2,3,3o --work W --out ds.pt
    python tests/train/ds_worker.py --model DIR --backend torch --zero 0l --work W --out ref_lora.pt
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import torch

GROUPS, GROUP_SIZE, MICRO, EPOCHS = 4, 4, 3, 2
HPARAMS = dict(lr=2e-3, weight_decay=0.1, grad_clip=0.5, warmup_steps=2)
LORA_RANK, LORA_LR = 4, 2e-2
TOKEN_BUDGET = 25  # "3t": ZeRO-3 with micro-batches cut to 25 tokens (the ranks need different counts)
# "3a": ZeRO-3 with --forward-mode auto: one mode per pass, chosen from every rank's token counts
# summed (an all-reduce in each pass: the ranks' collectives must stay in step); a choice that
# differed between ranks would differ in forward calls (packed one per micro-batch, shared two)
# and hang ZeRO-3 (test_batch shows the summed counts decide).


def fixed_groups(vocab: int, seed: int = 0) -> list[list[Any]]:
    from reasonrl.rollouts import Sample

    rng = random.Random(seed)
    groups = []
    for g in range(GROUPS):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 9))]
        group = []
        for j in range(GROUP_SIZE):
            resp = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 12))]
            correct = (j + g) % 3 == 0
            group.append(Sample(group=g, prompt_index=g, prompt="", prompt_ids=prompt, response="", response_ids=resp, logprobs=[0.0] * len(resp),
                                finish_reason="stop", truncated=False, ground_truth="0", reward=1.0 if correct else -1.0, correct=correct,
                                shaped_reward=1.0 if correct else -1.0))
        groups.append(group)
    return groups


def make_backend(kind: str, model: torch.nn.Module, zero: int, offload: bool, lora: bool = False) -> Any:
    hp = {**HPARAMS, "lr": LORA_LR} if lora else HPARAMS
    if kind == "torch":
        from reasonrl.train.backend import TorchBackend

        return TorchBackend(model, dtype="fp32", **hp)
    from reasonrl.train.ds_backend import DeepSpeedBackend

    return DeepSpeedBackend(model, dtype="fp32", zero=zero, offload=offload, micro_batch_size=MICRO, **hp)


def policy(model_dir: Path, lora: bool, ckpt: Path | None = None) -> torch.nn.Module:
    """The policy as `train` loads it: the HF directory (a checkpoint's), or for LoRA the base with a
    seeded adapter (the checkpoint's adapter loaded into it)."""
    from reasonrl.models.loading import load_causal_lm
    from reasonrl.models.lora import LoraSettings, apply_lora, load_adapter_weights

    if not lora:
        return load_causal_lm(ckpt or model_dir)
    model = apply_lora(load_causal_lm(model_dir), LoraSettings(LORA_RANK), seed=0, base_path=model_dir)
    if ckpt is not None:
        load_adapter_weights(model, ckpt)
    return model


def make_learner(model: torch.nn.Module, backend: Any, tok: Any, rank: int, world: int, n_local: int, budget: int = 0, mode: str = "shared") -> Any:
    from reasonrl.algos import get_algo
    from reasonrl.train.learner import Learner

    from reasonrl.algos import Sampling
    from reasonrl.train.ranks import Ranks

    # GRPO + VAPO's positive-example NLL: its denominator (correct-response tokens) is global across ranks too
    return Learner(spec=get_algo("grpo").replace(pos_lm_coef=0.1), policy=model, policy_backend=backend, critic_backend=None, ref_model=None,
                   sampling=Sampling(), pad_id=tok.pad_token_id, max_len=16, micro_batch_size=MICRO, mini_batch_size=n_local,
                   ppo_epochs=EPOCHS, dtype="fp32", seed=0, ranks=Ranks(rank, world), max_tokens_per_micro_batch=budget,
                   forward_mode=mode)


def train_step(loop: Any, groups: list[list[Any]]) -> dict[str, float]:
    st = loop.prepare(groups)
    loop.advantages(st, group_size=GROUP_SIZE)
    m = loop.update_policy(st)
    loop.policy_backend.scheduler_step()
    return {k.removeprefix("actor/"): float(v) for k, v in m.items() if isinstance(v, (int, float))}


def ranks(kind: str) -> tuple[int, int]:
    if kind == "deepspeed":  # joins the launcher's process group (once), or makes a world of one
        from reasonrl.train.ds_backend import init_distributed

        return init_distributed()
    return 0, 1


def run_value(model_dir: Path, kind: str, zero: int, steps: int) -> dict[str, Any] | None:
    """`pretrain-value`'s update on the fixed groups: prepare (values) → λ=1 returns → update_critic."""
    from reasonrl.algos import Sampling
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.models.value import new_value_model
    from reasonrl.stages.pretrain_value import value_spec
    from reasonrl.train.learner import Learner
    from reasonrl.train.ranks import Ranks

    rank, world = ranks(kind)
    tok = load_tokenizer(model_dir)
    groups = fixed_groups(len(tok))[rank::world]
    backend = make_backend(kind, new_value_model(model_dir, seed=0), zero, False)
    learner = Learner(spec=value_spec(0.95), policy=None, policy_backend=None, critic_backend=backend, ref_model=None, sampling=Sampling(),
                      pad_id=tok.pad_token_id, max_len=16, micro_batch_size=MICRO, mini_batch_size=len(groups) * GROUP_SIZE, ppo_epochs=1,
                      dtype="fp32", seed=0, ranks=Ranks(rank, world))
    metrics = []
    for _ in range(steps):
        st = learner.prepare(groups)
        learner.advantages(st, group_size=GROUP_SIZE)
        m = learner.update_critic(st)
        backend.scheduler_step()
        metrics.append({k.removeprefix("critic/"): float(v) for k, v in m.items()})
    weights = backend.full_state_dict()
    return {"world": world, "metrics": metrics, "weights": weights} if rank == 0 else None


def run(model_dir: Path, kind: str, zero: int, offload: bool, steps: int, work: Path, lora: bool = False, budget: int = 0,
        mode: str = "shared") -> dict[str, Any] | None:
    from reasonrl.models.loading import load_tokenizer
    from reasonrl.models.lora import engine_weights

    rank, world = ranks(kind)
    torch.manual_seed(0)
    tok = load_tokenizer(model_dir)
    groups = fixed_groups(len(tok))[rank::world]
    n_local = len(groups) * GROUP_SIZE
    model = policy(model_dir, lora)
    backend = make_backend(kind, model, zero, offload, lora)
    partitioned = all(p.numel() == 0 for p in backend.model.parameters())  # ZeRO-3: each rank holds only its shard
    loop = make_learner(backend.model, backend, tok, rank, world, n_local, budget, mode)
    metrics = []
    ckpt = work / "ckpt"
    for step in range(1, steps + 1):
        metrics.append(train_step(loop, groups))
        if step == steps - 1:
            backend.save_model(ckpt / "policy", tok)
            backend.save_state(ckpt / "state")
    weights = backend.full_state_dict()
    # Resume: a fresh model from the saved HF directory (LoRA: the base and the saved adapter) + the saved optimizer/scheduler state.
    model2 = policy(model_dir, lora, ckpt / "policy")
    backend2 = make_backend(kind, model2, zero, offload, lora)
    backend2.load_state(ckpt / "state")
    loop2 = make_learner(backend2.model, backend2, tok, rank, world, n_local, budget, mode)
    resumed = train_step(loop2, groups)
    resumed_weights = backend2.full_state_dict()
    if rank != 0:
        return None
    out = {"world": world, "partitioned": partitioned, "metrics": metrics, "weights": weights, "resumed_metrics": resumed, "resumed_weights": resumed_weights}
    if lora:  # what the engine gets (HF names, merged), and what the checkpoint holds
        out.update(weights=dict(engine_weights(backend.model, weights)), resumed_weights=dict(engine_weights(backend2.model, resumed_weights)),
                   adapter=weights, checkpoint=sorted(p.name for p in (ckpt / "policy").iterdir()),
                   state_bytes=sum(f.stat().st_size for f in (ckpt / "state").rglob("*") if f.is_file()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", choices=("torch", "deepspeed"), required=True)
    ap.add_argument("--zero", default="2", help="ZeRO configs, comma-separated, run in turn in one process group: 2, 3, 2o / 3o (CPU offload), 3v (value pretraining), "
                    "2l / 3l (LoRA), 3t (token-budget micro-batches), 3a (--forward-mode auto)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    results = {}
    for name in a.zero.split(","):
        if name.endswith("v"):
            results[name] = run_value(Path(a.model), a.backend, int(name[0]), a.steps)
        else:
            results[name] = run(Path(a.model), a.backend, int(name[0]), name.endswith("o"), a.steps, Path(a.work) / f"zero{name}", lora=name.endswith("l"),
                                budget=TOKEN_BUDGET if name.endswith("t") else 0, mode="auto" if name.endswith("a") else "shared")
    if results[name] is not None:
        torch.save(results, a.out)


if __name__ == "__main__":
    main()
