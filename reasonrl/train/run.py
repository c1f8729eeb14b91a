"""`reasonrl train`: set up models, engine, backends and data, then run the loop with checkpoints."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from reasonrl import algos as A
from reasonrl.artifacts import MANIFEST, prepare_out_dir, read_manifest, write_json, write_manifest
from reasonrl.config import to_dict
from reasonrl.engines.base import SamplingParams, make_engine
from reasonrl.errors import MissingArtifactError, ReasonRLError
from reasonrl.models.loading import load_causal_lm, load_tokenizer, resolve_model
from reasonrl.train.backend import TorchBackend, resolve_dtype
from reasonrl.train.config import TrainConfig
from reasonrl.train.trainer import (
    DataStream,
    Loop,
    append_jsonl,
    flatten_metrics,
    log_line,
    position_metrics,
    rollout_metrics,
)


def algo_spec(cfg: TrainConfig) -> A.AlgoSpec:
    """The algo's row with the config's explicit overrides applied."""
    spec = A.get_algo(cfg.algo)
    over = {k: getattr(cfg, k) for k in ("eps_low", "eps_high", "dual_clip", "loss_agg", "kl_coef", "lam_actor", "lam_critic") if getattr(cfg, k) is not None}
    return dataclasses.replace(spec, **over) if over else spec


def critic_dir(path: str | Path) -> Path:
    """Accept a `pretrain-value` output directory (critic in critic/) or a critic HF directory."""
    p = Path(path)
    if not p.exists():
        raise MissingArtifactError(f"critic {p} not found: run `reasonrl pretrain-value --out {p}` first")
    if (p / "critic" / "config.json").is_file():
        read_manifest(p, stage="pretrain-value", hint=f"reasonrl pretrain-value --out {p}")
        return p / "critic"
    if (p / "config.json").is_file():
        return p
    raise MissingArtifactError(f"{p} holds no critic: run `reasonrl pretrain-value --out {p}` first")


def resolve_policy(model: str) -> Path:
    """A model directory, 'default', or a finished train run (its policy/)."""
    p = Path(model)
    if p.is_dir() and (p / "policy" / "config.json").is_file():
        return p / "policy"
    return resolve_model(model)


def make_backend(cfg: TrainConfig, model: torch.nn.Module, lr: float, dtype: str) -> Any:
    if cfg.backend == "deepspeed":
        from reasonrl.train.ds_backend import DeepSpeedBackend

        return DeepSpeedBackend(model, lr=lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, warmup_steps=cfg.warmup_steps,
                                dtype=dtype, zero=cfg.zero, offload=cfg.offload, micro_batch_size=cfg.micro_batch_size)
    return TorchBackend(model, lr=lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, warmup_steps=cfg.warmup_steps, dtype=dtype)


def latest_checkpoint(out: Path) -> Path | None:
    f = out / "checkpoints" / "latest"
    if f.is_file():
        p = out / "checkpoints" / f.read_text().strip()
        if (p / "trainer_state.json").is_file():
            return p
    return None


def run_train(cfg: TrainConfig, console: Any = None) -> dict[str, Any]:
    from rich.console import Console

    from reasonrl.data import load_prepared
    from reasonrl.rewards import RewardScorer

    console = console or Console(stderr=True)
    spec = algo_spec(cfg)
    out = Path(cfg.out)
    # Validate every input before anything is written.
    rows = load_prepared(cfg.data, "train")
    if not rows:
        raise ReasonRLError(f"{cfg.data} has no training rows: run `reasonrl prepare-data` on a larger dataset")
    policy_dir = resolve_policy(cfg.model)
    cdir: Path | None = None
    if spec.use_critic:
        if cfg.critic:
            cdir = critic_dir(cfg.critic)
        elif spec.pretrained_critic_required:
            raise MissingArtifactError(f"--algo {cfg.algo} needs a pretrained critic: run `reasonrl pretrain-value` first and pass --critic runs/critic")
    elif cfg.critic:
        console.print(f"[yellow]note: --algo {cfg.algo} uses no critic; --critic is ignored[/]")

    rank, world = 0, 1
    if cfg.backend == "deepspeed":
        from reasonrl.train.ds_backend import init_distributed

        rank, world = init_distributed()
    ckpt = None
    if cfg.resume:
        ckpt = latest_checkpoint(out)
        if ckpt is None:
            raise ReasonRLError(f"--resume: no checkpoint in {out}/checkpoints: run without --resume (or check --out)")
    elif rank == 0:
        prepare_out_dir(out, overwrite=cfg.overwrite)
        for sub in ("checkpoints", "rollouts", "policy"):
            shutil.rmtree(out / sub, ignore_errors=True)
        (out / "metrics.jsonl").unlink(missing_ok=True)
    if world > 1:
        torch.distributed.barrier()

    random.seed(cfg.seed + rank)
    torch.manual_seed(cfg.seed)
    dtype = resolve_dtype(cfg.dtype)
    tok = load_tokenizer(policy_dir)
    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    policy = load_causal_lm(ckpt / "policy" if ckpt else policy_dir, device=device)
    policy.config.use_cache = False
    ref = load_causal_lm(policy_dir, device=device).eval() if spec.kl_coef > 0 else None
    critic_backend = None
    if spec.use_critic:
        from reasonrl.models.value import load_value_model, new_value_model

        critic = load_value_model(ckpt / "critic") if ckpt else (load_value_model(cdir) if cdir else new_value_model(policy_dir, seed=cfg.seed))
        critic = critic.to(device)
        critic_backend = make_backend(cfg, critic, cfg.critic_lr, dtype)
    policy_backend = make_backend(cfg, policy, cfg.lr, dtype)
    stream = DataStream(rows, cfg.seed)
    start = 0
    if ckpt:
        st = json.loads((ckpt / "trainer_state.json").read_text())
        start = int(st["step"])
        stream.load(st["data"])
        policy_backend.load_state(ckpt / "policy_state")
        if critic_backend is not None:
            critic_backend.load_state(ckpt / "critic_state")
        rng = torch.load(ckpt / "rng.pt", weights_only=True)
        torch.set_rng_state(rng["torch"])
        console.print(f"resumed from {ckpt} (step {start})")

    engine = make_engine(cfg.engine, str(policy_dir), dtype=cfg.dtype, seed=cfg.seed + rank, batch_size=cfg.gen_batch_size,
                         max_model_len=cfg.max_prompt_len + cfg.max_response_len)
    if ckpt:
        engine.update_weights(policy_backend.full_state_dict())
    sampling = SamplingParams(n=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_tokens=cfg.max_response_len)
    scorer = RewardScorer()
    loop = Loop(spec=spec, engine=engine, tokenizer=tok, scorer=scorer, stream=stream, policy=policy, policy_backend=policy_backend,
                critic_backend=critic_backend, ref_model=ref, sampling=sampling, max_prompt_len=cfg.max_prompt_len,
                overlong_cache_len=cfg.overlong_cache_len, micro_batch_size=cfg.micro_batch_size, mini_batch_size=max(1, cfg.mini_batch_size // world),
                ppo_epochs=cfg.ppo_epochs, dtype=dtype, seed=cfg.seed + start, oversample=cfg.oversample,
                max_gen_rounds=cfg.max_gen_rounds, rank=rank, world_size=world, console=console)
    if rank == 0:
        write_json(out / "config.json", {**to_dict(cfg), "resolved_algo": dataclasses.asdict(spec), "dtype_resolved": dtype, "engine_resolved": engine.name, "world_size": world})
        console.print(f"[bold]train[/] --algo {cfg.algo} on {policy_dir} | engine {engine.name} | backend {cfg.backend} ×{world} | {dtype} | {len(rows)} prompts")
    history: list[dict[str, Any]] = []
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    progress = Progress(TextColumn("[bold]train[/] {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=console, disable=rank != 0, transient=True)
    task = progress.add_task(f"--algo {cfg.algo}", total=cfg.steps, completed=start)
    try:
        progress.start()
        for step in range(start + 1, cfg.steps + 1):
            m = train_step(loop, cfg, step)
            samples = m.pop("_samples", [])
            history.append(m)
            progress.advance(task)
            if rank == 0:
                append_jsonl(out / "metrics.jsonl", m)
                if step % cfg.log_every == 0 or step == cfg.steps:
                    progress.console.print(log_line(step, cfg.steps, m))
                if cfg.keep_rollouts:
                    from reasonrl.rollout import write_rollouts

                    write_rollouts(out / "rollouts" / f"step_{step}.parquet", samples, step=step)
            if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
                save_checkpoint(out, step, loop, tok, rank)
    finally:
        progress.stop()
        scorer.close()
        engine.close()
    if rank == 0:
        final = out / "checkpoints" / f"step_{cfg.steps}" / "policy"
        if (out / "policy").exists():
            shutil.rmtree(out / "policy")
        shutil.copytree(final, out / "policy")
        summary = {"steps": cfg.steps, "last": flatten_metrics(history[-1]) if history else {}}
        write_json(out / "summary.json", summary)
        write_manifest(out, "train", to_dict(cfg), {"data": cfg.data, "policy": str(policy_dir), "critic": str(cdir) if cdir else None},
                       extra={"algo": dataclasses.asdict(spec), "outputs": ["policy/", "metrics.jsonl", "checkpoints/", "summary.json"]})
    if world > 1:
        torch.distributed.barrier()
    return {"history": history, "out": str(out)}


def train_step(loop: Loop, cfg: TrainConfig, step: int) -> dict[str, Any]:
    t_step = time.perf_counter()
    col = loop.collect(math.ceil(cfg.prompts_per_step / loop.world))  # prompts_per_step is global; each rank generates its share
    m: dict[str, Any] = {"step": step}
    if loop.world > 1:
        # Every rank must make the same number of updates: keep the smallest kept count.
        n = torch.tensor([len(col.groups)], dtype=torch.long)
        torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MIN)
        col.groups = col.groups[: int(n)]
    if not col.groups:
        m.update(rollout_metrics(col, None))
        m["skipped_update"] = 1
        loop.policy_backend.scheduler_step()
        m["_samples"] = col.generated
        return m
    t0 = time.perf_counter()
    st = loop.prepare(col.groups)
    loop.advantages(st, group_size=cfg.group_size)
    m.update(rollout_metrics(col, st))
    upd: dict[str, float] = {}
    if loop.critic_backend is not None:
        upd.update(loop.update_critic(st))
        loop.critic_backend.scheduler_step()
    upd.update(loop.update_policy(st))
    loop.policy_backend.scheduler_step()
    train_s = time.perf_counter() - t0
    m.update(upd)
    m.update(position_metrics(st))
    n_tok = int(st.batch.attention_mask.sum())
    m["train_tokens"] = n_tok
    m["train_tokens_per_s"] = n_tok * cfg.ppo_epochs / max(train_s, 1e-9)  # tokens through the policy update per second
    m["weight_sync_s"] = loop.sync_engine()
    m["step_seconds"] = time.perf_counter() - t_step
    m["_samples"] = col.generated
    return m


def save_checkpoint(out: Path, step: int, loop: Loop, tok: Any, rank: int) -> Path:
    d = out / "checkpoints" / f"step_{step}"
    tmp = out / "checkpoints" / f".step_{step}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if loop.world > 1:
        torch.distributed.barrier()
    loop.policy_backend.save_model(tmp / "policy", tok)
    loop.policy_backend.save_state(tmp / "policy_state")
    if loop.critic_backend is not None:
        loop.critic_backend.save_model(tmp / "critic")
        loop.critic_backend.save_state(tmp / "critic_state")
    if rank == 0:
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        write_json(tmp / "trainer_state.json", {"step": step, "data": loop.stream.state()})
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
        (out / "checkpoints" / "latest").write_text(d.name + "\n")
    if loop.world > 1:
        torch.distributed.barrier()
    return d


__all__ = ["run_train", "TrainConfig", "MANIFEST"]
