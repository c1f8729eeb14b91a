"""One training step, top to bottom in the papers' order.

collect (rollout → rule reward + soft overlong punishment → dynamic sampling) → prepare (old
log-probs, values) → advantages → updates (critic, then policy) → sync the new weights into the
engine → metrics. Checkpointing is the caller's (``reasonrl.stages.train``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from reasonrl.progress import status
from reasonrl.train.collector import Collected, Collector
from reasonrl.train.learner import Learner
from reasonrl.train.metrics import position_metrics, rollout_metrics


def train_step(collector: Collector, learner: Learner, engine: Any, *, step: int, prompts_per_step: int, group_size: int) -> dict[str, Any]:
    """Run one step; returns its metrics (``_samples``: every generated response, for --keep-rollouts)."""
    t_step = time.perf_counter()
    m: dict[str, Any] = {"step": step}

    # 1. Collect: each rank generates its share of the global prompts_per_step.
    status(f"step {step}: generate + score")
    col = collector.collect(math.ceil(prompts_per_step / learner.world))
    agree_on_batch(col, learner.world)
    if not col.groups:
        m.update(rollout_metrics(col, None))
        m["actor/skipped_update"] = 1
        if learner.policy_backend is not None:
            learner.policy_backend.scheduler_step()
        m["_samples"] = col.generated
        return m

    # 2. Prepare: old log-probs (and values, reference log-probs) under the current weights.
    status(f"step {step}: prepare (old log-probs, values)")
    t0 = time.perf_counter()
    st = learner.prepare(col.groups)
    m["perf/prepare_s"] = time.perf_counter() - t0
    # 3. Advantages.
    learner.advantages(st, group_size=group_size)
    m.update(rollout_metrics(col, st))
    # 4. Updates: the critic, then the policy.
    if learner.critic_backend is not None:
        status(f"step {step}: update critic")
        t1 = time.perf_counter()
        m.update(learner.update_critic(st))
        learner.critic_backend.scheduler_step()
        m["perf/update_critic_s"] = time.perf_counter() - t1
    status(f"step {step}: update actor")
    t1 = time.perf_counter()
    m.update(learner.update_policy(st))
    learner.policy_backend.scheduler_step()
    m["perf/update_actor_s"] = time.perf_counter() - t1
    m.update(position_metrics(st))
    n_tok = int(st.batch.attention_mask.sum())
    m["perf/train_tokens"] = n_tok
    m["perf/train_tokens_per_s"] = n_tok * learner.epochs / max(time.perf_counter() - t0, 1e-9)  # tokens through the policy update per second

    # 5. Sync: the new policy weights into the generation engine.
    status(f"step {step}: sync weights")
    t0 = time.perf_counter()
    engine.update_weights(learner.policy_backend.full_state_dict())
    m["perf/weight_sync_s"] = time.perf_counter() - t0
    m["perf/step_s"] = time.perf_counter() - t_step
    m["_samples"] = col.generated
    return m


def agree_on_batch(col: Collected, world: int) -> None:
    """Every rank must make the same number of updates: keep the smallest kept count."""
    if world <= 1:
        return
    n = torch.tensor([len(col.groups)], dtype=torch.long)
    torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MIN)
    col.groups = col.groups[: int(n)]
