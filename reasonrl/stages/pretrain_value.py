"""`reasonrl pretrain-value`: VC-PPO value pretraining with the policy fixed.

Sample G responses per prompt from the fixed initial policy, reward them, compute λ = 1 targets
(Monte-Carlo returns with γ = 1), and train only the value model for N steps. Before and after, on a
fixed held-out batch, record the value loss, explained variance and the mean value and advantage
by token position: the initialisation bias that VC-PPO removes (early tokens valued low, a
positive advantage bias growing toward the start of a response). The held-out batch comes from the
prepared data's validation split; without one it is drawn from the training rows and the picture
is labelled "in-sample".

Offline, as the paper has it (``--rollouts DIR``): the critic learns from a `reasonrl rollout`
artifact's responses, with their saved rewards, and no engine is built. The artifact must have been
sampled by this ``--model`` (its manifest records the policy's weights sha256; ``--allow-other-policy``
overrides). ``--eval-prompts`` of its prompts (a seeded draw) are held out for the bias picture; the
others are served ``--prompts-per-step`` groups a step, epoch after epoch (``--epochs E`` sets the
steps to E passes over them). The sampling options are the artifact's; ``--data`` is not read.

Backends as ``train``: one process (torch), or ``--backend deepspeed --zero 2|3 [--offload]`` under
torchrun, each rank on its GPU when there is one. ``prompts_per_step`` and ``mini_batch_size`` are
global (each rank generates and trains on its share); the held-out batch is generated in shares and
gathered, so every rank computes the same picture over all of it; rank 0 writes the outputs. Only
the critic is loaded for training: the policy is sampled by the engine and never scored here.

SIGTERM / SIGINT stop it at once (``reasonrl.interrupts``): the engine, reward workers and trackers
are closed, no manifest is written (``train`` refuses the directory), one line says to rerun. It keeps
no checkpoints, so there is nothing to resume: the stage is short next to ``train``, and a critic
trained for part of its steps is not the one asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reasonrl import algos as A
from reasonrl.artifacts import write_json, write_manifest
from reasonrl.config import SEED_MAX, check, opt, to_dict
from reasonrl.interrupts import last_write
from reasonrl.rundir import open_output, releases_claims
from reasonrl.tracking.base import TRACKER_OUTPUTS
from reasonrl.stages.options import BackendOpts, LoraOpts, ModelOpts, OptimOpts, RolloutOpts, ScheduleOpts, TrackOpts


#: What `pretrain-value` writes in its directory (a rerun removes them first; the manifest comes last).
OUTPUTS = ("critic", "metrics.jsonl", "bias.json", "summary.json", *TRACKER_OUTPUTS)


@dataclass
class PretrainValueConfig(BackendOpts, LoraOpts, ModelOpts, OptimOpts, RolloutOpts, ScheduleOpts, TrackOpts):
    data: str = opt("runs/data", "Prepared data directory (output of `reasonrl prepare-data`).")
    out: str = opt("runs/critic", "Output directory: critic/ (HF directory; with --lora-rank the merged critic, and its adapter in critic/adapter/), metrics.jsonl, bias.json, manifest.json.")
    critic_init: str | None = opt(None, "Initialise the value model from this directory or hub name ORG/NAME[@REVISION] (e.g. a reward model); default: the policy's backbone.")
    steps: int = opt(20, "Value-training steps (each on freshly sampled responses). More is not always better: it overfits.")
    prompts_per_step: int = opt(16, "Prompts sampled per step over all processes (× group_size responses).")
    weight_decay: float = opt(0.0, "AdamW weight decay.")
    lam_actor: float = opt(A.ALGOS["vcppo"].lam_actor, "λ used for the advantage-by-position picture (the actor's λ in vcppo).")
    eval_prompts: int = opt(8, "Held-out prompts for the before/after bias picture (from the validation split; without one, from the training rows, labelled in-sample; with --rollouts, a seeded draw of its prompts, kept out of training).")
    rollouts: str = opt("", "Train on a `reasonrl rollout` directory's saved responses and rewards (VC-PPO's offline pretraining on a fixed policy's responses) instead of sampling: no engine is built, --data is not read.")
    epochs: int | None = opt(None, "With --rollouts: passes over its training prompts; sets --steps to ceil(epochs × prompts / prompts_per_step).")
    allow_other_policy: bool = opt(False, "With --rollouts: accept responses sampled by another policy than --model (the critic then learns that policy's values, not this one's).")
    overwrite: bool = opt(False, "Replace a finished output directory.")

    def __post_init__(self) -> None:
        self._check_model()
        self._check_rollout()
        self._check_tracking()
        check(self.steps >= 0, "steps must be >= 0")
        check(self.temperature > 0, "temperature must be > 0: value pretraining samples the policy's responses (greedy would repeat one)")
        check(self.prompts_per_step >= 1, "prompts_per_step must be >= 1")
        check(self.micro_batch_size <= self.mini_batch_size, "micro_batch_size cannot exceed mini_batch_size")
        check(self.critic_lr > 0, "critic_lr must be > 0")
        self._check_schedule()
        self._check_lora()
        check(0 <= self.lam_actor <= 1, "lam_actor must be in [0, 1]")
        check(self.eval_prompts >= 1, "eval_prompts must be >= 1")
        check(self.epochs is None or self.epochs >= 1, "epochs must be >= 1")
        check(self.epochs is None or bool(self.rollouts), "--epochs counts passes over saved responses: give --rollouts DIR too (without it, --steps counts sampled steps)")
        check(bool(self.rollouts) or not self.allow_other_policy, "--allow-other-policy only applies with --rollouts DIR")
        self._check_backend(self.mini_batch_size, self.micro_batch_size)


def value_spec(lam_actor: float) -> A.AlgoSpec:
    """The row value pretraining runs: vcppo's critic (λ_critic = 1: Monte-Carlo returns), the
    actor's λ only for the advantage picture, no filtering or shaping of the rewards."""
    return dataclasses.replace(A.get_algo("vcppo"), lam_actor=lam_actor, lam_critic=1.0, whiten_advantages=False,
                               dynamic_sampling=False, overlong_filter=False, overlong_penalty=False)


