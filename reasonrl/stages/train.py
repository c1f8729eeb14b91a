"""`reasonrl train`: on-policy RL with any `--algo` row (ppo, vcppo, grpo, dapo, gspo, cispo, drgrpo, vapo).

Check the inputs and claim the run directory (:func:`check_inputs`); build the run
(``reasonrl.train.run.build_run``: models, backends, engine, data, every stateful part put back from
the checkpoint a --resume continues); run ``reasonrl.train.step.train_step`` once per step with
checkpoints (``Run.save``); write the final policy, ``summary.json`` and the manifest last.

SIGTERM / SIGINT (``reasonrl.interrupts.StepStop``): the run stops at a step boundary, every rank at
the same step: a step that has started its updates is finished, one still collecting its rollouts
(one process) is abandoned and its data position and RNG put back; the last finished step is
checkpointed (unless it is already), trackers and engine are closed, and one line says how to go on
(exit 128 + the signal's number). ``--resume`` then continues bitwise as if nothing had happened.
Once the steps are over signals are ignored: closing and the final outputs take seconds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reasonrl import algos as A
from reasonrl.artifacts import last_record, read_manifest, write_json, write_manifest
from reasonrl.config import check, opt, section, to_dict
from reasonrl.errors import MissingArtifactError, ReasonRLError
from reasonrl.rundir import releases_claims
from reasonrl.stages.options import BackendOpts, LoraOpts, ModelOpts, OptimOpts, RolloutOpts, TrackOpts, ValOpts
from reasonrl.stages.options import ScheduleOpts


def _divisor_near(n: int, target: int) -> int:
    """The largest divisor of ``n`` that is at most ``target`` (1 at least)."""
    return next(d for d in range(max(target, 1), 0, -1) if n % d == 0)


@dataclass
class TrainConfig(BackendOpts, LoraOpts, ModelOpts, OptimOpts, RolloutOpts, ScheduleOpts, TrackOpts, ValOpts):
    data: str = opt("runs/data", "Prepared data directory (output of `reasonrl prepare-data`).")
    out: str = opt("runs/train", "Run directory: metrics.jsonl, validation.jsonl (with --val-every), checkpoints/, policy/ (final HF model), manifest.json.")
    algo: str = opt("dapo", f"Algorithm row of reasonrl.algos.ALGOS: {', '.join(A.ALGOS)} (see the --algo table in docs/algorithms.md).")
    algo_overrides: dict = section(A.AlgoSpec, "Fields of the --algo row to change for this run (--eps-high 0.3, [algo] table, --set algo.eps_high=0.3).",
                                   table="algo", name_field="algo")
    critic: str | None = opt(None, "Critic: a `pretrain-value` output directory (required by vcppo and vapo), or a value model's HF directory or hub name ORG/NAME[@REVISION]; ppo starts a fresh one from the policy when omitted.")
    steps: int = opt(20, "Training steps (each: rollout, rewards, filtering, advantages, updates).")
    prompts_per_step: int = opt(16, "Prompts per training step over all processes (after dynamic sampling); the batch holds prompts_per_step × group_size responses.")
    oversample: float = opt(1.0, "Dynamic sampling: each generation round samples ceil(oversample × still-needed) prompts.")
    max_gen_rounds: int = opt(10, "Cap on generation rounds per step (dynamic sampling's rounds; with --partial-rollout-len, a round is one segment); then --on-short-batch decides.")
    on_short_batch: str = opt("train", "When collection hits --max-gen-rounds with the batch not full (dynamic sampling, or partial rollouts with groups still going): 'train' on what was kept, 'skip' the update, or 'error' (verl raises).")
    ppo_epochs: int = opt(1, "Passes over the step's batch.")
    lr: float = opt(1e-6, "Policy learning rate (AdamW; DAPO: 1e-6).")
    weight_decay: float = opt(0.1, "AdamW weight decay.")
    overlong_cache_len: int | None = opt(None, "Soft overlong punishment buffer L_cache (DAPO: 4096 of 20480): punishment starts at max_response_len − overlong_cache_len; default max_response_len // 5, the paper's ratio.")
    save_every: int = opt(0, "Save a checkpoint every N steps (0: only at the end).")
    keep_last: int = opt(0, "Keep only the newest N checkpoints (0: keep all).")
    max_bad_steps: int = opt(3, "Divergence guard: a step whose loss, gradient norm or values are not finite makes no update; after this many in a row the run stops with an error (the last good checkpoint stays the latest).")
    filter_rollouts: str = opt("", "Filter the training prompts by their pass rate in this `reasonrl rollout` directory (of the same data): keep those with --min-pass-rate < p < --max-pass-rate.",
                               renamed_from="rollouts")
    min_pass_rate: float = opt(0.0, "With --filter-rollouts: drop the prompts whose pass rate is <= this (0: the never solved; -1 keeps them).")
    max_pass_rate: float = opt(1.0, "With --filter-rollouts: drop the prompts whose pass rate is >= this (1: the always solved; 2 keeps them).")
    unrated: str = opt("keep", "With --filter-rollouts: 'keep' or 'drop' the training prompts the rollouts do not cover.")
    skip_solved_epochs: int = opt(0, "Drop a prompt for the rest of the run once every sample of it was correct in this many visits in a row (0 = never); kept in checkpoints.")
    partial_rollout_len: int = opt(0, "Partial rollouts (Kimi k1.5 §2.6.2, slime): generate S tokens per response and round, and carry a response still going when the batch is full into the next step (sampled on by the policies of the steps that follow, over L_max/S steps or more; its per-token sampling log-probs and policy versions are kept: stale tokens are corrected by default, --stale-correction, --max-staleness), so no step waits for its longest response. Must divide max_response_len; 0 = off (each response whole within its step). See docs/performance.md.")
    async_steps: int = opt(0, "One-step-off asynchronous training: the engine runs in its own process and generates the first round of step t+K while step t trains (its tokens sampled by a policy up to K versions old: corrected by default as stale tokens, --stale-correction); the batches in flight are part of every checkpoint, so --resume gives the same run. 0 = the synchronous loop. Under torchrun every rank runs an engine process of its own and generates its share of the same prompts; the ranks agree on each batch and its version. Not with --partial-rollout-len, --engine-tp > 1 or --engine-sleep. See docs/performance.md.")
    engine_threads: int | None = opt(None, "With --async-steps: torch threads of the engine's process (default: one per --engine-cpus core; without it, on a CPU in one process, half of torch's, the trainer keeping the rest; else torch's).")
    engine_cpus: str = opt("", "With --async-steps: the cores the engine's process runs on, e.g. '1' or '0-3,8' (default: the trainer's); pin the trainer to the others with taskset. "
                               "Under torchrun shared out among a node's processes: local rank i's engine on the i-th equal part.")
    engine_gpus: str = opt("", "With --async-steps: the GPUs the engine's process sees (its CUDA_VISIBLE_DEVICES, e.g. '1'; default: the trainer's, shared), so that generation and training run on GPUs of their own. Under torchrun: one GPU per process of a node, local rank i's engine on the i-th (e.g. '2,3' with --nproc_per_node 2; default: each rank's own GPU, shared).")
    keep_rollouts: bool = opt(False, "Write each step's rollouts to out/rollouts/step_N.parquet.")
    resume: bool = opt(False, "Continue from the latest checkpoint in out/.")
    overwrite: bool = opt(False, "Replace a finished run in out/.")
    log_every: int = opt(1, "Print a metrics line every N steps.")
    peak_flops: float | None = opt(None, "Peak FLOP/s for perf/mfu and the perf/…_bound_frac metrics (0 = do not log them); default: the GPU's datasheet peak, or on CPU (and unknown GPUs) a GEMM measured at start-up.")

    def __post_init__(self) -> None:
        self._check_model()
        self._check_rollout()
        self._check_tracking()
        self._check_val()
        check(self.algo in A.ALGOS, f"unknown --algo '{self.algo}': choose one of {', '.join(A.ALGOS)}")
        check(self.steps >= 1, "steps must be >= 1")
        check(self.prompts_per_step >= 1, "prompts_per_step must be >= 1")
        check(self.mini_batch_size >= 1 and self.micro_batch_size >= 1, "mini_batch_size and micro_batch_size must be >= 1")
        check(self.micro_batch_size <= self.mini_batch_size, f"micro_batch_size ({self.micro_batch_size}) cannot exceed mini_batch_size ({self.mini_batch_size}): lower --micro-batch-size")
        check(self.ppo_epochs >= 1, "ppo_epochs must be >= 1")
        check(0 < self.lr < math.inf and 0 < self.critic_lr < math.inf, "lr and critic_lr must be finite and > 0")
        check(0 <= self.weight_decay < math.inf, "weight_decay must be finite and >= 0")
        check(0 <= self.grad_clip < math.inf, "grad_clip must be finite and >= 0 (0 = off)")
        self._check_schedule()
        self._check_lora()
        check(self.keep_last >= 0 and self.max_bad_steps >= 1, "keep_last must be >= 0 and max_bad_steps >= 1")
        check(1.0 <= self.oversample < math.inf, "oversample must be finite and >= 1.0")
        check(self.max_gen_rounds >= 1, "max_gen_rounds must be >= 1")
        check(self.on_short_batch in ("train", "skip", "error"), f"on_short_batch must be train, skip or error, got '{self.on_short_batch}'")
        check(self.temperature > 0, "temperature must be > 0 to train: the policy gradient scores each token under the sampling distribution, "
                                    "which greedy decoding (0) does not have; use temperature 0 only with `reasonrl eval`")
        if self.overlong_cache_len is None:
            self.overlong_cache_len = self.max_response_len // 5
        check(0 <= self.overlong_cache_len < self.max_response_len, f"overlong_cache_len must be in [0, max_response_len={self.max_response_len})")
        self._check_backend(self.mini_batch_size, self.micro_batch_size)
        check(not (self.resume and self.overwrite), "--resume and --overwrite conflict: choose one")
        self.algo_spec()  # the row with its overrides must validate
        check(self.save_every >= 0 and self.log_every >= 1, "save_every must be >= 0 and log_every >= 1")
        check(self.peak_flops is None or self.peak_flops >= 0, "peak_flops must be >= 0 (0 turns the bound metrics off)")
        check(self.min_pass_rate < self.max_pass_rate, f"min_pass_rate ({self.min_pass_rate:g}) must be below max_pass_rate ({self.max_pass_rate:g})")
        check(self.unrated in ("keep", "drop"), f"unrated must be keep or drop, got '{self.unrated}'")
        check(bool(self.filter_rollouts) or (self.min_pass_rate, self.max_pass_rate, self.unrated) == (0.0, 1.0, "keep"),
              "--min-pass-rate, --max-pass-rate and --unrated filter by a rollout artifact's pass rates: give --filter-rollouts DIR too")
        check(self.skip_solved_epochs >= 0, "skip_solved_epochs must be >= 0 (0 = never)")
        check(self.partial_rollout_len >= 0, f"partial_rollout_len must be >= 0 (tokens per response and round; 0 = off), got {self.partial_rollout_len}")
        check(self.partial_rollout_len == 0 or self.max_response_len % self.partial_rollout_len == 0,
              f"partial_rollout_len must divide max_response_len ({self.max_response_len}), e.g. {_divisor_near(self.max_response_len, self.max_response_len // 8)} (0 = off)")
        segments = self.max_response_len // self.partial_rollout_len if self.partial_rollout_len else 0
        self._check_async()
        check(self.max_gen_rounds >= segments, f"with --partial-rollout-len {self.partial_rollout_len} a round is one segment, and a response of "
              f"max_response_len ({self.max_response_len}) takes {segments}: raise --max-gen-rounds to {segments} or more (it is {self.max_gen_rounds}), "
              "or lengthen the segment, or the first step could finish no group whose longest response runs to the cap")

    def _check_async(self) -> None:
        check(self.async_steps >= 0, f"async_steps must be >= 0 (0 = synchronous), got {self.async_steps}")
        if not self.async_steps:
            check(self.engine_threads is None and not self.engine_cpus and not self.engine_gpus,
                  "--engine-threads, --engine-cpus and --engine-gpus set the engine's own process: add --async-steps 1")
            return
        check(self.engine_threads is None or self.engine_threads >= 1, f"engine_threads must be >= 1, got {self.engine_threads}")
        self.engine_cpu_list()
        check(not self.partial_rollout_len, "--async-steps with --partial-rollout-len is not supported: use --async-steps 0 with --partial-rollout-len, or drop it")
        check(self.engine_tp == 1, "--async-steps with --engine-tp > 1 is not supported: use --async-steps 0 with --engine-tp")
        bound = self.algo_spec().max_staleness
        check(bound is None or bound >= self.async_steps, f"--async-steps {self.async_steps} trains tokens {self.async_steps} versions old, "
              f"above --max-staleness {bound}: raise --max-staleness or lower --async-steps")
        check(not self.engine_sleep, "--engine-sleep frees the engine's memory while the trainer works, which --async-steps overlaps: use --async-steps 0 with --engine-sleep")

    def engine_cpu_list(self) -> list[int] | None:
        """--engine-cpus as a list of core numbers (None: not set)."""
        if not self.engine_cpus:
            return None
        cpus: list[int] = []
        try:
            for part in self.engine_cpus.split(","):
                lo, _, hi = part.strip().partition("-")
                cpus += list(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            cpus = []
        check(bool(cpus) and min(cpus) >= 0, f"engine_cpus must list cores such as '1' or '0-3,8', got '{self.engine_cpus}'")
        return cpus

    def algo_spec(self) -> A.AlgoSpec:
        """The --algo row with this run's overrides applied."""
        try:
            return A.ALGOS[self.algo].replace(**self.algo_overrides)
        except ValueError as e:
            raise ReasonRLError(f"{e}: change the override (see `reasonrl train --help`)") from None


