"""A step's tensors and the no-grad passes that fill them.

:func:`step_tensors` lays the kept groups out as one batch (``reasonrl.train.batch``) with empty
tensors for what the passes compute; :func:`no_grad_passes` runs the policy (old log-probs and
entropy), the reference (its log-probs) and the critic (values) over it, micro-batch by micro-batch
in group order, under the current weights; :func:`off_policy` measures the rollout/trainer gap
and makes the off-policy correction's weights from the old log-probs (:func:`correction`). ``Learner.prepare`` calls them in that order; with
one update per batch the policy's part is the update's own forward (``reasonrl.train.learner``),
which fills the same tensors through :meth:`StepTensors.record_policy`.

Where the old log-probs come from is decided once, in ``Learner.prepare``, and carried by the
step's tensors (``StepTensors.old``): :class:`OldFromPass` (the no-grad pass above) or
:class:`OldFromUpdate` (the update's own forward); the policy update asks it for each micro-batch's
old log-probs and tells it when a mini-batch was skipped and when the update is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

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
    is_weights: torch.Tensor | None = None  # (B, T) the off-policy correction's weights (tis_cap, rollout_correction, stale_correction)
    advantages: torch.Tensor | None = None  # (B, T)
    returns: torch.Tensor | None = None  # (B, T)
    metrics: dict[str, float] = field(default_factory=dict)  # rollout/trainer mismatch, off-policy diagnostics, correction
    group: torch.Tensor | None = None  # (B,) each row's group (rows of a group share the prompt)
    staleness: torch.Tensor | None = None  # (B, T) how many policy versions each token lags the step's (partial rollouts; None: none lags)
    old: OldSource = field(default_factory=lambda: OldFromPass())  # where the policy update's old log-probs come from

    @property
    def old_from_update(self) -> bool:
        """Whether old_logp / entropy / metrics are filled by the policy update's own forward."""
        return self.old.fused

    def record_policy(self, idx: list[int], logp: torch.Tensor, entropy: torch.Tensor, valid: torch.Tensor) -> None:
        """Rows ``idx``' old log-probs and entropy, (len(idx), t) from a micro-batch's forward, zero
        off its valid tokens (the no-grad pass, or the fused update's forward)."""
        t = valid.shape[1]
        self.old_logp[idx, :t] = (logp * valid).cpu()
        self.entropy[idx, :t] = (entropy * valid).cpu()


def step_tensors(groups: list[list[Sample]], *, pad_id: int, overlong_filter: bool, values: bool, ref: bool,
                 old: OldSource, step: int = 0, lagged: bool = False, mask_stale: bool = False) -> StepTensors:
    """The groups as one batch, their sampler log-probs, rewards and correctness; zeros for what the
    passes fill (old log-probs, entropy, and the ``values`` / ``ref`` log-probs when asked for);
    ``old``: where the policy update's old log-probs come from.
    Padding copies get no valid token; truncated responses no loss token under ``overlong_filter``.
    With ``lagged`` (the samples carry their tokens' policy versions: partial rollouts),
    ``staleness`` holds ``step`` minus each token's version (0 for a sample without versions);
    ``mask_stale``: the tokens that lag get no loss."""
    flat = [s for g in groups for s in g]
    loss_rows = [not (s.pad or (overlong_filter and s.truncated)) for s in flat]
    batch = build_batch([s.prompt_ids for s in flat], [s.response_ids for s in flat], pad_id=pad_id, loss_rows=loss_rows)
    batch.valid[torch.tensor([s.pad for s in flat], dtype=torch.bool)] = 0.0
    B, T = batch.response_ids.shape
    sampler_logp = torch.zeros(B, T)
    for i, smp in enumerate(flat):
        sampler_logp[i, : len(smp.logprobs)] = torch.tensor(smp.logprobs, dtype=torch.float32)
    staleness = None
    if lagged:
        staleness = torch.zeros(B, T)
        for i, smp in enumerate(flat):
            staleness[i, : len(smp.versions)] = step - torch.tensor(smp.versions, dtype=torch.float32)
        staleness *= batch.valid
        if mask_stale:
            batch.mask[staleness > 0] = 0.0
    rewards = torch.tensor([s.shaped_reward for s in flat], dtype=torch.float32)
    correct = torch.tensor([s.correct for s in flat], dtype=torch.bool)
    return StepTensors(batch, torch.zeros(B, T), torch.zeros(B, T), rewards, correct, sampler_logp,
                       values=torch.zeros(B, T) if values else None, ref_logp=torch.zeros(B, T) if ref else None,
                       group=torch.tensor([s.group for s in flat], dtype=torch.long), old=old, staleness=staleness)


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


