"""The DeepSpeed ZeRO training backend (stage 2 or 3; 0 and 1 work too; optional CPU offload): same methods as TorchBackend.

Start it with a launcher, e.g. ``torchrun --nproc_per_node 2 -m reasonrl.cli train --backend deepspeed``
(or ``deepspeed --no_local_rank --module reasonrl.cli train ...``); one process without a launcher
also works (world size 1).

How a step maps onto the engine. The learner (``reasonrl.train.learner``) hands ``step`` micro-batches
whose losses are already weighted for their share of the *global* mini-batch (token or row counts
summed over ranks) and multiplied by the world size, because ZeRO averages gradients over ranks.
So the engine runs with ``gradient_accumulation_steps = 1`` and every ``engine.backward`` is
called with ``scale_wrt_gas=False`` (no division by the micro-batch count); the micro-batches of a
mini-batch are accumulated by marking only the last one as the gradient-accumulation boundary
(``engine.set_gradient_accumulation_boundary``), and ``engine.step()`` is called once per
mini-batch. The optimizer is a plain ``torch.optim.AdamW`` (DeepSpeed's CPU Adam needs compiled
ops) and the LR schedule (``reasonrl.train.backend.lr_factor``) is a ``LambdaLR`` on it that only
``scheduler_step()`` advances (once per training step, never per micro-step).

CPU notes. Without CUDA the DeepSpeed accelerator is set to CPU and the process group uses gloo.
DeepSpeed's CPU comm layer JIT-compiles a shared-memory all-reduce op (``deepspeed_shm_comm``,
minutes on a small machine) when the process group starts; ZeRO training never calls it (only
AutoTP inference's ``inference_all_reduce`` does), so it is skipped unless
``REASONRL_DS_SHM_COMM=1``. Any op DeepSpeed still JIT-builds is cached in
``$REASONRL_CACHE/torch_extensions`` (default ``~/.cache/reasonrl/torch_extensions``) unless
``TORCH_EXTENSIONS_DIR`` is set.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from reasonrl.errors import ReasonRLError
from reasonrl.devices import autocast_ctx
from reasonrl.train.backend import lr_lambda

_LAUNCH_HINT = "start with `torchrun --nproc_per_node N -m reasonrl.cli train --backend deepspeed ...` or run one process without launcher variables"
_STATE_TAG = "state"


def _cache_root() -> Path:
    return Path(os.environ.get("REASONRL_CACHE", Path.home() / ".cache" / "reasonrl"))


def _setup_env() -> None:
    """Environment DeepSpeed reads at import time: extension cache, accelerator, quiet logs."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(_cache_root() / "torch_extensions"))
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _import_deepspeed() -> Any:
    _setup_env()
    try:
        import deepspeed
    except ImportError as e:
        raise ReasonRLError(f"--backend deepspeed needs the deepspeed package ({e}): `pip install deepspeed` (CPU: DS_BUILD_OPS=0) or use --backend torch") from None
    from deepspeed.utils import logger as ds_logger

    if not os.environ.get("REASONRL_DS_VERBOSE"):
        ds_logger.setLevel(logging.WARNING)
    return deepspeed


def _skip_shm_comm_build(deepspeed: Any) -> None:
    """Mark DeepSpeed's CPU shared-memory comm op incompatible so the comm layer does not JIT-build it.

    ``deepspeed.comm.torch.build_shm_op`` consults ``deepspeed.ops.__compatible_ops__`` (probed once,
    then kept in the module, so edits persist). ZeRO uses plain torch.distributed collectives; the op
    only serves ``inference_all_reduce``.
    """
    if os.environ.get("REASONRL_DS_SHM_COMM") == "1":
        return
    try:
        compat = deepspeed.ops.__compatible_ops__
        compat["deepspeed_shm_comm"] = False
    except Exception:  # noqa: BLE001 - an older/newer layout: fall back to building (cached)
        pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env_int(name: str) -> int:
    v = os.environ.get(name, "")
    try:
        return int(v)
    except ValueError:
        raise ReasonRLError(f"environment variable {name}={v!r} is not an integer: {_LAUNCH_HINT}") from None