def critic_dir(path: str | Path, allow_pickle: bool = False) -> Path:
    """Accept a `pretrain-value` output directory (critic in critic/), a critic HF directory or a hub name of one."""
    from reasonrl.models.hub import is_hub_name
    from reasonrl.models.loading import check_model_config, resolve_model

    p = (resolve_model(path, allow_pickle=allow_pickle, what="--critic", local_hint=f"run `reasonrl pretrain-value --out {path}` first")
         if is_hub_name(path) else Path(path))
    if not p.exists():
        raise MissingArtifactError(f"critic {p} not found: run `reasonrl pretrain-value --out {p}` first")
    if (p / "critic" / "config.json").is_file():
        read_manifest(p, stage="pretrain-value", hint=f"reasonrl pretrain-value --out {p}")
        return p / "critic"
    if (p / "config.json").is_file():
        arch = check_model_config(p).get("architectures") or []
        if not any(a.endswith("ForTokenClassification") for a in arch):
            raise ReasonRLError(f"{p} is not a value model ({', '.join(arch) or 'no architecture'}): a critic has a scalar head; "
                                f"make one with `reasonrl pretrain-value --out DIR` and pass --critic DIR")
        return p
    raise MissingArtifactError(f"{p} holds no critic: run `reasonrl pretrain-value --out {p}` first")