def correction(spec: A.AlgoSpec, old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
               staleness: torch.Tensor | None) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The off-policy correction's weights for these rows (None: no weight) and its local metrics.

    Which applies: none in bypass mode (π_old := π_behaviour); ``tis_cap`` (today's token / sequence
    TIS, its ``actor/tis_…`` metrics); ``rollout_correction`` on every token; else, when the rows
    carry versions (partial rollouts, ``staleness``), ``stale_correction`` on the tokens sampled by an
    older policy (weights 1 elsewhere; 1 everywhere when none lags). Row-local: a micro-batch's
    weights are the batch's rows'."""
    if spec.correction_mode == "bypass":
        return None, {}
    if spec.tis_cap is not None:
        return A.truncated_is_weights(old_logp, sampler_logp, mask, cap=spec.tis_cap, level=spec.tis_level)
    name, scope = spec.rollout_correction, None
    if name is None:
        if staleness is None or spec.stale_correction is None:
            return None, {}
        name, scope = spec.stale_correction, staleness > 0
    w, m = A.rollout_correction(old_logp, sampler_logp, mask, name=name, cap=spec.correction_cap, low=spec.correction_low, scope=scope)
    return w.to(old_logp.dtype), m


def off_policy(st: StepTensors, *, spec: A.AlgoSpec, ranks: Ranks) -> None:
    """Once every row's old log-probs are in: the rollout/trainer gap over the loss tokens and the
    off-policy diagnostics (``A.offpolicy_diagnostics``, over every rank's tokens), always; the
    correction's weights and metrics (:func:`correction`) when one applies."""
    st.metrics = mismatch(st.old_logp, st.sampler_logp, st.batch.mask, ranks)
    d = A.offpolicy_diagnostics(st.old_logp, st.sampler_logp, st.batch.mask)
    tok, seq = ["k1", "k1_seq", "k3_seq", "chi2", "chi2_seq", "mult_prob_error"], ["k1_seq", "k3_seq", "chi2_seq"]
    sums = ranks.sum(torch.tensor([d[k] * d["sequences" if k in seq else "tokens"] for k in tok] + [d["tokens"], d["sequences"]],
                                  dtype=torch.float64)).tolist()
    n_tok, n_seq = sums[-2] or 1.0, sums[-1] or 1.0
    names = {"k1": "mismatch_k1", "k1_seq": "mismatch_k1_seq", "k3_seq": "mismatch_k3_seq", "chi2": "mismatch_chi2",
             "chi2_seq": "mismatch_chi2_seq", "mult_prob_error": "token_mult_prob_error"}
    for k, v in zip(tok, sums):
        st.metrics[f"rollout/{names[k]}"] = v / (n_seq if k in seq else n_tok)
    st.metrics["rollout/mismatch_ratio_max"] = float(ranks.max(torch.tensor(d["ratio_max"], dtype=torch.float64)))
    st.is_weights, cm = correction(spec, st.old_logp, st.sampler_logp, st.batch.mask, st.staleness)
    if "tis_weight_mean" in cm:  # (tis_cap: today's metrics, this rank's)
        st.metrics.update({f"actor/{k}": v for k, v in cm.items()})
    elif cm:  # over every rank's tokens in the correction's scope
        keys = ["weight_mean", "masked_frac", "truncated_frac"]
        n_in = cm["scope_frac"] * float(st.batch.mask.bool().sum())
        tot = ranks.sum(torch.tensor([cm[k] * n_in for k in keys] + [n_in, float(st.batch.mask.bool().sum())], dtype=torch.float64)).tolist()
        st.metrics.update({f"actor/correction_{k}": v / (tot[-2] or 1.0) for k, v in zip(keys, tot)})
        st.metrics["actor/correction_weight_mean"] = tot[0] / tot[-2] if tot[-2] else 1.0
        st.metrics["actor/correction_scope_frac"] = tot[-2] / (tot[-1] or 1.0)


class OldFromPass:
    """The old log-probs of the no-grad policy pass (``prepare``, under the weights before the
    update), and the off-policy correction's weights made from them (:func:`off_policy`)."""

    fused = False

    def take(self, st: StepTensors, idx: list[int], mb: Batch, logits: torch.Tensor, logp: torch.Tensor,
             ent: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows ``idx``' old log-probs and correction weights (or None), on the micro-batch's device."""
        t, dev = mb.T, mb.mask.device
        return st.old_logp[idx, :t].to(dev), st.is_weights[idx, :t].to(dev) if st.is_weights is not None else None

    def skipped(self, st: StepTensors) -> None:
        """A mini-batch made no update: the pass already filled its rows."""

    def done(self, st: StepTensors) -> None:
        """The update ran: the mismatch metrics and the correction were made in ``prepare``."""


@dataclass
class OldFromUpdate:
    """One update per batch (``reasonrl.train.learner``): the old log-probs are the update's own
    forward, detached; the entropy comes from the same logits; both are recorded into the step's
    tensors as the no-grad pass would, and a micro-batch's correction weights are made from them
    (:func:`correction`: row-local constants). ``fill`` runs the no-grad policy pass over the batch
    (for a mini-batch that made no update); ``spec``, ``sampling`` and ``ranks`` are the learner's."""

    spec: A.AlgoSpec
    sampling: A.Sampling
    ranks: Ranks
    fill: Callable[[StepTensors], None]
    fused = True

    def take(self, st: StepTensors, idx: list[int], mb: Batch, logits: torch.Tensor, logp: torch.Tensor,
             ent: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This forward's log-probs, detached, as rows ``idx``' old log-probs (``ent``: the entropy
        bonus's, when it was computed: the same numbers), and their correction weights (or None)."""
        old = logp.detach()
        if ent is None:
            with torch.no_grad():
                ent = A.entropy_from_logits(logits.detach(), sampling=self.sampling, token_ids=mb.response_ids)
        st.record_policy(idx, old, ent.detach(), mb.valid)
        dev = mb.mask.device
        stale = st.staleness[idx, : mb.T].to(dev) if st.staleness is not None else None
        return old, correction(self.spec, old, st.sampler_logp[idx, : mb.T].to(dev), mb.mask, stale)[0]

    def skipped(self, st: StepTensors) -> None:
        """No update (nothing counted on any rank): the old log-probs and entropy still come from a forward."""
        self.fill(st)

    def done(self, st: StepTensors) -> None:
        """Every row's forward ran: the mismatch metrics and the correction (:func:`off_policy`)."""
        off_policy(st, spec=self.spec, ranks=self.ranks)


OldSource = Union[OldFromPass, OldFromUpdate]
"""Where a step's old log-probs come from (``StepTensors.old``), decided once in ``Learner.prepare``."""