def held_out_rows(data: str, n: int) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``n`` rows of the validation split and False; without validation rows (a data directory
    without them, or a single verl parquet file), the first ``n`` training rows and True (in-sample)."""
    from reasonrl.data import load_prepared
    from reasonrl.errors import MissingArtifactError
    from reasonrl.models.hub import is_hub_data
    from reasonrl.train.run import training_rows

    if is_hub_data(data) and not Path(data).exists():  # (one split of a hub dataset: nothing held out beside it)
        return training_rows(data)[:n], True
    try:
        val = [] if Path(data).is_file() else load_prepared(data, "validation")
    except MissingArtifactError:
        val = []
    return (val[:n], False) if val else (load_prepared(data, "train")[:n], True)


def saved_rollouts(cfg: PretrainValueConfig, policy_dir: Path) -> Any:
    """``--rollouts``' artifact, checked: sampled by ``policy_dir``'s weights (or --allow-other-policy),
    scored with --reward's reward (when one other than the default is given), with more prompts than
    --eval-prompts holds out."""
    from reasonrl.artifacts import hash_weights
    from reasonrl.errors import ReasonRLError
    from reasonrl.rollouts import load_rollout_artifact

    art = load_rollout_artifact(cfg.rollouts, option="--rollouts")
    sampler = art.policy
    if not cfg.allow_other_policy:
        if not sampler.get("weights_sha256"):
            raise ReasonRLError(f"--rollouts {art.path} does not record which policy sampled it (made by an older reasonrl): "
                                "rerun `reasonrl rollout`, or pass --allow-other-policy")
        mine = hash_weights(policy_dir)
        if mine != sampler["weights_sha256"]:
            raise ReasonRLError(f"--rollouts {art.path} was sampled by {sampler.get('path')} (weights {sampler['weights_sha256'][:12]}…), not by "
                                f"--model {cfg.model} ({(mine or 'no local weights')[:12]}…): VC-PPO pretrains the critic on its own policy's responses; "
                                "pass the --model that sampled them, or --allow-other-policy")
    if cfg.reward != "math" and cfg.reward != art.reward.get("spec"):
        raise ReasonRLError(f"--rollouts {art.path} was scored with the reward {art.reward.get('spec')!r}, and its saved rewards are the ones "
                            f"learned from: drop --reward {cfg.reward} (or sample new rollouts with it)")
    if len(art.groups) <= cfg.eval_prompts:
        raise ReasonRLError(f"--rollouts {art.path} has {len(art.groups)} prompts and --eval-prompts holds out {cfg.eval_prompts}: "
                            "lower --eval-prompts or sample rollouts of more prompts")
    return art


def split_saved(groups: list[Any], held: int, seed: int) -> tuple[list[Any], list[Any]]:
    """(training groups, held-out groups): ``held`` groups of a seeded draw held out, the rest to
    train on; each part in its saved order, with group ids 0.. (the by-position picture and the
    held-out gather order by them)."""
    import random

    order = list(range(len(groups)))
    random.Random(seed).shuffle(order)
    out = ([groups[i] for i in sorted(order[held:])], [groups[i] for i in sorted(order[:held])])
    return tuple([[dataclasses.replace(s, group=g) for s in grp] for g, grp in enumerate(part)] for part in out)  # type: ignore[return-value]


def _all_groups(groups: list[Any], ranks: Any) -> list[Any]:
    """Every rank's share of the kept groups, on every rank, in draw order (padding copies left out)."""
    return sorted((g for part in ranks.gather(groups) for g in part if not g[0].pad), key=lambda g: g[0].group)


