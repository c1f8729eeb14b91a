"""`reasonrl train`: on-policy RL with any `--algo` row (ppo, vcppo, grpo, dapo, gspo, cispo, drgrpo, vapo).

Set up the models, backends, engine and data, then run ``reasonrl.train.step.train_step`` once per
step with checkpoints; write the final policy, ``summary.json`` and the manifest last.

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
from reasonrl.artifacts import append_jsonl, last_record, read_manifest, write_json, write_manifest
from reasonrl.config import check, opt, section, to_dict
from reasonrl.devices import default_device, resolve_dtype
from reasonrl.errors import MissingArtifactError, ReasonRLError
from reasonrl.perf import StepPerf
from reasonrl.rundir import releases_claims
from reasonrl.stages.options import (BackendOpts, LoraOpts, ModelOpts, OptimOpts, RolloutOpts, TrackOpts, ValOpts, make_backend, make_collector,
                                      make_learner, start_ranks, training_rows, validation_rows)
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
        check(self.max_gen_rounds >= segments, f"with --partial-rollout-len {self.partial_rollout_len} a round is one segment, and a response of "
              f"max_response_len ({self.max_response_len}) takes {segments}: raise --max-gen-rounds to {segments} or more (it is {self.max_gen_rounds}), "
              "or lengthen the segment, or the first step could finish no group whose longest response runs to the cap")

    @property
    def rollouts(self) -> str:
        """``filter_rollouts`` under its old name (what the run's setup reads)."""
        return self.filter_rollouts

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


def _train(cfg: TrainConfig, console: Any, progress: TrainProgress, stop: Any) -> dict[str, Any]:
    from rich.console import Console

    from reasonrl.engines.base import engine_compiled, engine_label
    from reasonrl.engines.registry import make_engine
    from reasonrl.interrupts import Interrupted, StepAbandoned
    from reasonrl.models import lora as L
    from reasonrl.models.loading import check_weights, load_causal_lm, load_tokenizer
    from reasonrl.progress import Display
    from reasonrl.rewards import RewardScorer
    from reasonrl.tracking import RunLog
    from reasonrl.train.checkpoint import best_step, latest_checkpoint, save_best, save_checkpoint, start_run
    from reasonrl.train.collector import DataStream
    from reasonrl.train.ranks import Ranks
    from reasonrl.train.step_metrics import flatten_metrics, log_line, val_line
    from reasonrl.train.step import train_step
    from reasonrl.train.validation import Best, Validator

    console = console or Console(stderr=True)
    spec = cfg.algo_spec()
    out = Path(cfg.out)
    # Validate every input before anything is written.
    rows = training_rows(cfg.data)
    val_rows = validation_rows(cfg) if cfg.val_every else []
    policy_dir = cfg.policy_dir()
    cdir: Path | None = None
    if spec.use_critic:
        if cfg.critic:
            cdir = check_weights(critic_dir(cfg.critic, cfg.allow_pickle), cfg.allow_pickle)
        elif spec.pretrained_critic_required:
            raise MissingArtifactError(f"--algo {cfg.algo} needs a pretrained critic: run `reasonrl pretrain-value` first and pass --critic runs/critic")
    elif cfg.critic:
        console.print(f"[yellow]note: --algo {cfg.algo} uses no critic; --critic is ignored[/]")

    lora = cfg.lora_settings()
    if lora is not None:
        L.check_targets(policy_dir, lora)  # (the architecture on the meta device: a bad target is refused before anything is written)
    rank, world = start_ranks(cfg)
    tok = load_tokenizer(policy_dir)
    rows = fitting_prompts(rows, tok, cfg.max_prompt_len, console if rank == 0 else None)
    rated = None
    if cfg.rollouts:
        rows, rated = rated_prompts(cfg, rows, tok)
        if rank == 0:
            console.print(f"--rollouts {cfg.rollouts}: {rated.line()}")
    ckpt, run = None, None
    reward = cfg.reward_record()  # (the plug-in file's sha256 as the run starts: a --resume refuses another file)
    settings = {**to_dict(cfg), "reward_file_sha256": reward["sha256"]}
    if rank == 0 and cfg.resume:
        cfg.check_resumed_lora(out)
        _check_same_reward(out, reward)
        cfg.check_resumed_schedule(out, cfg.steps)
    if rank == 0:  # rank 0 holds the run directory for the whole job
        notes: list[str] = []  # (checkpoints a --resume skipped: links, damaged ones)
        run, ckpt = start_run(out, resume=cfg.resume, overwrite=cfg.overwrite, model_dir=policy_dir, config=settings,
                              inputs=(cfg.data, cdir, cfg.rollouts or None), notes=notes)
        for line in notes:
            console.print(f"[yellow]{line}[/]")
    if world > 1:
        torch.distributed.barrier()
        ckpt = latest_checkpoint(out) if cfg.resume else None
    progress.phase = "setup"
    torch.manual_seed(cfg.seed)
    dtype = resolve_dtype(cfg.dtype)
    device = default_device()
    if lora is None:
        policy = load_causal_lm(ckpt / "policy" if ckpt else policy_dir, device=device)
    else:  # the frozen base from --model (in bf16 when the run computes in it: half the memory), the adapter fresh (seeded) or the checkpoint's
        base = load_causal_lm(policy_dir, device=device, dtype=torch.bfloat16 if dtype == "bf16" else None)
        policy = L.apply_lora(base, lora, seed=cfg.seed, base_path=policy_dir)
        if ckpt:
            L.load_adapter_weights(policy, ckpt / "policy")
    policy.config.use_cache = False
    ref = None
    if spec.kl_coef > 0:  # (LoRA: the policy with its adapter off, no second copy)
        ref = load_causal_lm(policy_dir, device=device).eval() if lora is None else L.reference_model(policy)
    critic_backend = None
    if spec.use_critic:
        from reasonrl.models.value import load_value_model, new_value_model

        critic = load_value_model(ckpt / "critic") if ckpt else (load_value_model(cdir) if cdir else new_value_model(policy_dir, seed=cfg.seed))
        critic = critic.to(device)
        critic_backend = make_backend(cfg, critic, cfg.critic_lr, dtype)
    policy_backend = make_backend(cfg, policy, cfg.lr, dtype)
    stream = DataStream(rows, cfg.seed, skip_solved=cfg.skip_solved_epochs)
    start, val_state, rng_state = 0, None, None
    if ckpt:
        st = json.loads((ckpt / "trainer_state.json").read_text())
        start = int(st["step"])
        progress.finished = progress.saved = start
        policy_backend.load_state(ckpt / "policy_state")
        if critic_backend is not None:
            critic_backend.load_state(ckpt / "critic_state")
        val_state = st.get("val")
        rng_state = torch.load(ckpt / "rng.pt", weights_only=True)["torch"]  # (put back once the setup is over, below)
        console.print(f"resumed from {ckpt} (step {start})")

    val_len = cfg.val_max_response_len or cfg.max_response_len
    engine = make_engine(cfg, str(policy_dir), seed=cfg.seed, max_model_len=cfg.max_prompt_len + max(cfg.max_response_len, val_len if cfg.val_every else 0),
                         decode_steps=(cfg.steps - start) * cfg.max_response_len)
    if ckpt:  # (a fresh adapter's B is 0: its merged weights are the base's, which the engine loaded)
        engine.update_weights(L.engine_weights(policy_backend.model, policy_backend.full_state_dict()))
    scorer = RewardScorer(reward=cfg.reward)
    ranks = Ranks(rank, world)
    collector = make_collector(cfg, spec=spec, engine=engine, tokenizer=tok, scorer=scorer, stream=stream, ranks=ranks,
                               overlong_cache_len=cfg.overlong_cache_len, oversample=cfg.oversample, max_rounds=cfg.max_gen_rounds,
                               partial_len=cfg.partial_rollout_len)
    if ckpt:
        collector.load(st["data"])  # the data position (and the partial rollouts' pool)
    learner = make_learner(cfg, spec=spec, tokenizer=tok, dtype=dtype, ranks=ranks, policy=policy, policy_backend=policy_backend,
                           critic_backend=critic_backend, ref_model=ref, ppo_epochs=cfg.ppo_epochs)
    if ckpt:  # (the adaptive entropy coefficient)
        learner.load_state(json.loads((ckpt / "trainer_state.json").read_text()).get("learner"))
    validator = Validator(val_rows, tok, scorer, ranks, n=cfg.val_n, temperature=cfg.val_temperature, top_p=cfg.val_top_p, top_k=-1,
                          max_tokens=val_len, max_prompt_len=cfg.max_prompt_len, ks=[1], seed=cfg.seed, n_boot=cfg.val_bootstrap) if cfg.val_every else None
    best = Best(cfg.save_best, cfg.early_stop_patience) if cfg.save_best else None
    if best is not None:
        best.load(val_state)
        if ckpt and best.step == start and best_step(out) != start:  # (best/ failed to be written at the checkpoint's step)
            save_best(out, best, start, policy_backend=policy_backend, tokenizer=tok, rank=rank)
            if rank == 0:
                console.print(f"best/: written from {ckpt.name} (step {start}'s {cfg.save_best} {best.value:.4f}; its write had failed)")
    if rank == 0:
        write_json(out / "config.json", {**settings, "resolved_algo": dataclasses.asdict(spec), "dtype_resolved": dtype, "engine_resolved": engine.name,
                                      "engine_compiled": engine_compiled(engine), "world_size": world})
        console.print(f"[bold]train[/] --algo {cfg.algo} on {policy_dir} | engine {engine_label(engine)} | backend {cfg.backend} ×{world} | {dtype} | {len(rows)} prompts"
                      + (f" | {L.trainable_line(policy)}" if lora is not None else ""))
    perf = None if cfg.peak_flops == 0 else StepPerf.for_model(
        policy.config, dtype=dtype, device=device, peak_flops=cfg.peak_flops, group_size=cfg.group_size, epochs=cfg.ppo_epochs,
        mini_batch_size=max(1, cfg.mini_batch_size // world), critic=critic_backend is not None, ref=ref is not None, world=world)
    history: list[dict[str, Any]] = []
    display = Display(console, quiet=cfg.quiet or rank != 0)
    bar = display.bar(f"train --algo {cfg.algo}", cfg.steps, unit="steps", completed=start)
    runlog = RunLog(out, cfg.report_to, name=str(out), config=to_dict(cfg), start_step=start, rank=rank,
                    then="the run stops: free space (or fix the cause), then continue from its last checkpoint with --resume")
    bad_steps, last = 0, start
    progress.phase = "steps"
    stop.install(ranks)  # SIGTERM / SIGINT: stop at a step boundary, every rank at the same one (reasonrl.interrupts.StepStop)

    best_failed: list[str] = []  # (a failed write of best/: the step is checkpointed, then the run stops with this line)

    def validate(step: int, m: dict[str, Any]) -> dict[str, Any]:
        """Validation at ``step`` (its metrics into ``m``), the best policy kept in out/best/;
        returns the per-problem record (rank 0), for validation.jsonl. A failed write of best/ (a
        full disk) is put in ``best_failed`` (every rank), for the caller to checkpoint the step and stop."""
        display.status(f"step {step}: validate on {len(val_rows)} problems × {cfg.val_n}")
        scalars, per_problem = validator.run(engine, step)
        m.update(scalars)
        if best is not None:
            new_best = ranks.max(torch.tensor([float(rank == 0 and best.update(m, step))])).item() > 0
            if rank != 0:  # (the other ranks keep the count too: every rank stops at the same step)
                best.since = 0 if new_best else best.since + 1
            if new_best:
                display.status(f"step {step}: save best policy")
                why = ""
                try:
                    save_best(out, best, step, policy_backend=policy_backend, tokenizer=tok, rank=rank)
                except ReasonRLError as e:
                    why = str(e)
                if ranks.max(torch.tensor([float(bool(why))])).item() > 0:
                    best_failed.append(why or f"could not write best/ for step {step} (on rank 0)")
        return per_problem

    def log_validation(step: int, per_problem: dict[str, Any]) -> None:
        """validation.jsonl: the step's per-problem values, written right after its metrics.jsonl
        line (a resume cuts both back to the checkpoint's step)."""
        if per_problem:
            append_jsonl(out / "validation.jsonl", {"step": step, **per_problem})

    if rng_state is not None:  # torch's RNG as the checkpoint left it, after everything the setup draws (e.g. measuring the peak FLOP/s)
        torch.set_rng_state(rng_state)
    try:
        display.start()
        if validator is not None and start == 0:
            m0: dict[str, Any] = {"step": 0}
            per_problem = validate(0, m0)  # the policy before any update
            if rank == 0:
                runlog.append(m0)
                log_validation(0, per_problem)
                display.print(val_line(0, m0, cfg.val_n))
            if best_failed:
                raise ReasonRLError(f"{best_failed[0]}; nothing was trained yet: free space, then start over with --overwrite")
        for step in range(start + 1, cfg.steps + 1):
            if best is not None and best.stop:
                break  # (a resumed run that had stopped early)
            rng, data = torch.get_rng_state(), collector.state()  # the state after the last step, should this one be dropped
            try:
                stop.begin_step()
                res = train_step(collector, learner, engine, step=step, prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
                                 on_short_batch=cfg.on_short_batch, perf=perf, before_update=stop.commit)
            except StepAbandoned:  # (a signal while collecting: nothing but the data position and the RNG changed)
                torch.set_rng_state(rng)
                collector.load(data)
                progress.abandoned = step
                if progress.finished > progress.saved and not bad_steps:
                    display.status("save checkpoint")
                    save_checkpoint(out, progress.finished, policy_backend=policy_backend, critic_backend=critic_backend, tokenizer=tok,
                                    data_state=collector.state(), rank=rank, world=world, keep_last=cfg.keep_last,
                                    val_state=best.state() if best is not None else None, learner_state=learner.state())
                    progress.saved, progress.written = progress.finished, True
                break
            m = res.metrics
            bad_steps = bad_steps + 1 if res.bad_step else 0
            last = step
            per_problem = {}
            if validator is not None and (step % cfg.val_every == 0 or step == cfg.steps):
                per_problem = validate(step, m)
            early = best is not None and best.stop  # (--early-stop-patience)
            history.append(m)
            bar.advance()
            if rank == 0:
                runlog.append(m)  # metrics.jsonl, then the trackers
                log_validation(step, per_problem)
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

                    write_rollouts(out / "rollouts" / f"step_{step}.parquet", res.samples, step=step)
            progress.finished = step
            if bad_steps >= cfg.max_bad_steps:
                raise ReasonRLError(divergence_message(step, m, bad_steps, cfg, latest_checkpoint(out)))
            stopping = stop.requested()  # (every rank: the same answer)
            if ((cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps or stopping or early or best_failed) and not bad_steps:
                display.status("save checkpoint")
                save_checkpoint(out, step, policy_backend=policy_backend, critic_backend=critic_backend, tokenizer=tok,
                                data_state=collector.state(), rank=rank, world=world, keep_last=cfg.keep_last,
                                val_state=best.state() if best is not None else None, learner_state=learner.state())
                progress.saved, progress.written = step, stopping
            if best_failed:  # (its checkpoint written first, whatever --save-every: no trained step is lost)
                kept = (f"step {step} is checkpointed: free space, then --resume (it writes best/ from checkpoints/step_{step})" if progress.saved == step
                        else f"the last checkpoint is {latest_checkpoint(out)}: free space, then --resume")
                raise ReasonRLError(f"{best_failed[0]}; {kept}")
            if early and rank == 0:
                display.print(f"early stop at step {step}: {cfg.save_best} has not beaten {best.value:.4f} (step {best.step}) "
                              f"in {best.since} validations (--early-stop-patience)")
            if stopping or early:
                break
    finally:
        stop.closing()  # (signals are ignored from here on: closing, then the one line or the final outputs)
        display.stop()
        runlog.close()
        scorer.close()
        engine.close()
    if stop.signum and progress.finished < cfg.steps:  # (a stop agreed at the last step's end: the run just finishes)
        raise Interrupted(stop.signum, stop_message(cfg, stop.signum, progress), quiet=rank != 0)
    progress.phase = "final"
    if rank == 0:
        final = latest_checkpoint(out)
        end = last if best is not None and best.stop else cfg.steps
        if final is None or final.name != f"step_{end}":
            raise ReasonRLError(no_update_message(end, history[-1] if history else {}, final))
        with run.writing(("policy", "summary.json")):
            if (out / "policy").exists():
                shutil.rmtree(out / "policy")
            if lora is None:
                shutil.copytree(final / "policy", out / "policy")
            else:  # merged from the base and the final checkpoint's adapter; the adapter in policy/adapter/
                L.merge_checkpoint(policy_dir, final / "policy", out / "policy", tok)
            # (a resumed run whose last step was already checkpointed ran no step: its last record is on disk)
            summary = {"steps": end, "last": flatten_metrics(history[-1] if history else last_record(out / "metrics.jsonl", end))}
            if best is not None:
                summary["best"] = best.state()
                summary["early_stopped"] = best.stop
            prompts = {"prompts": len(rows), **({"rollouts_filter": rated.as_dict()} if rated is not None else {}),
                       **({"retired_solved": len(stream.retired)} if cfg.skip_solved_epochs else {})}
            summary["prompts"] = prompts
            write_json(out / "summary.json", summary)
            write_manifest(out, "train", to_dict(cfg), {"data": cfg.data, "policy": str(policy_dir), "critic": str(cdir) if cdir else None,
                                                        "rollouts": cfg.rollouts or None},
                           extra={"algo": dataclasses.asdict(spec), "reward": reward, "prompts": prompts, "outputs": ["policy/", *(["policy/adapter/"] if lora is not None else []), "metrics.jsonl", *(["validation.jsonl"] if cfg.val_every else []),
                                                                                "checkpoints/", "summary.json",
                                                                                *(["best/"] if best is not None and best.step is not None else [])]})
    if world > 1:
        torch.distributed.barrier()
    return {"history": history, "out": str(out)}
