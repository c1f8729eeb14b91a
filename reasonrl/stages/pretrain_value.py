"""`reasonrl pretrain-value`: VC-PPO value pretraining with the policy fixed.

Sample G responses per prompt from the fixed initial policy, reward them, compute λ = 1 targets
(Monte-Carlo returns with γ = 1), and train only the value model for N steps. Before and after, on a
fixed held-out batch, record the value loss, explained variance and the mean value and advantage
by token position: the initialisation bias that VC-PPO removes (early tokens valued low, a
positive advantage bias growing toward the start of a response).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from reasonrl import algos as A
from reasonrl.artifacts import prepare_out_dir, write_json, write_manifest
from reasonrl.config import check, opt, to_dict
from reasonrl.stages.options import ModelOpts, SamplingOpts


@dataclass
class PretrainValueConfig(ModelOpts, SamplingOpts):
    data: str = opt("runs/data", "Prepared data directory (output of `reasonrl prepare-data`).")
    out: str = opt("runs/critic", "Output directory: critic/ (HF directory), metrics.jsonl, bias.json, manifest.json.")
    critic_init: str | None = opt(None, "Initialise the value model from this directory (e.g. a reward model); default: the policy's backbone.")
    steps: int = opt(20, "Value-training steps (each on freshly sampled responses). More is not always better: it overfits.")
    prompts_per_step: int = opt(16, "Prompts sampled per step (× group_size responses).")
    mini_batch_size: int = opt(64, "Responses per critic optimizer update.")
    micro_batch_size: int = opt(16, "Responses per forward/backward pass.")
    critic_lr: float = opt(1e-5, "Critic learning rate (AdamW).")
    warmup_steps: int = opt(0, "Linear LR warm-up in steps, then constant.")
    weight_decay: float = opt(0.0, "AdamW weight decay.")
    grad_clip: float = opt(1.0, "Gradient-norm clipping (0 = off).")
    lam_actor: float = opt(0.95, "λ used for the advantage-by-position picture (the actor's λ in vcppo).")
    eval_prompts: int = opt(8, "Held-out validation prompts for the before/after bias picture.")
    overwrite: bool = opt(False, "Replace a finished output directory.")

    def __post_init__(self) -> None:
        self._check_model()
        self._check_sampling()
        check(self.steps >= 0, "steps must be >= 0")
        check(self.temperature > 0, "temperature must be > 0: value pretraining samples the policy's responses (greedy would repeat one)")
        check(self.prompts_per_step >= 1, "prompts_per_step must be >= 1")
        check(self.micro_batch_size <= self.mini_batch_size, "micro_batch_size cannot exceed mini_batch_size")
        check(self.critic_lr > 0, "critic_lr must be > 0")
        check(0 <= self.lam_actor <= 1, "lam_actor must be in [0, 1]")
        check(self.eval_prompts >= 1, "eval_prompts must be >= 1")


def _picture(learner: Any, st: Any, group_size: int) -> dict[str, Any]:
    from reasonrl.train.metrics import position_metrics

    learner.advantages(st, group_size=group_size)
    vl, _ = A.value_loss(st.values, st.values, st.returns, st.batch.valid)
    pos = position_metrics(st)
    m = {"value_by_position": pos["critic/value_by_position"], "advantage_by_position": pos["actor/advantage_by_position"],
         "explained_variance": pos["critic/explained_variance"]}
    m["value_loss"] = float(vl)
    m["value_mean"] = float(A.masked_mean(st.values, st.batch.valid))
    m["advantage_mean"] = float(A.masked_mean(st.advantages, st.batch.valid))
    return m


def run_pretrain_value(cfg: PretrainValueConfig, console: Any = None) -> dict[str, Any]:
    from rich.console import Console

    from reasonrl.data import load_prepared
    from reasonrl.devices import resolve_dtype
    from reasonrl.engines.base import SamplingParams
    from reasonrl.engines.registry import make_engine
    from reasonrl.models.loading import check_weights, load_causal_lm, load_tokenizer
    from reasonrl.models.value import new_value_model
    from reasonrl.rewards import RewardScorer
    from reasonrl.train.backend import TorchBackend
    from reasonrl.train.collector import Collector, DataStream
    from reasonrl.train.learner import Learner
    from reasonrl.train.metrics import append_jsonl, flatten_metrics, position_metrics, rollout_metrics

    console = console or Console(stderr=True)
    rows = load_prepared(cfg.data, "train")
    try:
        val_rows = load_prepared(cfg.data, "validation")
    except Exception:  # noqa: BLE001 - a data dir without validation split: hold out from train
        val_rows = []
    val_rows = val_rows or rows[: cfg.eval_prompts]
    policy_dir = cfg.policy_dir()
    init_dir = check_weights(cfg.critic_init, cfg.allow_pickle) if cfg.critic_init else policy_dir
    out = prepare_out_dir(cfg.out, overwrite=cfg.overwrite)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    torch.manual_seed(cfg.seed)
    dtype = resolve_dtype(cfg.dtype)
    tok = load_tokenizer(policy_dir)
    policy = load_causal_lm(policy_dir).eval()
    for p in policy.parameters():
        p.requires_grad_(False)
    critic = new_value_model(init_dir, seed=cfg.seed)
    critic_backend = TorchBackend(critic, lr=cfg.critic_lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, warmup_steps=cfg.warmup_steps, dtype=dtype)
    spec = dataclasses.replace(A.get_algo("vcppo"), lam_actor=cfg.lam_actor, lam_critic=1.0, whiten_advantages=False,
                               dynamic_sampling=False, overlong_filter=False, overlong_penalty=False)
    engine = make_engine(cfg, str(policy_dir), seed=cfg.seed, max_model_len=cfg.max_prompt_len + cfg.max_response_len)
    scorer = RewardScorer()
    sampling = SamplingParams(n=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_tokens=cfg.max_response_len)
    mk = lambda rows_: Collector(spec=spec, engine=engine, tokenizer=tok, scorer=scorer, stream=DataStream(rows_, cfg.seed),  # noqa: E731
                                 sampling=sampling, max_prompt_len=cfg.max_prompt_len, overlong_cache_len=0)
    collector, held = mk(rows), mk(val_rows)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    learner = Learner(spec=spec, policy=policy, policy_backend=None, critic_backend=critic_backend, ref_model=None,
                      sampling=A.Sampling(cfg.temperature, cfg.top_k, cfg.top_p), pad_id=pad_id,
                      max_len=cfg.max_response_len, micro_batch_size=cfg.micro_batch_size, mini_batch_size=cfg.mini_batch_size,
                      ppo_epochs=1, dtype=dtype, seed=cfg.seed)
    history: list[dict[str, Any]] = []
    try:
        with console.status("sampling the held-out batch"):
            held_col = held.collect(min(cfg.eval_prompts, len(val_rows)), dynamic=False)
        held_st = learner.prepare(held_col.groups)
        before = _picture(learner, held_st, cfg.group_size)
        console.print(f"[bold]pretrain-value[/] on {policy_dir} ({len(rows)} prompts) | before: value loss {before['value_loss']:.4f}, explained variance {before.get('explained_variance', 0):.3f}")
        for step in range(1, cfg.steps + 1):
            col = collector.collect(cfg.prompts_per_step, step=step, dynamic=False)
            if not col.groups:
                continue
            st = learner.prepare(col.groups, step=step)
            learner.advantages(st, group_size=cfg.group_size)
            m = {"step": step, **rollout_metrics(col, st), **learner.update_critic(st)}
            critic_backend.scheduler_step()
            m.update(position_metrics(st))
            history.append(m)
            append_jsonl(out / "metrics.jsonl", m)
            console.print(f"value step {step}/{cfg.steps} | vf_loss {m.get('critic/vf_loss', float('nan')):.4f} | "
                          f"explained var {m.get('critic/explained_variance', float('nan')):.3f} | acc {m.get('rollout/acc_mean', 0):.3f}")
        held_st = learner.prepare(held_col.groups)  # values under the trained critic, same responses
        after = _picture(learner, held_st, cfg.group_size)
    finally:
        scorer.close()
        engine.close()
    critic_backend.save_model(out / "critic", tok)
    bias = {"before": before, "after": after, "held_out_responses": sum(len(g) for g in held_col.groups)}
    write_json(out / "bias.json", bias)
    summary = {"steps": cfg.steps, "before": flatten_metrics(before), "after": flatten_metrics(after), "last": flatten_metrics(history[-1]) if history else {}}
    write_json(out / "summary.json", summary)
    write_manifest(out, "pretrain-value", to_dict(cfg), {"data": cfg.data, "policy": str(policy_dir)}, extra={"outputs": ["critic/", "metrics.jsonl", "bias.json"]})
    console.print(f"critic → {out / 'critic'} | held-out value loss {before['value_loss']:.4f} → {after['value_loss']:.4f}, "
                  f"explained variance {before.get('explained_variance', 0):.3f} → {after.get('explained_variance', 0):.3f}")
    return summary