def _picture(learner: Any, st: Any, group_size: int) -> dict[str, Any]:
    from reasonrl.train.step_metrics import position_metrics

    learner.advantages(st, group_size=group_size)
    vl, _ = A.value_loss(st.values, st.values, st.returns, st.batch.valid)
    pos = position_metrics(st)
    m = {"value_by_position": pos["critic/value_by_position"], "advantage_by_position": pos["actor/advantage_by_position"],
         "explained_variance": pos["critic/explained_variance"]}
    m["value_loss"] = float(vl)
    m["value_mean"] = float(A.masked_mean(st.values, st.batch.valid))
    m["advantage_mean"] = float(A.masked_mean(st.advantages, st.batch.valid))
    return m


@dataclass
class ValueData:
    """Where value pretraining's responses come from: ``--rollouts``' saved groups (``art``; no
    engine), or ``--data``'s rows sampled by the engine; and its held-out batch."""

    steps: int
    group_size: int
    in_sample: bool
    reward: dict[str, Any]
    art: Any = None
    saved: list[Any] = dataclasses.field(default_factory=list)  # (offline) the groups trained on, and the held-out ones
    held_saved: list[Any] = dataclasses.field(default_factory=list)
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # (sampled) the training rows, and the held-out ones
    held_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def value_data(cfg: PretrainValueConfig, policy_dir: Path) -> ValueData:
    """``cfg``'s :class:`ValueData`, checked (nothing is written yet)."""
    from reasonrl.train.run import training_rows

    if cfg.rollouts:  # offline: the artifact's responses; no data, engine or scorer
        art = saved_rollouts(cfg, policy_dir)
        saved, held_saved = split_saved(art.groups, cfg.eval_prompts, cfg.seed)
        steps = math.ceil(cfg.epochs * len(saved) / cfg.prompts_per_step) if cfg.epochs else cfg.steps
        group_size = int(art.manifest.get("config", {}).get("group_size") or len(saved[0]))
        return ValueData(steps, group_size, False, art.reward, art=art, saved=saved, held_saved=held_saved)
    rows = training_rows(cfg.data)
    held_rows, in_sample = held_out_rows(cfg.data, cfg.eval_prompts)
    return ValueData(cfg.steps, cfg.group_size, in_sample, cfg.reward_record(), rows=rows, held_rows=held_rows)


def value_collectors(cfg: PretrainValueConfig, data: ValueData, *, spec: A.AlgoSpec, tokenizer: Any, policy_dir: Path, ranks: Any) -> tuple[Any, Any, list[Any], str]:
    """(the steps' collector, the held-out batch's (None: ``data.held_saved`` is it), what to close
    after, the held-out batch's label); the engine on the fixed policy when the responses are sampled."""
    from reasonrl.engines.registry import make_engine
    from reasonrl.rewards import RewardScorer
    from reasonrl.train.collector import DataStream, Replay
    from reasonrl.train.run import make_collector

    if data.art is not None:
        return Replay(data.saved, cfg.seed, ranks), None, [], f"held-out: {len(data.held_saved)} prompts of the rollouts, not trained on"
    engine = make_engine(cfg, str(policy_dir), seed=(cfg.seed + ranks.rank) % (SEED_MAX + 1), max_model_len=cfg.max_prompt_len + cfg.max_response_len,
                         decode_steps=cfg.steps * cfg.max_response_len)
    scorer = RewardScorer(reward=cfg.reward)
    collector, held = (make_collector(cfg, spec=spec, engine=engine, tokenizer=tokenizer, scorer=scorer, stream=DataStream(r, cfg.seed), ranks=ranks,
                                      overlong_cache_len=0) for r in (data.rows, data.held_rows))
    label = "in-sample: no validation split, drawn from the training rows" if data.in_sample else "held-out: the validation split"
    return collector, held, [scorer, engine], label