def rated_prompts(cfg: TrainConfig, rows: list[dict[str, Any]], tokenizer: Any) -> tuple[list[dict[str, Any]], Any]:
    """``--filter-rollouts``: the rows its pass rates keep, and the filter's counts. An artifact with no
    prompt in common with the data, or a filter that keeps nothing, is a one-line error."""
    from reasonrl.rollouts import load_rollout_artifact, prompt_text
    from reasonrl.train.prompt_filter import filter_prompts

    art = load_rollout_artifact(cfg.filter_rollouts, option="--filter-rollouts")
    rates = art.pass_rates()
    kept, counts = filter_prompts(rows, lambda r: prompt_text(r, tokenizer), rates, min_rate=cfg.min_pass_rate, max_rate=cfg.max_pass_rate,
                                  unrated=cfg.unrated)
    if counts.unrated == counts.prompts:
        raise ReasonRLError(f"--filter-rollouts {art.path} shares no prompt with --data {cfg.data} (other data, or another chat template): "
                            f"run `reasonrl rollout --data {cfg.data} --model {cfg.model}` and pass its directory")
    if not kept:
        raise ReasonRLError(f"--filter-rollouts {art.path}: no prompt has {cfg.min_pass_rate:g} < pass rate < {cfg.max_pass_rate:g} ({counts.dropped()}): widen --min-pass-rate / --max-pass-rate")
    return kept, counts


