"""A step's tensors and the no-grad passes that fill them.

:func:`step_tensors` lays the kept groups out as one batch (``reasonrl.train.batch``) with empty
tensors for what the passes compute; :func:`no_grad_passes` runs the policy (old log-probs and
entropy), the reference (its log-probs) and the critic (values) over it, micro-batch by micro-batch
in group order, under the current weights; :func:`off_policy` measures the rollout/trainer gap
and makes the TIS weights from the old log-probs. ``Learner.prepare`` calls them in that order; with
one update per batch the policy's part is the update's own forward (``reasonrl.train.learner``),
which fills the same tensors through :meth:`StepTensors.record_policy`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from reasonrl import algos as A
from reasonrl.devices import autocast_ctx
from reasonrl.rollouts import Sample
from reasonrl.train.batch import Batch, build_batch, pass_mode, response_logits, response_values
from reasonrl.train.ranks import Ranks


@dataclass
class StepTensors:
    """Everything the updates need for one step's batch (B responses, T response tokens)."""

    batch: Batch
    old_logp: torch.Tensor  # (B, T)
    entropy: torch.Tensor  # (B, T)
    rewards: torch.Tensor  # (B,) shaped rewards
    correct: torch.Tensor  # (B,) bool
    sampler_logp: torch.Tensor  # (B, T) the engine's log-probs of the sampled tokens
    values: torch.Tensor | None = None  # (B, T)
    ref_logp: torch.Tensor | None = None  # (B, T)
    is_weights: torch.Tensor | None = None  # (B, T) truncated importance-sampling weights (tis_cap)
    advantages: torch.Tensor | None = None  # (B, T)
    returns: torch.Tensor | None = None  # (B, T)
    metrics: dict[str, float] = field(default_factory=dict)  # rollout/trainer mismatch, TIS
    group: torch.Tensor | None = None  # (B,) each row's group (rows of a group share the prompt)
    old_from_update: bool = False  # old_logp / entropy / metrics are filled by update_policy's forward

    def record_policy(self, idx: list[int], logp: torch.Tensor, entropy: torch.Tensor, valid: torch.Tensor) -> None:
        """Rows ``idx``' old log-probs and entropy, (len(idx), t) from a micro-batch's forward, zero
        off its valid tokens (the no-grad pass, or the fused update's forward)."""
        t = valid.shape[1]
        self.old_logp[idx, :t] = (logp * valid).cpu()
        self.entropy[idx, :t] = (entropy * valid).cpu()


def step_tensors(groups: list[list[Sample]], *, pad_id: int, overlong_filter: bool, values: bool, ref: bool,
                 old_from_update: bool) -> StepTensors:
    """The groups as one batch, their sampler log-probs, rewards and correctness; zeros for what the
    passes fill (old log-probs, entropy, and the ``values`` / ``ref`` log-probs when asked for).
    Padding copies get no valid token; truncated responses no loss token under ``overlong_filter``."""
    flat = [s for g in groups for s in g]
    loss_rows = [not (s.pad or (overlong_filter and s.truncated)) for s in flat]
    batch = build_batch([s.prompt_ids for s in flat], [s.response_ids for s in flat], pad_id=pad_id, loss_rows=loss_rows)
    batch.valid[torch.tensor([s.pad for s in flat], dtype=torch.bool)] = 0.0
    B, T = batch.response_ids.shape
    sampler_logp = torch.zeros(B, T)
    for i, smp in enumerate(flat):
        sampler_logp[i, : len(smp.logprobs)] = torch.tensor(smp.logprobs, dtype=torch.float32)
    rewards = torch.tensor([s.shaped_reward for s in flat], dtype=torch.float32)
    correct = torch.tensor([s.correct for s in flat], dtype=torch.bool)
    return StepTensors(batch, torch.zeros(B, T), torch.zeros(B, T), rewards, correct, sampler_logp,
                       values=torch.zeros(B, T) if values else None, ref_logp=torch.zeros(B, T) if ref else None,
                       group=torch.tensor([s.group for s in flat], dtype=torch.long), old_from_update=old_from_update)


@torch.no_grad()
def no_grad_passes(st: StepTensors, *, policy: torch.nn.Module | None, ref: torch.nn.Module | None, critic: torch.nn.Module | None,
                   sampling: A.Sampling, micros: list[list[int]], device: torch.device, dtype: str, forward_mode: str = "shared",
                   total: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
    """The forwards over the batch's ``micros`` (row indices, together every row once), of the models given: the policy's (old log-probs
    and entropy of the sampling distribution), the reference's (its log-probs), the critic's
    (values), each zero off the valid tokens, with the trainer's forward (``forward_mode``,
    ``reasonrl.train.batch``; ``auto``: one mode per model for the whole pass, by
    :func:`pass_mode` over every rank's micro-batches through ``total``). The policy and the
    critic run in eval mode."""
    models = [m for m in (policy, critic) if m is not None]
    for m in models:
        m.eval()
    auto = forward_mode == "auto"
    mbs = [st.batch.select(idx) for idx in micros] if auto else []  # (selected once, for the costs and the passes)
    policy_mode, ref_mode, critic_mode = (pass_mode(forward_mode, m, mbs, causal_lm=lm, total=total)
                                          for m, lm in ((policy, True), (ref, True), (critic, False)))
    for i, idx in enumerate(micros):
        mb = (mbs[i] if auto else st.batch.select(idx)).to(device)
        t = mb.T
        with autocast_ctx(dtype):
            if policy is not None:
                logits = response_logits(policy, mb, mode=policy_mode)
                logp = A.logprobs_from_logits(logits, mb.response_ids, sampling=sampling)
                st.record_policy(idx, logp, A.entropy_from_logits(logits, sampling=sampling, token_ids=mb.response_ids), mb.valid)
                del logits
            if ref is not None:
                ref_logits = response_logits(ref, mb, mode=ref_mode)
                st.ref_logp[idx, :t] = (A.logprobs_from_logits(ref_logits, mb.response_ids, sampling=sampling) * mb.valid).cpu()
            if critic is not None:
                st.values[idx, :t] = (response_values(critic, mb, mode=critic_mode) * mb.valid).cpu()
    for m in models:
        m.train()


def mismatch(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, ranks: Ranks) -> dict[str, float]:
    """``A.mismatch_metrics`` over every rank's loss tokens."""
    n = float(mask.bool().sum())
    local = A.mismatch_metrics(old_logp, sampler_logp, mask)
    sums = ranks.sum(torch.tensor([local["logprob_diff_mean"] * n, local["mismatch_kl"] * n, n], dtype=torch.float64)).tolist()
    top = float(ranks.max(torch.tensor(local["logprob_diff_max"], dtype=torch.float64)))
    total = sums[2] or 1.0
    return {"rollout/logprob_diff_mean": sums[0] / total, "rollout/logprob_diff_max": top, "rollout/mismatch_kl": sums[1] / total}


def off_policy(st: StepTensors, *, tis_cap: float | None, tis_level: str, ranks: Ranks) -> None:
    """Once every row's old log-probs are in: the rollout/trainer gap over the loss tokens, always;
    the TIS weights (and their metrics) when ``tis_cap`` is set."""
    st.metrics = mismatch(st.old_logp, st.sampler_logp, st.batch.mask, ranks)
    if tis_cap is not None:
        st.is_weights, tis = A.truncated_is_weights(st.old_logp, st.sampler_logp, st.batch.mask, cap=tis_cap, level=tis_level)
        st.metrics.update({f"actor/{k}": v for k, v in tis.items()})