def value_model(init_dir: Path, lora: Any, *, seed: int) -> Any:
    """The value model to train, initialised from ``init_dir``; with ``lora`` (LoraSettings) an
    adapter on the backbone, the value head trained in full."""
    from reasonrl.devices import default_device
    from reasonrl.models.value import new_value_model

    critic = new_value_model(init_dir, seed=seed).to(default_device())
    if lora is not None:
        from reasonrl.models.lora import apply_lora

        critic = apply_lora(critic, lora, seed=seed, base_path=init_dir, critic=True)
    return critic


def held_out_groups(held: Any, data: ValueData, ranks: Any) -> list[Any]:
    """The held-out batch, every rank's share on every rank: the saved held-out groups, or generated
    and scored by ``held`` (at step 0: training steps are 1..N)."""
    from reasonrl.progress import status

    if held is None:
        return data.held_saved
    status("held-out batch: generate + score")
    return _all_groups(held.collect(len(data.held_rows), step=0, dynamic=False).groups, ranks)


@releases_claims
def run_pretrain_value(cfg: PretrainValueConfig, console: Any = None) -> dict[str, Any]:
    from rich.console import Console

    from reasonrl.devices import resolve_dtype
    from reasonrl.models.loading import check_weights, load_tokenizer
    from reasonrl.models.lora import trainable_line
    from reasonrl.progress import Display, status
    from reasonrl.tracking import RunLog
    from reasonrl.train.backend import save_policy
    from reasonrl.train.ranks import Ranks
    from reasonrl.train.run import make_backend, make_learner, start_ranks
    from reasonrl.train.step import value_step
    from reasonrl.train.step_metrics import flatten_metrics

    console = console or Console(stderr=True)
    policy_dir = cfg.policy_dir()
    data = value_data(cfg, policy_dir)
    art, steps = data.art, data.steps
    init_dir = check_weights(cfg.critic_init, cfg.allow_pickle, what="--critic-init") if cfg.critic_init else policy_dir
    lora = cfg.lora_settings()
    if lora is not None:
        from reasonrl.models.lora import check_targets

        check_targets(init_dir, lora, critic=True)  # (before anything is written)
    rank, world = start_ranks(cfg)
    ranks = Ranks(rank, world)
    out = Path(cfg.out)
    run = None
    if rank == 0:  # rank 0 holds the output directory for the whole job
        run = open_output(out, stage="pretrain-value", outputs=OUTPUTS, overwrite=cfg.overwrite, inputs=(art.path if art else cfg.data, policy_dir, init_dir))
    if world > 1:
        torch.distributed.barrier()
    torch.manual_seed(cfg.seed)
    dtype = resolve_dtype(cfg.dtype)
    tok = load_tokenizer(policy_dir)
    critic = value_model(init_dir, lora, seed=cfg.seed)
    critic_backend = make_backend(cfg, critic, cfg.critic_lr, dtype, steps)
    spec = value_spec(cfg.lam_actor)
    collector, held, closing, label = value_collectors(cfg, data, spec=spec, tokenizer=tok, policy_dir=policy_dir, ranks=ranks)
    source = f"{len(data.saved)} prompts × {data.group_size} saved responses of {art.path}" if art is not None else f"{len(data.rows)} prompts"
    learner = make_learner(cfg, spec=spec, tokenizer=tok, dtype=dtype, ranks=ranks, critic_backend=critic_backend)
    display = Display(console, quiet=cfg.quiet or rank != 0)
    say = display.print if rank == 0 else (lambda *a, **k: None)
    history: list[dict[str, Any]] = []
    bar = display.bar("pretrain-value", steps, unit="value steps")
    runlog = RunLog(out, cfg.report_to, name=str(out), config=to_dict(cfg), rank=rank, then="the run stops (no manifest): rerun `reasonrl pretrain-value`")
    try:
        display.start()
        held_groups = held_out_groups(held, data, ranks)
        status("held-out batch: values before pretraining")
        before = _picture(learner, learner.prepare(held_groups), data.group_size)
        say(f"[bold]pretrain-value[/] on {policy_dir} ({source}, backend {cfg.backend} ×{world}) | bias picture {label} | "
            f"before: value loss {before['value_loss']:.4f}, explained variance {before.get('explained_variance', 0):.3f}"
            + (f" | {trainable_line(critic)}, the value head in full" if lora is not None else ""))
        for step in range(1, steps + 1):
            m = value_step(collector, learner, step=step, prompts_per_step=cfg.prompts_per_step, group_size=data.group_size,
                           source="saved responses" if art is not None else "generate + score")
            if m is not None:
                history.append(m)
                runlog.append(m)  # metrics.jsonl, then the trackers (rank 0)
                say(f"value step {step}/{steps} | vf_loss {m.get('critic/vf_loss', float('nan')):.4f} | "
                    f"explained var {m.get('critic/explained_variance', float('nan')):.3f} | acc {m.get('rollout/acc_mean', 0):.3f}")
            bar.advance()
        status("held-out batch: values under the trained critic")
        after = _picture(learner, learner.prepare(held_groups), data.group_size)  # values under the trained critic, same responses
    finally:
        display.stop()
        runlog.close()
        for c in closing:
            c.close()
    with run.writing(OUTPUTS) if run is not None else contextlib.nullcontext():
        save_policy(critic_backend, out / "critic", tok)  # every rank: ZeRO-3 gathers the shards (LoRA: merged, critic/adapter/ the adapter)
        summary = {"steps": steps, "before": flatten_metrics(before), "after": flatten_metrics(after), "last": flatten_metrics(history[-1]) if history else {}}
        if rank == 0:
            write_outputs(cfg, out, data, summary, before, after, held_groups, policy_dir=policy_dir, lora=lora is not None, world=world)
    say(f"critic → {out / 'critic'} | {'in-sample' if data.in_sample else 'held-out'} value loss {before['value_loss']:.4f} → {after['value_loss']:.4f}, "
        f"explained variance {before.get('explained_variance', 0):.3f} → {after.get('explained_variance', 0):.3f}")
    if world > 1:
        torch.distributed.barrier()
    return summary


