"""Options shared by the stages that generate (rollout, pretrain-value, train, eval): the model
and engine, sampling, what the console shows and where metrics go; the engine + tokenizer + scorer
they open together; the training backend options shared by the stages that train (pretrain-value,
train). What those two stages build from them (the ranks, the backends, the collector and the
learner) is ``reasonrl.train.run``'s."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from reasonrl.config import HelpPanel, check, check_seed, opt
from reasonrl.engines.base import EngineOptions


REWARD_HELP = ("Reward: 'math' (DAPO's rule reward: +1 when the final answer equals the ground truth, else -1), or a plug-in FILE.py:FUNCTION or "
               "package.module:FUNCTION, called as FUNCTION(response, ground_truth, **info) -> float | bool in the scorer's worker processes (docs/rewards.md).")


@dataclass
class RewardOpts:
    reward: str = opt("math", REWARD_HELP)

    def _check_reward(self) -> None:
        from reasonrl.rewards.plugin import check_reward_spec

        check_reward_spec(self.reward)  # a missing file, module or function: one line, before any model loads

    def reward_record(self) -> dict[str, Any]:
        """The reward spec, its plug-in file and the file's sha256 (None for 'math'), for the manifest."""
        from reasonrl.rewards.plugin import reward_record

        return reward_record(self.reward)


@dataclass
class ModelOpts(EngineOptions, RewardOpts):
    help_panel: ClassVar[HelpPanel] = HelpPanel("Model, engine and reward", 1)

    model: str = opt("default", "Policy: an HF model directory, a finished train run, a hub name ORG/NAME[@REVISION] (from huggingface_hub's cache, downloaded unless HF_HUB_OFFLINE=1; the commit goes into the manifest), or 'default' for the embedded SmolLM2-135M-Instruct.")
    seed: int = opt(0, "Random seed (data order, sampling, initialisation), in [0, 2**32 - 1].")
    allow_pickle: bool = opt(False, "Load model directories (and fetch hub repositories) whose weights are pickle files (.bin/.pt), which can run code when loaded; default: safetensors only.")

    def _check_model(self) -> None:
        self._check_engine()
        check_seed(self.seed)
        self._check_reward()

    def policy_dir(self) -> Path:
        """The policy's HF directory (``model`` resolved), its weights checked (safetensors unless --allow-pickle)."""
        from reasonrl.models.loading import check_weights, resolve_policy

        return check_weights(resolve_policy(self.model, allow_pickle=self.allow_pickle), self.allow_pickle)