def fitting_prompts(rows: list[dict[str, Any]], tokenizer: Any, max_prompt_len: int, console: Any) -> list[dict[str, Any]]:
    """The rows whose chat prompt fits ``max_prompt_len`` tokens; the others are dropped and counted
    once, up front (a run where none fits is an error, not a run that trains on nothing). A prompt
    with more characters than that many tokens can have is dropped without being tokenised."""
    from reasonrl.models.tokens import fitting_ids
    from reasonrl.rollouts import prompt_text

    fit = [r for r in rows if fitting_ids(prompt_text(r, tokenizer), tokenizer, max_prompt_len) is not None]
    if not fit:
        raise ReasonRLError(f"every one of the {len(rows)} prompts is longer than --max-prompt-len {max_prompt_len} tokens: raise it")
    if len(fit) < len(rows) and console is not None:
        console.print(f"[yellow]{len(rows) - len(fit)} of {len(rows)} prompts are longer than --max-prompt-len {max_prompt_len}: skipped[/]")
    return fit


@dataclass
class TrainProgress:
    """How far a `train` process got, for the one line printed when a signal stops it."""

    phase: str = "check"  # check (nothing written yet) → setup → steps → final (policy/, summary, manifest)
    finished: int = 0  # the last finished step (a resumed run starts at its checkpoint's)
    saved: int = 0  # the last checkpointed step (0: none)
    written: bool = False  # that checkpoint was written after the signal
    abandoned: int = 0  # the step dropped before its update