def write_outputs(cfg: PretrainValueConfig, out: Path, data: ValueData, summary: dict[str, Any], before: dict[str, Any], after: dict[str, Any],
                  held_groups: list[Any], *, policy_dir: Path, lora: bool, world: int) -> None:
    """bias.json, summary.json (``summary``, with the rollouts' counts when it learned from them) and the manifest (rank 0)."""
    art, steps = data.art, summary["steps"]
    bias = {"before": before, "after": after, "held_out": "in-sample" if data.in_sample else ("rollouts" if art is not None else "validation"),
            "held_out_prompts": len(held_groups), "held_out_responses": sum(len(g) for g in held_groups)}
    if art is not None:
        summary["rollouts"] = {"path": str(art.path), "prompts": len(data.saved), "held_out_prompts": len(data.held_saved),
                               "responses": sum(len(g) for g in data.saved), "epochs": round(steps * cfg.prompts_per_step / len(data.saved), 3),
                               "sampled_by": art.policy}
        bias["rollouts"] = str(art.path)
    write_json(out / "bias.json", bias)
    write_json(out / "summary.json", summary)
    inputs = {"rollouts": str(art.path)} if art is not None else {"data": cfg.data}
    with last_write():  # (a SIGTERM or Ctrl-C from here on is only noted: the run is finished, exit 0)
        write_manifest(out, "pretrain-value", to_dict(cfg), {**inputs, "policy": str(policy_dir)},
                       extra={"outputs": ["critic/", *(["critic/adapter/"] if lora else []), "metrics.jsonl", "bias.json"], "world_size": world,
                              "reward": data.reward, "steps": steps, **({"sampled_by": art.policy} if art is not None else {})})
