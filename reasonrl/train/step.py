"""One training step, top to bottom in the papers' order.

collect (rollout → rule reward + soft overlong punishment → dynamic sampling) → prepare (old
log-probs, values) → advantages → updates (critic, then policy) → sync the new weights into the
engine → metrics. Checkpointing is the caller's (``reasonrl.stages.train``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from reasonrl.errors import ReasonRLError
from reasonrl.perf import peak_memory, timed
from reasonrl.rollouts import Sample
from reasonrl.train.collector import Collection, Collector
from reasonrl.progress import status
from reasonrl.train.learner import Learner
from reasonrl.train.step_metrics import position_metrics, rollout_metrics


@dataclass
class StepResult:
    """One step's outcome: the metrics it logs, every response it generated (kept or not, for
    --keep-rollouts; with partial rollouts, every response finished in it), and the flags the
    caller acts on (each also logged as a metric, value 1)."""

    metrics: dict[str, Any]
    samples: list[Sample]
    short_batch: bool = False  # collection hit its round cap with the batch not full (rollout/short_batch)
    collection: str = "dynamic sampling"  # what collected the batch (partial rollouts or dynamic sampling), for the short-batch message
    skipped_update: bool = False  # no update this step: nothing kept, or --on-short-batch skip (actor/skipped_update)
    bad_step: bool = False  # a loss or gradient norm was not finite: the backends made no optimizer step (actor/bad_step)


def train_step(collector: Collector, learner: Learner, engine: Any, *, step: int, prompts_per_step: int, group_size: int,
               on_short_batch: str = "train", perf: Any = None, before_update: Callable[[], None] | None = None) -> StepResult:
    """Run one step; returns its :class:`StepResult`.

    ``on_short_batch``: what to do when dynamic sampling hit its round cap before the batch was
    full (``StepResult.short_batch``): "train" on what was kept, "skip" the update, or "error".
    ``before_update``: called once the rollouts are collected, before anything changes the weights,
    the optimizer or the LR schedule (``reasonrl.interrupts.StepStop.commit``: it may abandon the step).
    """
    t_step = time.perf_counter()
    m: dict[str, Any] = {"step": step}

    # 1. Collect: rollout, reward (+ soft overlong punishment), dynamic sampling; all ranks as one
    #    step, each generating its share and training on an equal share of the kept groups.
    status(f"step {step}: generate + score")
    col = collector.collect(prompts_per_step, step=step)
    if before_update is not None:
        before_update()
    short = col.short and (collector.dynamic_sampling or col.kind is Collection.SEGMENTS)  # (partial rollouts: groups still going at the round cap)
    if short:
        m["rollout/short_batch"] = 1
        if on_short_batch == "error":
            raise ReasonRLError(f"step {step}: {col.label} kept {col.kept_groups} of {col.wanted} groups in {col.rounds} rounds: "
                                f"raise --max-gen-rounds{' or --oversample' if collector.dynamic_sampling else ''}, or pass --on-short-batch train|skip")
        if on_short_batch == "skip":  # (partial rollouts: the batch's finished groups wait for the next step, not lost)
            collector.keep_back(col)
            col.groups = []
    if not col.groups:
        m.update(rollout_metrics(col, None, collector.ranks))
        m["actor/skipped_update"] = 1
        learner.scheduler_step("policy")
        return StepResult(m, col.generated, short_batch=short, collection=col.label, skipped_update=True)

    # 2. Prepare: old log-probs (and values, reference log-probs) under the current weights. With
    #    one update per batch the old log-probs are the update's own forward, detached (Learner).
    status(f"step {step}: prepare (old log-probs, values)")
    t_train = time.perf_counter()
    with timed(m, "perf/prepare_s"):
        st = learner.prepare(col.groups, step=step)
    m["perf/old_logp_pass"] = 0.0 if st.old_from_update else 1.0
    # 3. Advantages.
    learner.advantages(st, group_size=group_size)
    # 4. Updates: the critic, then the policy.
    if learner.critic_backend is not None:
        status(f"step {step}: update critic")
        with timed(m, "perf/update_critic_s"):
            m.update(update_critic(learner, st))
    status(f"step {step}: update actor")
    with timed(m, "perf/update_actor_s"):
        m.update(learner.update_policy(st))
        learner.scheduler_step("policy")
    m.update(st.metrics)  # rollout/trainer mismatch, TIS
    m.update(rollout_metrics(col, st, collector.ranks))  # (entropy: of the old log-probs' forward)
    m.update(position_metrics(st))
    # Divergence guard: the backends made no optimizer step where the loss or the gradient norm was
    # not finite; the step is marked bad (the caller counts bad steps in a row and stops).
    watched = [m.get(k, 0.0) for k in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm")]
    bad = not all(math.isfinite(float(v)) for v in watched)
    if bad:
        m["actor/bad_step"] = 1
    n_tok = int(st.batch.attention_mask.sum())
    m["perf/train_tokens"] = n_tok
    m["perf/train_tokens_per_s"] = n_tok * learner.epochs / max(time.perf_counter() - t_train, 1e-9)  # tokens through the policy update per second

    # 5. Sync: the new policy weights into the generation engine.
    status(f"step {step}: sync weights")
    with timed(m, "perf/weight_sync_s"):
        engine.update_weights(learner.engine_weights())  # (LoRA: the merged linear layers)
    m["perf/step_s"] = time.perf_counter() - t_step
    m.update(peak_memory())
    m.update(perf.metrics(m) if perf is not None else {})  # each phase's share of its bound, MFU (reasonrl.perf.StepPerf)
    return StepResult(m, col.generated, short_batch=short, collection=col.label, bad_step=bad)


def value_step(collector: Any, learner: Learner, *, step: int, prompts_per_step: int, group_size: int, source: str = "generate + score") -> dict[str, Any] | None:
    """One step of value pretraining (``reasonrl pretrain-value``): :func:`train_step` without the
    policy, which stays fixed (the engine samples it, nothing scores it): collect (no dynamic
    sampling; ``collector`` may replay saved responses, ``source`` says which for the status),
    prepare (the critic's values), advantages, the critic's update. Returns the step's metrics
    (rollout/ and critic/, global; the by-position picture, this rank's share), or None when nothing
    was collected (the LR schedule still counts the step)."""
    status(f"value step {step}: {source}")
    col = collector.collect(prompts_per_step, step=step, dynamic=False)  # an equal share on every rank
    if not col.groups:
        learner.scheduler_step("critic")
        return None
    status(f"value step {step}: values + update critic")
    st = learner.prepare(col.groups, step=step)
    learner.advantages(st, group_size=group_size)
    m = {"step": step, **rollout_metrics(col, None, collector.ranks), **update_critic(learner, st)}
    m.update(position_metrics(st))
    return m


def update_critic(learner: Learner, st: Any) -> dict[str, Any]:
    """The critic's updates over the step's batch, then its LR schedule's step (train and pretrain-value alike)."""
    m = learner.update_critic(st)
    learner.scheduler_step("critic")
    return m