def stop_message(cfg: TrainConfig, signum: int, p: TrainProgress, *, again: bool = False) -> str:
    """The one line of a run stopped by ``signum``: where it stopped, the checkpoint, what to do."""
    from reasonrl.interrupts import signal_name

    if again:
        where = "again while stopping (abandoned at once)"
    elif p.phase in ("check", "setup"):
        where = "before the first step"
    elif p.phase == "final":
        where = f"after step {p.finished}, while writing the final policy"
    elif p.abandoned:
        where = f"in step {p.abandoned}, before its update (the step is dropped)"
    else:
        where = f"after step {p.finished}"
    head = f"stopped by {signal_name(signum)} {where}"
    if p.saved:
        ckpt = f"checkpoint step_{p.saved} {'written' if p.written else 'is the latest'}"
        how = "the same command (it has --resume)" if cfg.resume else "the same command and --resume" + (" (not --overwrite)" if cfg.overwrite else "")
        return f"{head}: {ckpt}; continue with {how}"
    if p.phase == "check":
        return f"{head}: nothing written; rerun the same command"
    how = "--overwrite in place of --resume" if cfg.resume else "--overwrite"
    return f"{head}: no checkpoint yet, nothing to resume; start over with the same command and {how}"


def _not_finite(m: dict[str, Any]) -> tuple[str, str]:
    """(the first metric of a bad step that was not finite, what to try): a reward's is the reward's fault."""
    which = next((k for k in ("rollout/reward_mean", "actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm")
                  if k in m and not math.isfinite(float(m[k]))), "a non-finite value")
    return which, ("check the reward (--reward)" if which.startswith("rollout/") else "try a lower --lr or a --grad-clip")


def _then(fix: str, last: Path | None) -> str:
    """The checkpoint clause of a divergence line, true to what is on disk (no resume from nothing)."""
    if last is not None:
        return f"the last good checkpoint is {last.name}; {fix}, then --resume"
    return f"no checkpoint was written (nothing to resume); {fix}, then start over with --overwrite"


def divergence_message(step: int, m: dict[str, Any], bad: int, cfg: TrainConfig, last: Path | None) -> str:
    """The one-line error of the divergence guard: the step, the metric, what to try."""
    which, fix = _not_finite(m)
    return f"training diverged: {which} was not finite for {bad} steps in a row (up to step {step}, lr {cfg.lr:g}); the run stops, {_then(fix, last)}"


def no_update_message(end: int, m: dict[str, Any], last: Path | None) -> str:
    """The one-line error when the last step made no update (so there is no final policy)."""
    which, fix = _not_finite(m)
    return f"step {end} made no update ({which} was not finite): no final policy written; {_then(fix, last)}"