def init_distributed() -> tuple[int, int]:
    """Join (or create) the process group; returns ``(rank, world_size)``.

    Reads the launcher's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT. Without them, a
    single process (world size 1) on 127.0.0.1 and a free port. gloo on CPU, nccl on CUDA.
    """
    deepspeed = _import_deepspeed()
    import torch.distributed as dist

    _skip_shm_comm_build(deepspeed)
    if dist.is_available() and dist.is_initialized():
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False, verbose=False)
        return dist.get_rank(), dist.get_world_size()
    launcher = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in os.environ]
    if not launcher:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(_free_port())
    else:
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise ReasonRLError(f"incomplete launcher environment (missing {', '.join(missing)}): {_LAUNCH_HINT}")
        os.environ.setdefault("LOCAL_RANK", os.environ["RANK"] if os.environ["WORLD_SIZE"] == "1" else "")
        if os.environ["LOCAL_RANK"] == "":
            raise ReasonRLError(f"LOCAL_RANK is not set: {_LAUNCH_HINT}")
    rank, world, local_rank = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    if world < 1 or not 0 <= rank < world:
        raise ReasonRLError(f"RANK={rank} is outside WORLD_SIZE={world}: {_LAUNCH_HINT}")
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        if local_rank >= n:
            raise ReasonRLError(f"LOCAL_RANK={local_rank} but only {n} GPU(s) are visible: start at most {n} processes per node (--nproc_per_node {n})")
        torch.cuda.set_device(local_rank)
        backend = "nccl"
    else:
        backend = "gloo"
    try:
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
    except (RuntimeError, ValueError) as e:  # e.g. the rendezvous port is taken, peers never arrive
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise ReasonRLError(f"cannot start the {backend} process group at {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} ({first}): set MASTER_PORT to a free port or check the launcher") from None
    atexit.register(leave_group)
    return dist.get_rank(), dist.get_world_size()


