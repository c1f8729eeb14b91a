"""Training backends: one step on a batch.

``backend.step(micro_batches, loss_fn)`` runs forward/backward on each micro-batch (``loss_fn``
returns a loss already weighted for its share of the mini-batch, plus metrics), clips the gradient
norm, and takes one optimizer step; ``scheduler_step()`` advances the LR once per training step. The single-process torch backend lives here; the
DeepSpeed ZeRO backend (``reasonrl.train.ds_backend``) implements the same methods.
What the trainer uses of a backend (it holds them as ``Any``): ``model``, ``rank``, ``world_size``,
``step``, ``scheduler_step``, ``full_state_dict``, ``save_model``, ``save_state`` and ``load_state``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from reasonrl.devices import autocast_ctx, grad_scaler


LR_SCHEDULES = ("constant", "cosine")
"""The learning-rate schedules a training stage takes (``--lr-schedule``)."""


def lr_factor(step: int, *, schedule: str = "constant", warmup_steps: int = 0, total_steps: int = 0, min_lr_ratio: float = 0.0) -> float:
    """The LR multiplier after ``step`` scheduler steps (the LR of training step ``step + 1`` is
    ``lr * lr_factor(step)``): a pure function of the step, so a resumed run rebuilds it from its
    settings and gets the same numbers.

    Warm-up (every schedule), W = ``warmup_steps`` > 0: ``(step + 1) / W`` for step < W (training
    step k of the warm-up runs at k/W of the LR, none at 0). Then:

    * ``constant``: 1 (DAPO's schedule).
    * ``cosine``, T = ``total_steps``, m = ``min_lr_ratio``: with p = min(1, (step - W) / max(1, T - W)),

          m + (1 - m) * (1 + cos(pi * p)) / 2

      from 1 at the first step after the warm-up down towards m, reached at step T, which no update
      runs at: the run's last update (step T - 1) runs at m + (1 - m) * (1 - cos(pi / (T - W))) / 2,
      0.134 for T = 8, W = 0, m = 0.1 (0.145 with W = 1). The formula is OpenRLHF's default
      ``cosine_with_min_lr`` (transformers' ``get_cosine_with_min_lr_schedule_with_warmup``,
      ``min_lr = 0.1 * lr``) after its warm-up (step / W, which starts its run at LR 0), but OpenRLHF
      steps it once per optimiser step, over all of them, and ``step`` here counts training steps
      (``scheduler_step``, once per training step, whatever its mini-batches and epochs): with few
      steps the last LR stays well above m.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr schedule must be one of {', '.join(LR_SCHEDULES)}, got '{schedule}'")


def lr_lambda(schedule: str = "constant", *, warmup_steps: int = 0, total_steps: int = 0, min_lr_ratio: float = 0.0) -> Callable[[int], float]:
    """:func:`lr_factor` as a ``LambdaLR`` lambda. A plain function, so ``LambdaLR.state_dict``
    saves none of it: only the step count is checkpointed and the schedule is rebuilt from the run's
    settings. An unknown ``schedule`` is a ValueError here, not at the first step past the warm-up."""
    lr_factor(warmup_steps, schedule=schedule, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio)
    return lambda s: lr_factor(s, schedule=schedule, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio)


def save_policy(backend: Any, out_dir: Path, tokenizer: Any = None) -> None:
    """The trained model as a deliverable HF directory (``policy/``, ``best/``, a critic): what the
    backend's ``save_model`` writes for full fine-tuning; for LoRA the merged weights, with the peft
    adapter in ``out_dir/adapter/`` (``reasonrl.models.lora.save_merged``). Every rank calls it
    (ZeRO-3 gathers the shards); rank 0 writes."""
    from reasonrl.models.lora import is_lora, save_merged

    if not is_lora(backend.model):
        backend.save_model(out_dir, tokenizer)
        return
    sd = backend.full_state_dict(master=True)
    if backend.rank == 0:
        save_merged(backend.model, sd, Path(out_dir), tokenizer)
    if backend.world_size > 1:
        torch.distributed.barrier()


class TorchBackend:
    """Single process: AdamW, grad-norm clipping, the LR schedule of :func:`lr_factor`, bf16 or fp16
    autocast (fp16 with dynamic loss scaling: :func:`reasonrl.devices.grad_scaler`)."""

    rank = 0
    world_size = 1

    def __init__(self, model: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999), grad_clip: float, warmup_steps: int, dtype: str,
                 lr_schedule: str = "constant", total_steps: int = 0, min_lr_ratio: float = 0.0) -> None:
        self.model = model
        self.model.train()
        self.grad_clip = grad_clip
        self.dtype = dtype
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
        schedule = lr_lambda(lr_schedule, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.scaler = grad_scaler(dtype)  # fp16 only

    def step(self, micro_batches: Sequence[Any], loss_fn: Callable[..., tuple[torch.Tensor, dict[str, float]]]) -> dict[str, float]:
        """One optimizer step over ``micro_batches``. A non-finite gradient norm skips the update;
        with fp16 the scaler's scale is halved then (``overflow``: 1 for a skipped step, and
        ``loss_scale``, the scale the step's backward used)."""
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        scaler = self.scaler
        for mb in micro_batches:
            with autocast_ctx(self.dtype):
                loss, m = loss_fn(self.model, mb)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v
        params = [p for p in self.model.parameters() if p.grad is not None]
        if scaler is not None and params:
            scaler.unscale_(self.optimizer)  # the norm and its clip are of the true gradients
        gn = torch.nn.utils.clip_grad_norm_(params, self.grad_clip if self.grad_clip > 0 else float("inf")) if params else torch.tensor(0.0)
        lr = self.optimizer.param_groups[0]["lr"]
        finite = math.isfinite(float(gn))
        if scaler is not None and params:
            metrics["loss_scale"] = float(scaler.get_scale())
            metrics["overflow"] = 0.0 if finite else 1.0
            scaler.step(self.optimizer)  # skips the update when the gradients hold inf/NaN
            scaler.update()
        elif finite:
            self.optimizer.step()
        metrics["grad_norm"] = float(gn)
        metrics["lr"] = lr
        return metrics

    def scheduler_step(self) -> None:
        """Once per training step (rollout), as verl counts warm-up steps."""
        with warnings.catch_warnings():  # a step whose batch was empty made no optimizer step
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()

    def full_state_dict(self, *, master: bool = False) -> dict[str, torch.Tensor]:
        """The model's state dict (``master``: the same, one process keeps its weights in full precision)."""
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def save_model(self, out_dir: Path, tokenizer: Any = None) -> None:
        """The model as saved in a checkpoint: an HF directory, or for LoRA the peft adapter alone."""
        from reasonrl.models.lora import is_lora, save_adapter

        if is_lora(self.model):
            save_adapter(self.model, None, Path(out_dir), tokenizer)
            return
        self.model.save_pretrained(out_dir, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(out_dir)

    def save_state(self, out_dir: Path) -> None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()  # the loss scale and its growth tracker: exact resume
        torch.save(state, Path(out_dir) / "optim.pt")

    def load_state(self, out_dir: Path) -> None:
        st = torch.load(Path(out_dir) / "optim.pt", weights_only=True)
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        if self.scaler is not None and st.get("scaler"):
            self.scaler.load_state_dict(st["scaler"])