def _check_same_reward(out: Path, reward: dict[str, Any]) -> None:
    """--resume with another reward plug-in file than the run started with: one line naming it (the
    general settings check, ``reward_file_sha256`` in config.json, would refuse it too, less plainly)."""
    try:
        saved = json.loads((out / "config.json").read_text(encoding="utf-8")).get("reward_file_sha256")
    except (OSError, ValueError, AttributeError):
        return  # (no readable config.json: start_run says so)
    if saved and reward["sha256"] and saved != reward["sha256"]:
        raise ReasonRLError(f"--resume: the reward plug-in {reward['file']} changed since the run started (sha256 {saved[:12]}… → "
                            f"{reward['sha256'][:12]}…): restore the file the run was trained with, or start over with --overwrite")


@releases_claims
def run_train(cfg: TrainConfig, console: Any = None) -> dict[str, Any]:
    """Run ``cfg``; a stop by SIGTERM or SIGINT raises ``reasonrl.interrupts.Interrupted`` with its one line."""
    import signal

    from reasonrl.interrupts import Interrupted, StepStop
    from reasonrl.train.checkpoint import latest_checkpoint

    progress = TrainProgress()
    handler = StepStop()  # installed for the steps (and ignoring signals while the run closes and ends)
    try:
        return _train(cfg, console, progress, handler)
    except Interrupted as e:
        if e.message:  # the step loop's own
            raise
        again = progress.phase == "steps"  # (StepStop's handler: a second signal while stopping)
        stop = e
    except KeyboardInterrupt:  # SIGINT before the steps
        again, stop = False, Interrupted(signal.SIGINT)
    finally:
        handler.uninstall()
    if progress.phase in ("check", "setup") and cfg.resume and not progress.saved:  # (the checkpoint it was to resume)
        last = latest_checkpoint(Path(cfg.out))
        progress.saved = int(last.name.removeprefix("step_")) if last is not None else 0
    raise Interrupted(stop.signum, stop_message(cfg, stop.signum, progress, again=again)) from None


@dataclass
class TrainInputs:
    """What `train` checked before writing anything (:func:`check_inputs`), and the run directory it claimed."""

    spec: A.AlgoSpec  # --algo with its overrides
    rows: list[dict[str, Any]]
    val_rows: list[dict[str, Any]]
    policy: Any  # reasonrl.train.run.Policy
    critic: Path | None  # --critic, resolved
    rated: Any  # --rollouts' filter counts, or None
    reward: dict[str, Any]
    settings: dict[str, Any]  # config.json's
    rank: int
    world: int
    tokenizer: Any
    claim: Any  # the run directory's claim (rank 0), else None
    resumed: Any  # reasonrl.train.checkpoint.Resumed, or None