@dataclass
class DecodeOpts:
    """How each response is decoded (the engine's ``SamplingParams`` are made from these)."""

    help_panel: ClassVar[HelpPanel] = HelpPanel("Sampling", 2)  # (RolloutOpts' too)

    temperature: float = opt(1.0, "Sampling temperature (0 = greedy).")
    top_p: float = opt(1.0, "Nucleus sampling mass (1.0 = off).")
    top_k: int = opt(-1, "Top-k sampling (-1 = off).")
    max_prompt_len: int = opt(512, "Prompts longer than this many tokens are skipped and counted.")
    max_response_len: int = opt(256, "Generation cap L_max in tokens (DAPO: 20480).")

    def _check_decode(self) -> None:
        check(0 <= self.temperature < math.inf, "temperature must be finite and >= 0")
        check(self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        check(0 < self.top_p <= 1, "top_p must be in (0, 1]")
        check(self.max_response_len >= 1, "max_response_len must be >= 1")
        check(self.max_prompt_len >= 1, "max_prompt_len must be >= 1")


@dataclass
class RolloutOpts(DecodeOpts):
    """A rollout: G responses per prompt, each decoded as :class:`DecodeOpts` say."""

    group_size: int = opt(8, "Responses sampled per prompt (G).")

    def _check_rollout(self) -> None:
        self._check_decode()
        check(self.group_size >= 1, "group_size must be >= 1")


@dataclass
class ProgressOpts:
    quiet: bool = opt(False, "No live progress bars (they are off anyway when the output is not a terminal); the summary lines stay.")


@dataclass
class TrackOpts(ProgressOpts):
    help_panel: ClassVar[HelpPanel] = HelpPanel("Tracking and console", 8)

    report_to: list[str] = opt(["tensorboard"], "Experiment trackers that get the metrics besides metrics.jsonl: tensorboard (event files in the run directory), "
                               "wandb, mlflow, trackio (optional extras: pip install 'reasonrl\\[wandb]'), or none; repeat the option or separate with commas.")

    def _check_tracking(self) -> None:
        from reasonrl.tracking import tracker_names

        self.report_to = tracker_names(self.report_to) or ["none"]


@dataclass
class ValOpts:
    """Validation during training: the current policy on held-out problems (``reasonrl.train.validation``)."""

    help_panel: ClassVar[HelpPanel] = HelpPanel("Validation during training", 7)

    val_every: int = opt(0, "Validate every N steps, at step 0 (before any update) and at the last step (0 = off): val/avg@n, pass@k, maj@n with bootstrap intervals in metrics.jsonl.")
    val_data: str = opt("", "Validation problems: a prepare-data directory (its validation split), an eval set (aime24, math500, ...), a data file or a hub dataset hf:ORG/NAME[:CONFIG][@SPLIT]; default: the training data's validation split.")
    val_n: int = opt(4, "Samples per validation problem.")
    val_max_problems: int | None = opt(None, "Validate on the first N distinct problems only.")
    val_temperature: float = opt(1.0, "Validation sampling temperature (DAPO's evaluation: 1.0).")
    val_top_p: float = opt(0.7, "Validation nucleus mass (DAPO's evaluation: 0.7).")
    val_max_response_len: int | None = opt(None, "Validation generation cap in tokens; default: max_response_len.")
    val_template: str = opt("dapo", "Prompt template for raw validation problems (an eval set or a data file; a prepared directory has its own).")
    val_bootstrap: int = opt(1000, "Bootstrap resamples for the validation intervals.")
    save_best: str = opt("", "Keep the policy with the best value of this validation metric (e.g. val/avg@4) in out/best/, an HF directory; needs --val-every.")
    early_stop_patience: int = opt(0, "Stop after this many validations in a row without a better --save-best metric (0 = never).")

    def _check_val(self) -> None:
        from reasonrl.data.templates import ALL_TEMPLATES

        check(self.val_every >= 0, "val_every must be >= 0 (0 = off)")
        check(self.val_n >= 1, "val_n must be >= 1")
        check(self.val_max_problems is None or self.val_max_problems >= 1, "val_max_problems must be >= 1")
        check(0 <= self.val_temperature < math.inf, "val_temperature must be finite and >= 0")
        check(0 < self.val_top_p <= 1, "val_top_p must be in (0, 1]")
        check(self.val_max_response_len is None or self.val_max_response_len >= 1, "val_max_response_len must be >= 1")
        check(self.val_template in ALL_TEMPLATES, f"val_template must be one of {', '.join(ALL_TEMPLATES)}")
        check(self.val_bootstrap >= 1, "val_bootstrap must be >= 1")
        check(not self.save_best or self.val_every, f"--save-best {self.save_best} needs validation: pass --val-every N")
        check(not self.save_best or self.save_best.startswith("val/"), f"--save-best takes a validation metric (val/avg@{self.val_n}, val/pass@1, ...), got '{self.save_best}'")
        check(self.early_stop_patience >= 0, "early_stop_patience must be >= 0 (0 = never)")
        check(not self.early_stop_patience or self.save_best, "--early-stop-patience counts validations without a better --save-best metric: pass --save-best too")


@dataclass
class Generation:
    """An engine, its tokenizer and a reward scorer, opened together and closed together."""

    engine: Any
    tokenizer: Any
    scorer: Any
    model_dir: Path
    base_dir: Path | None = None  # a LoRA adapter's base model, when model_dir is a bare adapter directory

    def close(self) -> None:
        self.scorer.close()
        self.engine.close()


#: Rows a vLLM engine decodes at once unless --max-num-seqs says (vLLM's default), for the estimate
#: of a stage's decode steps that decides whether vLLM compiles on CPU.
ENGINE_ROWS_AT_ONCE = 256


def open_generation(cfg: Any, model_dir: Path | None = None, *, rows: int = 0) -> Generation:
    """The engine on ``model_dir`` (default: ``--model``), for ``rows`` (prompts × samples) to
    generate. ``--model`` may be a bare peft adapter directory (``adapter_config.json``, e.g. a LoRA
    run's ``policy/adapter/``): the engine loads the base model it names and then the merged
    weights, in memory."""
    from reasonrl.engines.registry import make_engine
    from reasonrl.models.loading import check_weights, load_tokenizer
    from reasonrl.models.lora import adapter_base, adapter_merged_weights, is_adapter_dir
    from reasonrl.rewards import RewardScorer

    adapter = Path(cfg.model) if model_dir is None and is_adapter_dir(cfg.model) else None
    md = check_weights(adapter_base(adapter), cfg.allow_pickle) if adapter is not None else (model_dir or cfg.policy_dir())
    merged = adapter_merged_weights(adapter, md, allow_pickle=cfg.allow_pickle) if adapter is not None else None
    if adapter is not None:
        check_adapter_finite(adapter, merged)
    tok = load_tokenizer(md)
    waves = math.ceil(rows / (cfg.max_num_seqs or ENGINE_ROWS_AT_ONCE))  # (each wave decodes up to L_max steps)
    engine = make_engine(cfg, str(md), seed=cfg.seed, max_model_len=cfg.max_prompt_len + cfg.max_response_len, decode_steps=waves * cfg.max_response_len)
    if merged is not None:
        try:
            engine.update_weights(merged)
        except BaseException:
            engine.close()
            raise
    return Generation(engine, tok, RewardScorer(reward=cfg.reward), adapter or md, base_dir=md if adapter is not None else None)


def check_adapter_finite(adapter: Path, merged: dict[str, Any]) -> None:
    """A NaN or inf in an adapter's weights (a run that diverged, a damaged file) is a one-line error
    naming the file and the tensor: the engine would sample from it without a word. The
    safetensors file's own tensors are checked (small); a pickled adapter's, through ``merged``."""
    import torch

    from reasonrl.errors import ReasonRLError
    from reasonrl.models.lora import ADAPTER_WEIGHTS

    def finite(t: Any) -> bool:
        return not t.is_floating_point() or bool(torch.isfinite(t).all())

    f = adapter / ADAPTER_WEIGHTS
    if f.is_file():
        from safetensors import safe_open

        with safe_open(str(f), framework="pt") as st:
            bad = next((k for k in st.keys() if not finite(st.get_tensor(k))), None)
        where = "in"
    else:
        f = next(iter(sorted(adapter.glob("adapter_model.*"))), adapter)
        bad = next((k for k, v in merged.items() if not finite(v)), None)
        where = "merged into"
    if bad is not None:
        raise ReasonRLError(f"{f}: the adapter's weights are not finite (NaN or inf {where} {bad}): it would generate garbage; "
                            "pass an adapter saved before its run diverged (an earlier checkpoint's policy/)")


BACKENDS = ("torch", "deepspeed")


@dataclass
class BackendOpts:
    """Where the trained model's update runs: one process (torch), or DeepSpeed ZeRO over the
    launcher's processes, each on its GPU when there is one (``prompts_per_step`` and
    ``mini_batch_size`` stay global; each rank generates and trains on its share)."""

    help_panel: ClassVar[HelpPanel] = HelpPanel("Training backend", 6)

    backend: str = opt("torch", "Training backend: 'torch' (one process) or 'deepspeed' (ZeRO; start with torchrun/deepspeed).")
    zero: int = opt(2, "DeepSpeed ZeRO stage (2 or 3).")
    offload: bool = opt(False, "DeepSpeed: offload optimizer state (and ZeRO-3 parameters) to CPU memory.")
    max_tokens_per_micro_batch: int = opt(0, "Cut micro-batches to this many tokens each, counted as --forward-mode runs them (shared: a micro-batch's distinct prompts at its longest prompt plus its rows at its longest response; plain: its rows padded; packed: its real tokens, each prompt once; auto: as the padded mode it falls back to) instead of --micro-batch-size rows: short responses go many to a forward, long ones few (verl's ppo_max_token_len_per_gpu); the gradient is the same. 0 = by rows.")
    forward_mode: str = opt("auto", "How the trainer runs a micro-batch through a model: 'shared' (each distinct prompt once into a KV cache, then the responses on it), 'packed' (one padding-free sequence, each prompt once, a shared-prefix attention mask), 'plain' (the padded rows), or 'auto' (the default: the cheaper of packed and shared by token counts, one mode per pass over a step's or a mini-batch's micro-batches, decided on every rank's counts so ZeRO-3 ranks agree). The same numbers in every mode, sliding-window models included; a model whose attention packed cannot reproduce (chunked attention, say) runs padded under auto and is refused by packed (docs/performance.md).")
    gradient_checkpointing: bool = opt(False, "Recompute each layer's activations in the backward pass (transformers' gradient checkpointing): a sequence then keeps one hidden state per layer instead of every intermediate, which long responses on big models need (see stages/*-qwen32b.toml); costs about one more forward.")

    def _check_backend(self, mini_batch_size: int, micro_batch_size: int) -> None:
        check(self.backend in BACKENDS, f"backend must be one of {BACKENDS}, got '{self.backend}'")
        check(self.zero in (0, 1, 2, 3), "zero must be 0, 1, 2 or 3")
        world = int(os.environ.get("WORLD_SIZE", "1")) if self.backend == "deepspeed" else 1
        check(mini_batch_size % world == 0, f"mini_batch_size ({mini_batch_size}) must be divisible by the number of processes ({world})")
        check(micro_batch_size <= mini_batch_size // world, f"micro_batch_size must be <= mini_batch_size / processes ({mini_batch_size // world})")
        check(self.forward_mode in ("shared", "packed", "plain", "auto"), f"forward_mode must be one of shared, packed, plain, auto, got '{self.forward_mode}'")
        check(self.max_tokens_per_micro_batch >= 0, f"max_tokens_per_micro_batch must be >= 0 (0 = micro-batches of --micro-batch-size rows), got {self.max_tokens_per_micro_batch}")


@dataclass
class OptimOpts:
    """The optimiser options the stages that train (pretrain-value, train) share, with one default:
    the batch sizes of an update and the critic's AdamW. Each stage checks them in its own
    ``__post_init__``; ``weight_decay`` (train 0.1, pretrain-value 0.0) and train's policy ``lr``
    and ``ppo_epochs`` stay with their stage."""

    help_panel: ClassVar[HelpPanel] = HelpPanel("Optimiser", 3)

    mini_batch_size: int = opt(64, "Responses per optimizer update over all processes: a step makes ceil(batch / mini_batch_size) updates per pass over its batch (train: × --ppo-epochs).")
    micro_batch_size: int = opt(16, "Responses per forward/backward pass in each process (gradient accumulation inside a mini-batch).")
    critic_lr: float = opt(1e-5, "Critic learning rate (AdamW).")
    grad_clip: float = opt(1.0, "Gradient-norm clipping (0 = off).")


@dataclass
class ScheduleOpts:
    """The learning-rate schedule of the stages that train (pretrain-value, train), for every model
    they train, over their ``steps`` (``reasonrl.train.backend.lr_factor``)."""

    help_panel: ClassVar[HelpPanel] = HelpPanel("Learning-rate schedule", 4)

    lr_schedule: str = opt("constant", "LR schedule after the warm-up: 'constant' (DAPO) or 'cosine', from the LR down to --min-lr-ratio × LR at --steps "
                                       "(OpenRLHF's default, cosine_with_min_lr).")
    min_lr_ratio: float = opt(0.1, "Cosine schedule: the LR it decays to, as a fraction of the LR, in [0, 1] (OpenRLHF: 0.1); 'constant' ignores it.")
    warmup_steps: int = opt(0, "Linear LR warm-up, in training steps (DAPO: 20): step k of the warm-up runs at k / N of the LR.")
    warmup_ratio: float = opt(0.0, "Linear LR warm-up as a fraction of --steps, rounded up, in [0, 1) (OpenRLHF's --lr_warmup_ratio: 0.03); instead of --warmup-steps.")

    def _check_schedule(self) -> None:
        from reasonrl.train.backend import LR_SCHEDULES

        check(self.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got '{self.lr_schedule}'")
        check(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1] (a fraction of the LR), got {self.min_lr_ratio}")
        check(self.warmup_steps >= 0, "warmup_steps must be >= 0")
        check(0.0 <= self.warmup_ratio < 1.0, f"warmup_ratio must be in [0, 1) (a fraction of --steps), got {self.warmup_ratio}")
        check(not (self.warmup_steps and self.warmup_ratio), f"--warmup-steps {self.warmup_steps} and --warmup-ratio {self.warmup_ratio} both set: "
                                                             "give the warm-up one way, in steps or as a fraction of --steps")

    def schedule(self, steps: int) -> dict[str, Any]:
        """The backends' schedule arguments for a run of ``steps`` steps (the warm-up in steps)."""
        warmup = math.ceil(self.warmup_ratio * steps) if self.warmup_ratio else self.warmup_steps
        return {"lr_schedule": self.lr_schedule, "warmup_steps": warmup, "total_steps": steps, "min_lr_ratio": self.min_lr_ratio}

    def check_resumed_schedule(self, out: Path, steps: int) -> None:
        """A --resume of the run in ``out`` with another ``steps`` than it started with, where the
        schedule spans the steps (cosine, a warm-up ratio): one line (the LR of every step would
        change, the steps already run included). An unreadable config.json is left to the run's
        settings check."""
        import json

        from reasonrl.errors import ReasonRLError

        try:
            old = json.loads((out / "config.json").read_text(encoding="utf-8")).get("steps")
        except (OSError, ValueError, AttributeError):
            return
        if isinstance(old, int) and old != steps and (self.lr_schedule != "constant" or self.warmup_ratio):
            what = f"--lr-schedule {self.lr_schedule}" if self.lr_schedule != "constant" else f"--warmup-ratio {self.warmup_ratio:g}"
            raise ReasonRLError(f"--resume with --steps {steps}, the run's is {old}: its {what} spans --steps, so the LR of every step would change; "
                                f"resume with --steps {old}, or start over with --overwrite")


@dataclass
class LoraOpts:
    """LoRA on the trained model (``reasonrl.models.lora``, through peft): rank R > 0 trains an adapter
    on the blocks' linear layers and keeps the base frozen; 0 is full fine-tuning."""

    help_panel: ClassVar[HelpPanel] = HelpPanel("LoRA", 5)

    lora_rank: int = opt(0, "LoRA rank R (0 = full fine-tuning): train a rank-R adapter W + (α/R)·B·A on the blocks' linear layers, the base frozen; "
                            "with about 10× the full fine-tuning LR (\"LoRA Without Regret\"; docs/lora.md).")
    lora_alpha: float | None = opt(None, "LoRA α: the adapter's update is scaled by α/R; default 32 for every rank (\"LoRA Without Regret\", TRL's guide; verl and OpenRLHF use 16).")
    lora_target_modules: list[str] = opt(["all-linear"], "LoRA targets: 'all-linear' (every linear layer of the blocks: attention and MLP projections, never the LM or value head) "
                                                        "or module names such as q_proj,v_proj (repeat the option or separate with commas).")

    def _check_lora(self) -> None:
        from reasonrl.models.lora import ALL_LINEAR

        self.lora_target_modules = [t.strip() for v in self.lora_target_modules for t in str(v).split(",") if t.strip()] or [ALL_LINEAR]
        others = [flag for flag, on in (("--lora-alpha", self.lora_alpha is not None), ("--lora-target-modules", self.lora_target_modules != [ALL_LINEAR])) if on]
        if self.lora_rank <= 0:
            check(self.lora_rank == 0, f"lora_rank must be >= 1 for LoRA, or 0 for full fine-tuning, got {self.lora_rank}")
            check(not others, f"{' and '.join(others)} set but --lora-rank is 0 (full fine-tuning): give --lora-rank R (e.g. 8) to train an adapter, or drop them")
        check(self.lora_alpha is None or 0 < self.lora_alpha < math.inf, f"lora_alpha must be finite and > 0, got {self.lora_alpha}")

    def lora_settings(self) -> Any:
        """The run's ``reasonrl.models.lora.LoraSettings``, or None for full fine-tuning."""
        from reasonrl.models.lora import DEFAULT_ALPHA, LoraSettings

        if not self.lora_rank:
            return None
        return LoraSettings(self.lora_rank, DEFAULT_ALPHA if self.lora_alpha is None else float(self.lora_alpha), tuple(self.lora_target_modules))

    def check_resumed_lora(self, out: Path) -> None:
        """A --resume of the run in ``out`` with other LoRA settings than it started with: one line
        (its checkpoints hold an adapter of that shape, or full weights). An unreadable config.json is
        left to the run's settings check."""
        import json

        from reasonrl.errors import ReasonRLError
        from reasonrl.models.lora import ALL_LINEAR

        try:
            old = json.loads((out / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if not isinstance(old, dict):
            return
        rank = old.get("lora_rank") or 0
        if rank != self.lora_rank:
            if not rank:
                raise ReasonRLError(f"--resume with --lora-rank {self.lora_rank}: the run in {out} is full fine-tuning (its checkpoints hold full weights); "
                                    "resume without --lora-rank, or start over with --overwrite")
            raise ReasonRLError(f"--resume {'without --lora-rank' if not self.lora_rank else f'with --lora-rank {self.lora_rank}'}: the run in {out} trains a "
                                f"rank-{rank} LoRA adapter (its checkpoints hold only that adapter); resume with --lora-rank {rank}, or start over with --overwrite")
        def shown(v: Any) -> str:
            return "(default)" if v is None else ",".join(map(str, v)) if isinstance(v, list) else f"{v:g}" if isinstance(v, float) else str(v)

        for key, flag, default in (("lora_alpha", "--lora-alpha", None), ("lora_target_modules", "--lora-target-modules", [ALL_LINEAR])):
            was = old.get(key, default)
            if rank and key in old and was != getattr(self, key):
                raise ReasonRLError(f"--resume with {flag} {shown(getattr(self, key))}: the run in {out} trains its adapter with {flag} {shown(was)}; "
                                    f"resume with the run's {flag}, or start over with --overwrite")