def leave_group() -> None:
    """Destroy a gloo process group (at exit, registered by :func:`init_distributed` for the group it
    started): while the interpreter is still whole. A process that exits with the group alive
    leaves it to the interpreter's teardown, where gloo's worker threads can still hold tensors and
    abort the process (SIGABRT, "terminate called without an active exception"; pytorch#190489):
    measured here, 8 of 12 torchrun launches of 4 gloo ranks that exit after a few collectives, none
    of 12 with the group destroyed first. A rank that aborts so fails the whole launch. gloo's
    destroy is the rank's own; NCCL's is collective (every rank must call it or it hangs, as a rank
    leaving on an error while its peers wait would), so an NCCL group is left to NCCL's teardown."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - at exit, a group already torn down by a peer's failure
            pass


def ds_config(*, zero: int, offload: bool, dtype: str, grad_clip: float, micro_batch_size: int, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config, built in code (no JSON file)."""
    if zero not in (0, 1, 2, 3):
        raise ReasonRLError(f"--zero {zero} is not a ZeRO stage: use --zero 2 or --zero 3")
    if offload and zero == 0:
        raise ReasonRLError("--offload needs ZeRO: use --zero 2 or --zero 3 (or drop --offload)")
    zo: dict[str, Any] = {"stage": zero, "overlap_comm": False, "contiguous_gradients": True}
    if offload:
        zo["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
        if zero == 3:
            zo["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    persist = os.environ.get("REASONRL_DS_Z3_PERSISTENCE_THRESHOLD")
    if zero == 3 and persist:
        # ZeRO-3 keeps parameters under this many elements whole on every rank (DeepSpeed default
        # 1e5); the tests set 0 so that even the tiny model is really partitioned.
        zo["stage3_param_persistence_threshold"] = int(persist)
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_batch_size * world_size,
        "gradient_clipping": float(grad_clip) if grad_clip > 0 else 0.0,
        "bf16": {"enabled": dtype == "bf16"},
        # fp16: DeepSpeed's dynamic loss scaling (loss_scale 0), from 2^16, halved on an overflow
        # (the step skipped), doubled after 1000 clean steps; fp32 master weights in the optimizer.
        "fp16": {"enabled": dtype == "fp16", "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                 "hysteresis": 2, "min_loss_scale": 1},
        "zero_optimization": zo,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,  # offload with our torch AdamW (DeepSpeedCPUAdam needs compiled ops)
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


class DeepSpeedBackend:
    """ZeRO-2/3 data parallel: AdamW, grad-norm clipping, the LR schedule of ``lr_factor``, bf16 or
    fp16 mixed precision (fp16 with DeepSpeed's dynamic loss scaling)."""

    def __init__(self, model: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999), grad_clip: float,
                 warmup_steps: int, dtype: str, zero: int = 2, offload: bool = False, micro_batch_size: int = 1,
                 lr_schedule: str = "constant", total_steps: int = 0, min_lr_ratio: float = 0.0) -> None:
        deepspeed = _import_deepspeed()
        import torch.distributed as dist

        if not dist.is_initialized():
            init_distributed()
        self._ds = deepspeed
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.zero, self.dtype, self.grad_clip = zero, dtype, grad_clip
        self.config = ds_config(zero=zero, offload=offload, dtype=dtype, grad_clip=grad_clip, micro_batch_size=micro_batch_size, world_size=self.world_size)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
        # On the torch optimizer: ZeRO keeps its param_groups (the same dicts), so the LR the
        # scheduler writes is the LR the engine's step uses. Not handed to the engine, which would
        # step it on every optimizer step.
        schedule = lr_lambda(lr_schedule, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=self.optimizer, config=self.config, dist_init_required=False)
        self.model = self.engine.module
        self.device = torch.device(self.engine.device)
        from reasonrl.models.lora import is_lora

        self._lora = is_lora(self.model)

    # ---------------------------------------------------------------- training
    def step(self, micro_batches: Sequence[Any], loss_fn: Callable[..., tuple[torch.Tensor, dict[str, float]]]) -> dict[str, float]:
        """Accumulate every micro-batch's (already weighted) loss, then one optimizer step.

        Every rank must call this with the same number of micro-batches (ZeRO reduces gradients
        inside backward). Metrics are summed over micro-batches and over ranks (the learner's loss
        functions scale them by 1/world_size), so every rank returns the global values.
        """
        n = len(micro_batches)
        metrics: dict[str, float] = {}
        lr = float(self.optimizer.param_groups[0]["lr"])
        for i, mb in enumerate(micro_batches):
            self.engine.set_gradient_accumulation_boundary(i == n - 1)
            with autocast_ctx(self.dtype):
                loss, m = loss_fn(self.engine, mb)
            self.engine.backward(loss, scale_wrt_gas=False)
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + float(v)
        pre_norm = self._local_grad_norm() if self.zero == 0 else None
        scale = self._loss_scale() if self.dtype == "fp16" else None  # (the scale this step's backward used)
        self.engine.step()  # non-finite global grad norm: ZeRO skips the update (as TorchBackend does)
        if scale is not None:  # (None: an optimizer that keeps no scale)
            metrics["loss_scale"] = float(scale) / self.world_size  # (summed over ranks below, like every metric)
            metrics["overflow"] = (0.0 if self.engine.was_step_applied() else 1.0) / self.world_size
        gn = self.engine.get_global_grad_norm()
        if gn is None:  # stage 0 with fp32 does not record it; its gradients are already all-reduced
            gn = pre_norm
        if self.world_size > 1 and metrics:
            metrics = self._sum_metrics(metrics)
        metrics["grad_norm"] = float(gn) if gn is not None else float("nan")
        metrics["lr"] = lr
        return metrics

    def _loss_scale(self) -> float | None:
        """fp16's current loss scale: ZeRO's optimizers hold it as ``cur_scale``, stage 0's fp16
        optimizer in its ``loss_scale_config``."""
        opt = self.engine.optimizer
        scale = getattr(opt, "cur_scale", None)
        return scale if scale is not None else getattr(getattr(opt, "loss_scale_config", None), "cur_scale", None)

    def _local_grad_norm(self) -> float | None:
        grads = [p.grad.detach().float() for p in self.model.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else None

    def _sum_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, metrics)
        keys = sorted({k for g in gathered for k in g})
        return {k: sum(float(g.get(k, 0.0)) for g in gathered) for k in keys}

    def scheduler_step(self) -> None:
        """Once per training step (rollout), as verl counts warm-up steps."""
        self.scheduler.step()

    # ---------------------------------------------------------------- weights
    @contextmanager
    def _gathered(self, params: list[torch.nn.Parameter]) -> Iterator[None]:
        if self.zero == 3 and params:
            with self._ds.zero.GatheredParameters(params, modifier_rank=None):
                yield
        else:
            yield

    def full_state_dict(self, *, master: bool = False) -> dict[str, torch.Tensor]:
        """The full weights on every rank (ZeRO-3: gathered one module at a time), on CPU.

        Keys are the HF model's ``state_dict`` keys (tied weights share one tensor). ``master``:
        the fp32 master weights instead of the half-precision working copy (when bf16 or fp16 is on). Every rank
        must call it (the gathers are collectives).
        """
        from deepspeed.utils import safe_get_full_fp32_param

        use_master = master and self.dtype in ("bf16", "fp16")
        full: dict[int, torch.Tensor] = {}
        for module in self.model.modules():
            own = [p for p in module.parameters(recurse=False) if id(p) not in full]
            if not own:
                continue
            with self._gathered(own):
                for p in own:
                    hp = safe_get_full_fp32_param(p) if use_master else None  # None: frozen, or no fp32 copy
                    full[id(p)] = (hp.float() if hp is not None else p.detach()).to("cpu", copy=True)
        out: dict[str, torch.Tensor] = {}
        for k, v in self.model.state_dict(keep_vars=True).items():
            out[k] = full[id(v)] if id(v) in full else v.detach().to("cpu", copy=True)
        return out

    def save_model(self, out_dir: Path, tokenizer: Any = None) -> None:
        """A normal HF directory (safetensors), written by rank 0 from the consolidated weights.

        All ranks must call it. With bf16 the fp32 master weights are written.
        """
        from reasonrl.models.lora import is_lora, save_adapter

        sd = self.full_state_dict(master=True)
        if self.rank == 0:
            out_dir = Path(out_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            if is_lora(self.model):  # (a checkpoint's policy: the adapter alone)
                save_adapter(self.model, sd, out_dir, tokenizer)
            else:
                self.model.save_pretrained(out_dir, state_dict=sd, safe_serialization=True)
                if tokenizer is not None:
                    tokenizer.save_pretrained(out_dir)
        self._barrier()

    # ---------------------------------------------------------------- checkpoints
    def save_state(self, out_dir: Path) -> None:
        """Engine checkpoint (weights + each rank's optimizer shard) and the LR scheduler. All ranks."""
        out_dir = Path(out_dir)
        if self.rank == 0:
            out_dir.mkdir(parents=True, exist_ok=True)
        self._barrier()
        self.engine.save_checkpoint(str(out_dir), tag=_STATE_TAG, client_state={"scheduler": self.scheduler.state_dict(), "world_size": self.world_size},
                                    exclude_frozen_parameters=self._lora)  # LoRA: the adapter's shards, not the frozen base
        self._barrier()

    def load_state(self, out_dir: Path) -> None:
        out_dir = Path(out_dir)
        if not (out_dir / _STATE_TAG).is_dir():
            raise ReasonRLError(f"{out_dir} holds no DeepSpeed state (was the run trained with --backend torch?): resume with the run's own --backend")
        saved_world = len(list((out_dir / _STATE_TAG).glob("*optim_states.pt")))
        if saved_world and saved_world != self.world_size:
            raise ReasonRLError(f"{out_dir} was saved by {saved_world} processes, this run has {self.world_size}: resume with --nproc_per_node {saved_world}")
        path, client = self.engine.load_checkpoint(str(out_dir), tag=_STATE_TAG, load_optimizer_states=True, load_lr_scheduler_states=False,
                                                   load_module_strict=not self._lora)
        if path is None:
            raise ReasonRLError(f"cannot load the DeepSpeed checkpoint in {out_dir}: resume from another checkpoint or start without --resume")
        if client and "scheduler" in client:
            self.scheduler.load_state_dict(client["scheduler"])

    def _barrier(self) -> None:
        import torch.distributed as dist

        if self.world_size > 1:
            dist.barrier()