def check_inputs(cfg: TrainConfig, console: Any, progress: TrainProgress) -> TrainInputs:
    """Validate every input before anything is written; claim the run directory (rank 0) and open
    the checkpoint a --resume continues from."""
    from reasonrl.models.loading import check_weights, load_tokenizer
    from reasonrl.train.checkpoint import latest_checkpoint, open_checkpoint, start_run
    from reasonrl.train.run import Policy, rank_engine_env, start_ranks, training_rows, validation_rows

    spec = cfg.algo_spec()
    out = Path(cfg.out)
    rows = training_rows(cfg.data)
    val_rows = validation_rows(cfg) if cfg.val_every else []
    policy = Policy(cfg.policy_dir(), cfg.lora_settings())
    cdir: Path | None = None
    if spec.use_critic:
        if cfg.critic:
            cdir = check_weights(critic_dir(cfg.critic, cfg.allow_pickle), cfg.allow_pickle)
        elif spec.pretrained_critic_required:
            raise MissingArtifactError(f"--algo {cfg.algo} needs a pretrained critic: run `reasonrl pretrain-value` first and pass --critic runs/critic")
    elif cfg.critic:
        console.print(f"[yellow]note: --algo {cfg.algo} uses no critic; --critic is ignored[/]")
    policy.check()
    rank, world = start_ranks(cfg)
    if cfg.async_steps:
        rank_engine_env(cfg, rank, world)  # (--engine-gpus under torchrun: one GPU per process of a node, refused before anything is written)
    tok = load_tokenizer(policy.base_dir)
    rows = fitting_prompts(rows, tok, cfg.max_prompt_len, console if rank == 0 else None)
    rated = None
    if cfg.filter_rollouts:
        rows, rated = rated_prompts(cfg, rows, tok)
        if rank == 0:
            console.print(f"--filter-rollouts {cfg.filter_rollouts}: {rated.line()}")
    ckpt, run = None, None
    reward = cfg.reward_record()  # (the plug-in file's sha256 as the run starts: a --resume refuses another file)
    settings = {**to_dict(cfg), "reward_file_sha256": reward["sha256"]}
    if rank == 0 and cfg.resume:
        cfg.check_resumed_lora(out)
        _check_same_reward(out, reward)
        cfg.check_resumed_schedule(out, cfg.steps)
    if rank == 0:  # rank 0 holds the run directory for the whole job
        notes: list[str] = []  # (checkpoints a --resume skipped: links, damaged ones)
        run, ckpt = start_run(out, resume=cfg.resume, overwrite=cfg.overwrite, model_dir=policy.base_dir, config=settings,
                              inputs=(cfg.data, cdir, cfg.filter_rollouts or None), notes=notes)
        for line in notes:
            console.print(f"[yellow]{line}[/]")
    if world > 1:
        torch.distributed.barrier()
        ckpt = latest_checkpoint(out) if cfg.resume else None
    resumed = open_checkpoint(ckpt)
    if resumed is not None:
        progress.finished = progress.saved = resumed.step
        console.print(f"resumed from {ckpt} (step {resumed.step})")
    return TrainInputs(spec, rows, val_rows, policy, cdir, rated, reward, settings, rank, world, tok, run, resumed)


