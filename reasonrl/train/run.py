"""A training run put together: the factories that make its parts from a stage's options, and
:class:`Run`, what ``reasonrl train``'s loop works with.

What the stages that train share (``train``, ``pretrain-value``): the ranks (:func:`start_ranks`),
the training data (:func:`training_rows`, :func:`validation_rows`), a backend per trained model
(:func:`make_backend`), the collector and the learner (:func:`make_collector`, :func:`make_learner`).

What ``train`` builds on them (:func:`build_run`): the policy (:class:`Policy`, one handle for full
fine-tuning and LoRA), its reference model and the critic, their backends, the engine, collector
and learner, validation (:class:`Validation`), the step's perf model, the bar and the run log; and
the run's stateful parts (:meth:`Run.parts`), which ``reasonrl.train.checkpoint`` saves and loads
as one table. The stage (``reasonrl.stages.train``) checks its inputs, claims the run directory,
runs the loop and writes the final outputs.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from reasonrl.train.checkpoint import JsonState, ModelState, Parts, Resumed, RngState, load_checkpoint, save_checkpoint

# ---------------------------------------------------------------- what the training stages set up alike


def start_ranks(cfg: Any) -> tuple[int, int]:
    """(rank, world size): the launcher's process group for DeepSpeed (joined here, each rank on its
    GPU), else (0, 1)."""
    if cfg.backend != "deepspeed":
        return 0, 1
    from reasonrl.train.ds_backend import init_distributed

    return init_distributed()


#: A launcher's variables (torchrun's), unset in a rank's engine process: that process is a job of
#: one, not a rank of the trainer's (vLLM would take the variables for its own launcher's).
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
                 "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                 "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE")


def engine_env(engine_gpus: str, *, world: int, local_rank: int = 0, local_world: int = 1, device: int | None = None,
               visible: str | None = None) -> dict[str, str | None] | None:
    """What a rank's engine process (``--async-steps``) changes of the trainer's environment (a value
    None: unset; None: nothing).

    One process: ``--engine-gpus`` as its CUDA_VISIBLE_DEVICES, else nothing (the trainer's GPUs,
    shared). Several ranks (torchrun): every rank has an engine process of its own, a job of one
    (:data:`LAUNCHER_VARS` unset), on a GPU of its own rank's: ``--engine-gpus`` lists one per process
    of the node (``local_world``), local rank i's engine gets the i-th; by default the rank's own
    (``device``, the trainer's current CUDA device among ``visible``, the trainer's
    CUDA_VISIBLE_DEVICES), shared with its trainer, as the synchronous loop's engine is; on CPU
    (``device`` None) no GPU is set."""
    if world == 1:
        return {"CUDA_VISIBLE_DEVICES": engine_gpus} if engine_gpus else None
    env: dict[str, str | None] = dict.fromkeys(LAUNCHER_VARS)
    if engine_gpus:
        from reasonrl.errors import ReasonRLError

        gpus = [g.strip() for g in engine_gpus.split(",")]
        if len(gpus) != local_world or not all(gpus):
            raise ReasonRLError(f"--engine-gpus {engine_gpus} under torchrun lists {len(gpus)} GPUs for the {local_world} processes of a node: list one "
                                f"per process (local rank i's engine runs on the i-th), e.g. --engine-gpus {','.join(str(local_world + i) for i in range(local_world))}")
        env["CUDA_VISIBLE_DEVICES"] = gpus[local_rank]
    elif device is not None:
        ids = [g.strip() for g in visible.split(",")] if visible else []
        env["CUDA_VISIBLE_DEVICES"] = ids[device] if device < len(ids) else str(device)
    return env


def engine_cpus(cpus: list[int] | None, *, world: int, local_rank: int = 0, local_world: int = 1) -> list[int] | None:
    """The cores a rank's engine process (``--async-steps``) is pinned to, of ``cpus`` (``--engine-cpus``;
    None: not pinned). One process: all of them. Several ranks (torchrun): ``cpus`` shared out in equal
    runs among the ``local_world`` processes of a node, in the order given; local rank i's engine gets
    the i-th (``--engine-cpus 2-5`` with ``--nproc_per_node 2``: rank 0's engine on 2-3, rank 1's on
    4-5), so no two engines of a node spin on the same cores."""
    if cpus is None or world == 1:
        return cpus
    if len(cpus) % local_world or len(set(cpus)) != len(cpus):
        from reasonrl.errors import ReasonRLError

        share = max(1, len(cpus) // local_world)
        raise ReasonRLError(f"--engine-cpus under torchrun lists {len(cpus)} cores for the {local_world} processes of a node: list a multiple of "
                            f"{local_world}, each core once (local rank i's engine runs on the i-th equal part), e.g. --engine-cpus "
                            f"{cpus[0]}-{cpus[0] + share * local_world - 1}")
    share = len(cpus) // local_world
    return cpus[local_rank * share:(local_rank + 1) * share]


def _local(rank: int, world: int) -> tuple[int, int]:
    """This process's LOCAL_RANK and LOCAL_WORLD_SIZE (the launcher's; else its rank and the world)."""
    import os

    return int(os.environ.get("LOCAL_RANK", rank)), int(os.environ.get("LOCAL_WORLD_SIZE", world))


def rank_engine_cpus(cfg: Any, rank: int, world: int) -> list[int] | None:
    """:func:`engine_cpus` for this process (rank ``rank`` of ``world``)."""
    local_rank, local_world = _local(rank, world)
    return engine_cpus(cfg.engine_cpu_list(), world=world, local_rank=local_rank, local_world=local_world)


def rank_engine_env(cfg: Any, rank: int, world: int) -> dict[str, str | None] | None:
    """:func:`engine_env` for this process (rank ``rank`` of ``world``; the launcher's LOCAL_RANK and
    LOCAL_WORLD_SIZE, the current CUDA device)."""
    import os

    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    local_rank, local_world = _local(rank, world)
    return engine_env(cfg.engine_gpus, world=world, local_rank=local_rank, local_world=local_world, device=device, visible=os.environ.get("CUDA_VISIBLE_DEVICES"))


def make_backend(cfg: Any, model: Any, lr: float, dtype: str, steps: int | None = None) -> Any:
    """The backend ``cfg.backend`` names for ``model`` (``cfg``: BackendOpts and ScheduleOpts plus the
    optimiser's ``weight_decay``, ``grad_clip``, and ``steps`` and ``micro_batch_size``); the LR
    schedule spans ``steps`` (default ``cfg.steps``; `pretrain-value --epochs` counts its own)."""
    common = dict(lr=lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, dtype=dtype, **cfg.schedule(cfg.steps if steps is None else steps))
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.backend == "deepspeed":
        from reasonrl.train.ds_backend import DeepSpeedBackend

        return DeepSpeedBackend(model, **common, zero=cfg.zero, offload=cfg.offload, micro_batch_size=cfg.micro_batch_size)
    from reasonrl.train.backend import TorchBackend

    return TorchBackend(model, **common)


def training_rows(data: str) -> list[dict[str, Any]]:
    """The prepared data's training rows (``--data``); none is an error naming the fix."""
    from reasonrl.data import load_prepared
    from reasonrl.errors import ReasonRLError
    from reasonrl.models.hub import is_hub_data

    if is_hub_data(data) and not Path(data).exists():
        # A hub dataset already in verl's RL format (a prepare-data output, DAPO-Math-17k's parquet)
        # is read as it is; any other needs prepare-data first.
        from reasonrl.data.readers import hub_data_file

        try:
            rows = load_prepared(hub_data_file(data), "train")
        except ReasonRLError as e:
            if "verl" not in str(e):
                raise
            raise ReasonRLError(f"--data {data} is not in verl's RL format (prompt, reward_model, ...): run `reasonrl prepare-data {data} --out DIR` "
                                "first (it makes the answers integers, templates and splits), then pass --data DIR") from None
    else:
        rows = load_prepared(data, "train")
    if not rows:
        raise ReasonRLError(f"{data} has no training rows: run `reasonrl prepare-data` on a larger dataset")
    return rows


def validation_rows(cfg: Any) -> list[dict[str, Any]]:
    """The distinct validation problems of a run with ``--val-every``: ``--val-data`` (a prepared
    directory's validation split, an eval set or a data file), else the training data's validation
    split; the first ``--val-max-problems``."""
    from reasonrl.errors import ReasonRLError
    from reasonrl.evaluation.datasets import load_problems
    from reasonrl.evaluation.problems import merge_replicas

    from reasonrl.models.hub import is_hub_data

    src = cfg.val_data or cfg.data
    if not cfg.val_data and is_hub_data(cfg.data) and not Path(cfg.data).exists():
        raise ReasonRLError(f"--val-every: --data {cfg.data} is one split of a hub dataset, with no held-out problems beside it: pass --val-data "
                            "(its validation split as hf:ORG/NAME@validation, or an eval set such as math500), or --val-every 0")
    rows = load_problems(src, cfg.val_template)
    problems = merge_replicas(rows, [r["extra_info"]["where"] for r in rows]).rows if rows else []
    if not problems:
        raise ReasonRLError(f"--val-every: {src} has no validation problems: pass --val-data (an eval set such as math500, or a data file), "
                            "or prepare the data with a validation split (prepare-data --val-size N)")
    return problems[: cfg.val_max_problems] if cfg.val_max_problems else problems


def make_collector(cfg: Any, *, spec: Any, engine: Any, tokenizer: Any, scorer: Any, stream: Any, ranks: Any, **dynamic: Any) -> Any:
    """The collector of a training stage: G responses per prompt of ``cfg``'s sampling options (up
    to ``max_response_len`` tokens), seeded by ``cfg.seed``; ``dynamic``: the reward shaping and
    dynamic sampling's options (``overlong_cache_len``, ``oversample``, ``max_rounds``), partial
    rollouts' ``partial_len`` and --async-steps' ``ahead``."""
    from reasonrl.engines.base import SamplingParams
    from reasonrl.train.collector import Collector

    sampling = SamplingParams(n=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_tokens=cfg.max_response_len)
    return Collector(spec=spec, engine=engine, tokenizer=tokenizer, scorer=scorer, stream=stream, sampling=sampling,
                     max_prompt_len=cfg.max_prompt_len, seed=cfg.seed, ranks=ranks, **dynamic)


def make_learner(cfg: Any, *, spec: Any, tokenizer: Any, dtype: str, ranks: Any, policy: Any = None, policy_backend: Any = None,
                 critic_backend: Any = None, ref_model: Any = None, ppo_epochs: int = 1) -> Any:
    """The learner of a training stage: its log-probabilities of the distribution the engine
    samples (``cfg``'s temperature, top-k, top-p), L_max = ``max_response_len``, the micro-batch
    size per process and the mini-batch size over all processes (``mini_batch_size`` / world)."""
    from reasonrl.algos import Sampling
    from reasonrl.train.batch import check_forward_mode
    from reasonrl.train.learner import Learner

    check_forward_mode(cfg.forward_mode, policy, critic_backend.model if critic_backend is not None else None, ref_model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Learner(spec=spec, policy=policy, policy_backend=policy_backend, critic_backend=critic_backend, ref_model=ref_model,
                   sampling=Sampling(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k), pad_id=pad_id, max_len=cfg.max_response_len,
                   micro_batch_size=cfg.micro_batch_size, mini_batch_size=max(1, cfg.mini_batch_size // ranks.world), ppo_epochs=ppo_epochs,
                   dtype=dtype, seed=cfg.seed, ranks=ranks, max_tokens_per_micro_batch=cfg.max_tokens_per_micro_batch,
                   forward_mode=cfg.forward_mode)


# ---------------------------------------------------------------- the policy


@dataclass
class Policy:
    """The trained policy, full fine-tuning or a LoRA adapter on a frozen base (``lora``, a
    ``reasonrl.models.lora.LoraSettings``), behind one handle: how it loads, its reference model,
    what the engine gets, the final ``policy/``. A checkpoint's ``policy/`` holds the full weights,
    or the adapter alone."""

    base_dir: Path  # --model, resolved
    lora: Any = None  # None: full fine-tuning

    def check(self) -> None:
        """LoRA: every target is a linear layer of the architecture (read on the meta device), refused before anything is written."""
        if self.lora is not None:
            from reasonrl.models.lora import check_targets

            check_targets(self.base_dir, self.lora)

    def load(self, ckpt: Path | None, *, device: Any, dtype: str, seed: int) -> Any:
        """The model to train, from --model or checkpoint ``ckpt``'s ``policy/``. LoRA: the frozen base
        from --model (in bf16 when the run computes in it: half the memory), the adapter fresh (seeded)
        or the checkpoint's."""
        from reasonrl.models import lora as L
        from reasonrl.models.loading import load_causal_lm

        if self.lora is None:
            model = load_causal_lm(ckpt / "policy" if ckpt else self.base_dir, device=device)
        else:
            base = load_causal_lm(self.base_dir, device=device, dtype=torch.bfloat16 if dtype == "bf16" else None)
            model = L.apply_lora(base, self.lora, seed=seed, base_path=self.base_dir)
            if ckpt:
                L.load_adapter_weights(model, ckpt / "policy")
        model.config.use_cache = False
        return model

    def reference(self, model: Any, device: Any) -> Any:
        """The KL penalty's reference policy: --model's weights (LoRA: ``model`` with its adapter off, no second copy)."""
        from reasonrl.models import lora as L
        from reasonrl.models.loading import load_causal_lm

        return load_causal_lm(self.base_dir, device=device).eval() if self.lora is None else L.reference_model(model)

    def sync(self, engine: Any, backend: Any) -> None:
        """The engine := the trained weights (LoRA: the merged linear layers)."""
        from reasonrl.models.lora import engine_weights

        engine.update_weights(engine_weights(backend.model, backend.full_state_dict()))

    def trainable(self, model: Any) -> str:
        """The start line's note of what trains (LoRA: the adapter's parameters), or ''."""
        from reasonrl.models.lora import trainable_line

        return f" | {trainable_line(model)}" if self.lora is not None else ""

    def write_final(self, ckpt: Path, out: Path, tokenizer: Any) -> None:
        """``out`` := the final policy, an HF directory, from checkpoint ``ckpt`` (LoRA: merged from the
        base and the checkpoint's adapter, the adapter in ``out/adapter/``)."""
        if self.lora is None:
            shutil.copytree(ckpt / "policy", out)
        else:
            from reasonrl.models.lora import merge_checkpoint

            merge_checkpoint(self.base_dir, ckpt / "policy", out, tokenizer)

    def outputs(self) -> list[str]:
        return ["policy/", *(["policy/adapter/"] if self.lora is not None else [])]


# ---------------------------------------------------------------- validation


@dataclass
class Validation:
    """Validation during training (``--val-every``): the engine's policy on the held-out problems,
    its metrics into the step's; with ``--save-best`` the best policy kept in out/best/ (``best``, a
    ``reasonrl.train.validation.Best``, one of the run's stateful parts). A failed write of best/
    (a full disk) is put in :attr:`failed` on every rank, for the loop to checkpoint the step and stop."""

    validator: Any
    best: Any
    every: int
    steps: int
    out: Path
    ranks: Any
    display: Any
    policy_backend: Any
    tokenizer: Any
    engine: Any
    failed: list[str] = field(default_factory=list)

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.steps

    def run(self, step: int, m: dict[str, Any]) -> dict[str, Any]:
        """Validation at ``step`` (its metrics into ``m``), the best policy kept in out/best/; returns
        the per-problem record (rank 0), for validation.jsonl."""
        from reasonrl.errors import ReasonRLError
        from reasonrl.train.checkpoint import save_best

        rank, best = self.ranks.rank, self.best
        self.display.status(f"step {step}: validate on {len(self.validator.rows)} problems × {self.validator.n}")
        scalars, per_problem = self.validator.run(self.engine, step)
        m.update(scalars)
        if best is not None:
            new_best = self.ranks.max(torch.tensor([float(rank == 0 and best.update(m, step))])).item() > 0
            if rank != 0:  # (the other ranks keep the count too: every rank stops at the same step)
                best.since = 0 if new_best else best.since + 1
            if new_best:
                self.display.status(f"step {step}: save best policy")
                why = ""
                try:
                    save_best(self.out, best, step, policy_backend=self.policy_backend, tokenizer=self.tokenizer, rank=rank)
                except ReasonRLError as e:
                    why = str(e)
                if self.ranks.max(torch.tensor([float(bool(why))])).item() > 0:
                    self.failed.append(why or f"could not write best/ for step {step} (on rank 0)")
        return per_problem

    def repair_best(self, resumed: Resumed, console: Any) -> None:
        """A resumed run whose best/ failed to be written at the checkpoint's step: written now."""
        from reasonrl.train.checkpoint import best_step, save_best

        best, start = self.best, resumed.step
        if best is not None and best.step == start and best_step(self.out) != start:
            save_best(self.out, best, start, policy_backend=self.policy_backend, tokenizer=self.tokenizer, rank=self.ranks.rank)
            if self.ranks.rank == 0:
                console.print(f"best/: written from {resumed.path.name} (step {start}'s {best.metric} {best.value:.4f}; its write had failed)")


# ---------------------------------------------------------------- the run


@dataclass
class Run:
    """What ``train``'s loop works with, made by :func:`build_run`: the models behind their
    backends, the engine, collector, learner and validation, the perf model, and where the step's
    outcome goes (the bar, the run log); ``start``: the step it starts after (a resumed run's
    checkpoint step)."""

    cfg: Any
    spec: Any
    out: Path
    ranks: Any
    tokenizer: Any
    policy: Policy
    policy_backend: Any
    critic_backend: Any
    ref: Any
    engine: Any
    scorer: Any
    stream: Any
    collector: Any
    learner: Any
    validation: Validation | None
    best: Any
    perf: Any
    display: Any
    bar: Any
    runlog: Any
    start: int = 0

    def parts(self) -> Parts:
        """The run's stateful parts by name, as its checkpoints hold them (``reasonrl.train.checkpoint``):
        a new stateful feature is one more entry here."""
        return Parts(files={"policy": ModelState(self.policy_backend, self.tokenizer),
                            **({"critic": ModelState(self.critic_backend, label="critic.")} if self.critic_backend is not None else {}),
                            **({"ahead": self.collector.ahead} if self.collector.ahead is not None else {}),  # the batches in flight (--async-steps)
                            "rng": RngState(self.ranks.rank)},
                     states={"data": self.collector,  # the data position and the partial rollouts' pool
                             **({"val": self.best} if self.best is not None else {}),
                             "learner": JsonState(self.learner.state, self.learner.load)})  # the adaptive entropy coefficient

    def save(self, step: int) -> None:
        """Checkpoint ``step`` (every rank)."""
        self.display.status("save checkpoint")
        save_checkpoint(self.out, step, self.parts(), rank=self.ranks.rank, world=self.ranks.world, keep_last=self.cfg.keep_last)

    def mark(self) -> tuple[Any, Any]:
        """What a step abandoned before its update changed (the RNG, the data position and the batches
        generated ahead), as it stands."""
        return torch.get_rng_state(), self.collector.snapshot()

    def rewind(self, mark: tuple[Any, Any]) -> None:
        torch.set_rng_state(mark[0])
        self.collector.restore(mark[1])

    @property
    def stopped_early(self) -> bool:
        """--early-stop-patience ran out."""
        return self.best is not None and self.best.stop

    def record(self, step: int, m: dict[str, Any], per_problem: dict[str, Any], res: Any = None) -> None:
        """Step ``step``'s outcome (``res``, a ``StepResult``; None for step 0's validation): metrics.jsonl
        and the trackers, validation.jsonl (right after its metrics line: a resume cuts both back to
        the checkpoint's step), the console lines, --keep-rollouts (rank 0)."""
        from reasonrl.artifacts import append_jsonl
        from reasonrl.train.step_metrics import log_line, val_line

        cfg, display = self.cfg, self.display
        if res is not None:
            self.bar.advance()
        if self.ranks.rank != 0:
            return
        self.runlog.append(m)  # metrics.jsonl, then the trackers
        if per_problem:
            append_jsonl(self.out / "validation.jsonl", {"step": step, **per_problem})
        if res is None:
            display.print(val_line(0, m, cfg.val_n))
            return
        if res.short_batch:
            done = "update skipped" if res.skipped_update else "trained on them"
            if m.get("rollout/partial_kept_back_groups"):
                done += f", its {m['rollout/partial_kept_back_groups']} finished groups kept for the next step"
            display.print(f"[yellow]step {step}: {res.collection} kept {m['rollout/ds_kept_groups']} of {cfg.prompts_per_step} "
                          f"groups in {m['rollout/ds_rounds']} rounds (--max-gen-rounds): {done} (--on-short-batch)[/]")
        if step % cfg.log_every == 0 or step == cfg.steps:
            display.print(log_line(step, cfg.steps, m))
        if "perf/val_s" in m:
            display.print(val_line(step, m, cfg.val_n))
        if cfg.keep_rollouts:
            from reasonrl.rollouts import write_rollouts

            write_rollouts(self.out / "rollouts" / f"step_{step}.parquet", res.samples, step=step)

    def close(self) -> None:
        self.display.stop()
        self.runlog.close()
        self.scorer.close()
        self.engine.close()


def build_run(cfg: Any, *, spec: Any, policy: Policy, critic_dir: Path | None, tokenizer: Any, rows: list[dict[str, Any]],
              val_rows: list[dict[str, Any]], ranks: Any, resumed: Resumed | None, settings: dict[str, Any], console: Any) -> Run:
    """``train``'s run on ``cfg`` (a TrainConfig): the models (from ``resumed``'s weights when it
    continues a run), backends, engine, collector, learner, validation; every stateful part then put
    back from ``resumed`` (the RNG last, after everything the setup draws); config.json (rank 0)."""
    from reasonrl.artifacts import write_json
    from reasonrl.config import to_dict
    from reasonrl.devices import default_device, resolve_dtype
    from reasonrl.engines.base import engine_compiled, engine_label
    from reasonrl.engines.registry import make_engine
    from reasonrl.perf import StepPerf
    from reasonrl.progress import Display
    from reasonrl.rewards import RewardScorer
    from reasonrl.tracking import RunLog
    from reasonrl.train.collector import DataStream
    from reasonrl.train.validation import Best, Validator

    out, (rank, world) = Path(cfg.out), (ranks.rank, ranks.world)
    ckpt, start = (resumed.path, resumed.step) if resumed is not None else (None, 0)
    torch.manual_seed(cfg.seed)
    dtype = resolve_dtype(cfg.dtype)
    device = default_device()
    model = policy.load(ckpt, device=device, dtype=dtype, seed=cfg.seed)
    ref = policy.reference(model, device) if spec.kl_coef > 0 else None
    critic_backend = None
    if spec.use_critic:
        from reasonrl.models.value import load_value_model, new_value_model

        critic = load_value_model(ckpt / "critic") if ckpt else (load_value_model(critic_dir) if critic_dir else new_value_model(policy.base_dir, seed=cfg.seed))
        critic_backend = make_backend(cfg, critic.to(device), cfg.critic_lr, dtype)
    policy_backend = make_backend(cfg, model, cfg.lr, dtype)
    stream = DataStream(rows, cfg.seed, skip_solved=cfg.skip_solved_epochs)
    val_len = cfg.val_max_response_len or cfg.max_response_len
    split = False  # (the trainer lowered torch's thread count, its share of the cores: the caller puts it back)
    engine_threads = cfg.engine_threads
    engine_args = dict(seed=cfg.seed, max_model_len=cfg.max_prompt_len + max(cfg.max_response_len, val_len if cfg.val_every else 0),
                       decode_steps=(cfg.steps - start) * cfg.max_response_len)
    if cfg.async_steps:  # the engine in its own process (one per rank); its weights' version: the policy of step 1, or of the step after the checkpoint's once synced below
        from reasonrl.engines.base import EngineOptions
        from reasonrl.engines.process import EngineProcess

        opts = EngineOptions(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(EngineOptions)})
        cpus = rank_engine_cpus(cfg, rank, world)
        if engine_threads is None and cpus:  # (one thread per core it is given, not every core's on those)
            engine_threads = len(cpus)
        elif engine_threads is None and device == "cpu" and world == 1 and torch.get_num_threads() > 1:
            from reasonrl.cpu_share import split_threads  # (the cores shared out: each process half, not both all)

            engine_threads, trainer_threads = split_threads(torch.get_num_threads())
            torch.set_num_threads(trainer_threads)
            split = True
        engine = EngineProcess(opts, str(policy.base_dir), **engine_args, threads=engine_threads, cpus=cpus,
                               version=start if ckpt else 1, env=rank_engine_env(cfg, rank, world))
    else:
        engine = make_engine(cfg, str(policy.base_dir), **engine_args)
    if ckpt:  # (a fresh adapter's B is 0: its merged weights are the base's, which the engine loaded)
        policy.sync(engine, policy_backend)
    scorer = RewardScorer(reward=cfg.reward)
    collector = make_collector(cfg, spec=spec, engine=engine, tokenizer=tokenizer, scorer=scorer, stream=stream, ranks=ranks,
                               overlong_cache_len=cfg.overlong_cache_len, oversample=cfg.oversample, max_rounds=cfg.max_gen_rounds,
                               partial_len=cfg.partial_rollout_len, ahead=cfg.async_steps)
    learner = make_learner(cfg, spec=spec, tokenizer=tokenizer, dtype=dtype, ranks=ranks, policy=model, policy_backend=policy_backend,
                           critic_backend=critic_backend, ref_model=ref, ppo_epochs=cfg.ppo_epochs)
    best = Best(cfg.save_best, cfg.early_stop_patience) if cfg.save_best else None
    perf = None if cfg.peak_flops == 0 else StepPerf.for_model(
        model.config, dtype=dtype, device=device, peak_flops=cfg.peak_flops, group_size=cfg.group_size, epochs=cfg.ppo_epochs,
        mini_batch_size=max(1, cfg.mini_batch_size // world), critic=critic_backend is not None, ref=ref is not None, world=world)
    display = Display(console, quiet=cfg.quiet or rank != 0)
    validation = None
    if cfg.val_every:
        validator = Validator(val_rows, tokenizer, scorer, ranks, n=cfg.val_n, temperature=cfg.val_temperature, top_p=cfg.val_top_p, top_k=-1,
                              max_tokens=val_len, max_prompt_len=cfg.max_prompt_len, ks=[1], seed=cfg.seed, n_boot=cfg.val_bootstrap)
        validation = Validation(validator, best, every=cfg.val_every, steps=cfg.steps, out=out, ranks=ranks, display=display,
                                policy_backend=policy_backend, tokenizer=tokenizer, engine=engine)
    run = Run(cfg, spec, out, ranks, tokenizer, policy, policy_backend, critic_backend, ref, engine, scorer, stream, collector, learner,
              validation, best, perf, display, bar=None, runlog=None, start=start)
    if resumed is not None:
        load_checkpoint(resumed, run.parts())  # (torch's RNG as the checkpoint left it, after everything the setup draws, e.g. measuring the peak FLOP/s)
        if validation is not None:
            validation.repair_best(resumed, console)
    if rank == 0:
        write_json(out / "config.json", {**settings, "resolved_algo": dataclasses.asdict(spec), "dtype_resolved": dtype, "engine_resolved": engine.name,
                                         "engine_compiled": engine_compiled(engine), "world_size": world,
                                         **({"threads_resolved": {"trainer": torch.get_num_threads(), "engine": engine_threads}} if split else {})})
        console.print(f"[bold]train[/] --algo {cfg.algo} on {policy.base_dir} | engine {engine_label(engine)} | backend {cfg.backend} ×{world} | {dtype} | "
                      f"{len(rows)} prompts" + policy.trainable(model)
                      + (f" | threads: trainer {torch.get_num_threads()}, engine {engine_threads} (--engine-threads)" if split else ""))
    run.bar = display.bar(f"train --algo {cfg.algo}", cfg.steps, unit="steps", completed=start)
    run.runlog = RunLog(out, cfg.report_to, name=str(out), config=to_dict(cfg), start_step=start, rank=rank,
                        then="the run stops: free space (or fix the cause), then continue from its last checkpoint with --resume")
    return run
