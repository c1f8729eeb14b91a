"""`reasonrl train`'s configuration: one documented dataclass (defaults: the embedded CPU run)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from reasonrl.config import check, opt
from reasonrl.stages.common import ModelOpts, SamplingOpts

BACKENDS = ("torch", "deepspeed")


@dataclass
class TrainConfig(ModelOpts, SamplingOpts):
    data: str = opt("runs/data", "Prepared data directory (output of `reasonrl prepare-data`).")
    out: str = opt("runs/train", "Run directory: metrics.jsonl, checkpoints/, policy/ (final HF model), manifest.json.")
    algo: str = opt("dapo", "Algorithm row: ppo, vcppo, grpo or dapo (see the --algo table in the README).")
    critic: str | None = opt(None, "Critic: a `pretrain-value` output directory (required by vcppo); ppo starts a fresh one from the policy when omitted.")
    steps: int = opt(20, "Training steps (each: rollout, rewards, filtering, advantages, updates).")
    prompts_per_step: int = opt(16, "Prompts per training step over all processes (after dynamic sampling); the batch holds prompts_per_step × group_size responses.")
    oversample: float = opt(1.0, "Dynamic sampling: each generation round samples ceil(oversample × still-needed) prompts.")
    max_gen_rounds: int = opt(10, "Dynamic sampling: cap on generation rounds per step; then train on what was kept (reported).")
    mini_batch_size: int = opt(64, "Responses per optimizer update over all processes: a step makes ceil(batch / mini_batch_size) × ppo_epochs updates.")
    micro_batch_size: int = opt(16, "Responses per forward/backward pass in each process (gradient accumulation inside a mini-batch).")
    ppo_epochs: int = opt(1, "Passes over the step's batch.")
    lr: float = opt(1e-6, "Policy learning rate (AdamW; DAPO: 1e-6).")
    critic_lr: float = opt(1e-5, "Critic learning rate.")
    warmup_steps: int = opt(0, "Linear LR warm-up, in training steps (DAPO: 20), then constant.")
    weight_decay: float = opt(0.1, "AdamW weight decay.")
    grad_clip: float = opt(1.0, "Gradient-norm clipping (0 = off).")
    eps_low: float | None = opt(None, "Lower clip ε (default: the algo's row).")
    eps_high: float | None = opt(None, "Upper clip ε (default: the algo's row; DAPO 0.28).")
    dual_clip: float | None = opt(None, "Dual-clip constant c for negative advantages (e.g. 3.0; off by default).")
    loss_agg: str | None = opt(None, "Loss aggregation: token-mean, seq-mean-token-mean or seq-mean-token-sum-norm (default: the algo's row).")
    kl_coef: float | None = opt(None, "KL penalty coefficient against the initial policy, in the loss (default: the algo's row; DAPO 0).")
    lam_actor: float | None = opt(None, "GAE λ for the actor's advantages (default: the algo's row).")
    lam_critic: float | None = opt(None, "GAE λ for the critic's targets (default: the algo's row).")
    overlong_cache_len: int | None = opt(None, "Soft overlong punishment buffer L_cache (DAPO: 4096 of 20480): punishment starts at max_response_len − overlong_cache_len; default max_response_len // 5, the paper's ratio.")
    backend: str = opt("torch", "Training backend: 'torch' (one process) or 'deepspeed' (ZeRO; start with torchrun/deepspeed).")
    zero: int = opt(2, "DeepSpeed ZeRO stage (2 or 3).")
    offload: bool = opt(False, "DeepSpeed: offload optimizer state (and ZeRO-3 parameters) to CPU memory.")
    save_every: int = opt(0, "Save a checkpoint every N steps (0: only at the end).")
    keep_rollouts: bool = opt(False, "Write each step's rollouts to out/rollouts/step_N.parquet.")
    resume: bool = opt(False, "Continue from the latest checkpoint in out/.")
    overwrite: bool = opt(False, "Replace a finished run in out/.")
    log_every: int = opt(1, "Print a metrics line every N steps.")

    def __post_init__(self) -> None:
        self._check_model()
        self._check_sampling()
        from reasonrl.algos import ALGOS

        check(self.algo in ALGOS, f"unknown --algo '{self.algo}': choose one of {', '.join(ALGOS)}")
        check(self.steps >= 1, "steps must be >= 1")
        check(self.prompts_per_step >= 1, "prompts_per_step must be >= 1")
        check(self.mini_batch_size >= 1 and self.micro_batch_size >= 1, "mini_batch_size and micro_batch_size must be >= 1")
        check(self.micro_batch_size <= self.mini_batch_size, f"micro_batch_size ({self.micro_batch_size}) cannot exceed mini_batch_size ({self.mini_batch_size}): lower --micro-batch-size")
        check(self.ppo_epochs >= 1, "ppo_epochs must be >= 1")
        check(self.lr > 0 and self.critic_lr > 0, "lr and critic_lr must be > 0")
        check(self.oversample >= 1.0, "oversample must be >= 1.0")
        check(self.max_gen_rounds >= 1, "max_gen_rounds must be >= 1")
        if self.overlong_cache_len is None:
            self.overlong_cache_len = self.max_response_len // 5
        check(0 <= self.overlong_cache_len < self.max_response_len, f"overlong_cache_len must be in [0, max_response_len={self.max_response_len})")
        check(self.backend in BACKENDS, f"backend must be one of {BACKENDS}, got '{self.backend}'")
        check(self.zero in (0, 1, 2, 3), "zero must be 0, 1, 2 or 3")
        check(not (self.resume and self.overwrite), "--resume and --overwrite conflict: choose one")
        for name in ("eps_low", "eps_high"):
            v = getattr(self, name)
            check(v is None or 0 <= v < 1, f"{name} must be in [0, 1)")
        check(self.dual_clip is None or self.dual_clip > 1, "dual_clip must be > 1 (DAPO/VC-PPO use 3)")
        if self.loss_agg is not None:
            from reasonrl.algos import AGG_MODES

            check(self.loss_agg in AGG_MODES, f"loss_agg must be one of {', '.join(AGG_MODES)}")
        world = int(os.environ.get("WORLD_SIZE", "1")) if self.backend == "deepspeed" else 1
        check(self.mini_batch_size % world == 0, f"mini_batch_size ({self.mini_batch_size}) must be divisible by the number of processes ({world})")
        check(self.micro_batch_size <= self.mini_batch_size // world, f"micro_batch_size must be <= mini_batch_size / processes ({self.mini_batch_size // world})")
        check(self.save_every >= 0 and self.log_every >= 1, "save_every must be >= 0 and log_every >= 1")