def _put_back_threads(n: int) -> None:
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def _train(cfg: TrainConfig, console: Any, progress: TrainProgress, stop: Any) -> dict[str, Any]:
    from rich.console import Console

    from reasonrl.interrupts import Interrupted, StepAbandoned
    from reasonrl.train.checkpoint import latest_checkpoint
    from reasonrl.train.ranks import Ranks
    from reasonrl.train.run import build_run
    from reasonrl.train.step import train_step

    console = console or Console(stderr=True)
    inp = check_inputs(cfg, console, progress)
    progress.phase = "setup"
    threads = torch.get_num_threads()  # (build_run lowers it for --async-steps on a CPU: put back however the run ends)
    try:
        run = build_run(cfg, spec=inp.spec, policy=inp.policy, critic_dir=inp.critic, tokenizer=inp.tokenizer, rows=inp.rows, val_rows=inp.val_rows,
                        ranks=Ranks(inp.rank, inp.world), resumed=inp.resumed, settings=inp.settings, console=console)
    except BaseException:
        _put_back_threads(threads)
        raise
    val, history, bad_steps, last = run.validation, [], 0, run.start

    def checkpoint(step: int, written: bool) -> None:
        run.save(step)
        progress.saved, progress.written = step, written

    progress.phase = "steps"
    stop.install(run.ranks)  # SIGTERM / SIGINT: stop at a step boundary, every rank at the same one (reasonrl.interrupts.StepStop)
    try:
        run.display.start()
        if val is not None and run.start == 0:  # the policy before any update
            m0: dict[str, Any] = {"step": 0}
            run.record(0, m0, val.run(0, m0))
            if val.failed:
                raise ReasonRLError(f"{val.failed[0]}; nothing was trained yet: free space, then start over with --overwrite")
        for step in range(run.start + 1, cfg.steps + 1):
            if run.stopped_early:
                break  # (a resumed run that had stopped early)
            mark = run.mark()  # the state after the last step, should this one be dropped
            try:
                stop.begin_step()
                res = train_step(run.collector, run.learner, run.engine, step=step, prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
                                 on_short_batch=cfg.on_short_batch, perf=run.perf, before_update=stop.commit)
            except StepAbandoned:  # (a signal while collecting: nothing but the data position and the RNG changed)
                run.rewind(mark)
                progress.abandoned = step
                if progress.finished > progress.saved and not bad_steps:
                    checkpoint(progress.finished, written=True)
                break
            m = res.metrics
            bad_steps, last = (bad_steps + 1 if res.bad_step else 0), step
            per_problem = val.run(step, m) if val is not None and val.due(step) else {}
            early = run.stopped_early  # (--early-stop-patience)
            history.append(m)
            run.record(step, m, per_problem, res)
            progress.finished = step
            if bad_steps >= cfg.max_bad_steps:
                raise ReasonRLError(divergence_message(step, m, bad_steps, cfg, latest_checkpoint(run.out)))
            stopping = stop.requested()  # (every rank: the same answer)
            failed = val.failed if val is not None else []  # (a failed write of best/: the step is checkpointed, then the run stops)
            if ((cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps or stopping or early or failed) and not bad_steps:
                checkpoint(step, written=stopping)
            if failed:  # (its checkpoint written first, whatever --save-every: no trained step is lost)
                kept = (f"step {step} is checkpointed: free space, then --resume (it writes best/ from checkpoints/step_{step})" if progress.saved == step
                        else f"the last checkpoint is {latest_checkpoint(run.out)}: free space, then --resume")
                raise ReasonRLError(f"{failed[0]}; {kept}")
            if early and inp.rank == 0:
                run.display.print(f"early stop at step {step}: {cfg.save_best} has not beaten {run.best.value:.4f} (step {run.best.step}) "
                                  f"in {run.best.since} validations (--early-stop-patience)")
            if stopping or early:
                break
    finally:
        stop.closing()  # (signals are ignored from here on: closing, then the one line or the final outputs)
        run.close()
        _put_back_threads(threads)
    if stop.signum and progress.finished < cfg.steps:  # (a stop agreed at the last step's end: the run just finishes)
        raise Interrupted(stop.signum, stop_message(cfg, stop.signum, progress), quiet=inp.rank != 0)
    progress.phase = "final"
    if inp.rank == 0:
        write_outputs(cfg, run, inp, history, last)
    if inp.world > 1:
        torch.distributed.barrier()
    return {"history": history, "out": str(run.out)}


def write_outputs(cfg: TrainConfig, run: Any, inp: TrainInputs, history: list[dict[str, Any]], last: int) -> None:
    """The finished run's outputs from its last checkpoint (rank 0): policy/ (LoRA: merged, the
    adapter in policy/adapter/), summary.json, and the manifest last."""
    from reasonrl.train.checkpoint import latest_checkpoint
    from reasonrl.train.step_metrics import flatten_metrics

    out, best = run.out, run.best
    final = latest_checkpoint(out)
    end = last if run.stopped_early else cfg.steps
    if final is None or final.name != f"step_{end}":
        raise ReasonRLError(no_update_message(end, history[-1] if history else {}, final))
    with inp.claim.writing(("policy", "summary.json")):
        if (out / "policy").exists():
            shutil.rmtree(out / "policy")
        run.policy.write_final(final, out / "policy", inp.tokenizer)
        # (a resumed run whose last step was already checkpointed ran no step: its last record is on disk)
        summary = {"steps": end, "last": flatten_metrics(history[-1] if history else last_record(out / "metrics.jsonl", end))}
        if best is not None:
            summary["best"] = best.state()
            summary["early_stopped"] = best.stop
        prompts = {"prompts": len(inp.rows), **({"rollouts_filter": inp.rated.as_dict()} if inp.rated is not None else {}),
                   **({"retired_solved": len(run.stream.retired)} if cfg.skip_solved_epochs else {})}
        summary["prompts"] = prompts
        write_json(out / "summary.json", summary)
        write_manifest(out, "train", to_dict(cfg), {"data": cfg.data, "policy": str(run.policy.base_dir), "critic": str(inp.critic) if inp.critic else None,
                                                    "rollouts": cfg.filter_rollouts or None},
                       extra={"algo": dataclasses.asdict(run.spec), "reward": inp.reward, "prompts": prompts,
                              "outputs": [*run.policy.outputs(), "metrics.jsonl", *(["validation.jsonl"] if cfg.val_every else []), "checkpoints/",
                                          "summary.json", *(["best/"] if best is not None and best.step is not None else [])]})
