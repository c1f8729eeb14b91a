"""Learning from a collected batch: prepare → advantages → critic and policy updates.

``prepare`` makes the step's tensors with the no-grad passes of ``reasonrl.train.passes``; the
updates here are the optimisation: mini-batches, each cut into weighted micro-batches, each a
forward and the objective of ``reasonrl.algos.objective`` (the policy) or the value loss (the critic).

The order is the papers': old log-probabilities recomputed by the trained model (never the
sampler's) and old values; advantages (GAE / decoupled GAE with the critic, or group-relative);
mini-batch updates of the critic and of the policy with the algo's loss and aggregation. Which
components run is decided by the algo's row (``reasonrl.algos.ALGOS``), never by its name.

One update per batch (``ppo_epochs`` 1 and the batch in one mini-batch): the old log-probs are the
update's own forward, detached (the weights are the same, so a separate no-grad pass would give the
same numbers at the cost of one more forward; the ratio is then exactly 1, its gradient ∇log π).
``prepare`` then runs only the reference and critic passes, and ``update_policy`` fills
``old_logp`` and ``entropy`` from each micro-batch's forward; the TIS weights of a micro-batch are
computed from those detached log-probs before its loss uses them (constants, row-local: the same
numbers as the separate pass's), and the rollout/trainer mismatch metrics once every row's forward
ran. The separate pass stays when the old log-probs are needed before the update (a KL penalty in
the reward), with several updates, or when ``fuse_old_logp=False``. Caveat: the update's forward runs
in training mode, so for a model with dropout the old log-probs would include its noise
(reasonrl's models have none; TRL makes the same choice).

Micro-batches (``reasonrl.train.micro``): inside a mini-batch, rows are arranged by prompt (a group's
rows together, so the shared-prompt forward computes each prompt once per micro-batch, not once per
row) or by length (similar lengths together: less padding), and cut by rows or to a token budget; the
mini-batch itself stays a random draw, and the accumulated gradient is the mini-batch's whatever the
arrangement and the cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from reasonrl import algos as A
from reasonrl.algos.diagnostics import add_clip_counts, clip_by_prob_bucket, clip_fractions_from_counts
from reasonrl.algos.objective import policy_objective
from reasonrl.rollouts import Sample
from reasonrl.train.batch import Batch, padded_mode, pass_mode, response_logits, response_values
from reasonrl.train.micro import RowLengths, arrange, by_rows, split_to, to_budget
from reasonrl.train.passes import StepTensors, correction, no_grad_passes, off_policy, step_tensors
from reasonrl.train.ranks import Ranks, mix


@dataclass
class _PolicyTally:
    """What update_policy gathers across its updates: the largest ratio of any counted token (a
    max, not a mean) and the DAPO fig. 3a clip counts by probability (of the last epoch's updates)."""

    ratio_max: float = 0.0
    clip_counts: dict[str, float] = field(default_factory=dict)


class Learner:
    """The models and their optimisers. ``policy_backend`` is None when the policy is frozen
    (value pretraining); ``critic_backend`` is None for critic-free algos.

    Args:
        spec: the algo's row.
        policy: the policy model (trained through ``policy_backend``, or frozen); None when only the
            critic learns and needs no policy log-probabilities (value pretraining: old_logp and
            entropy stay 0, the critic's values and the advantages are computed as usual).
        ref_model: the reference policy for a KL penalty (None when kl_coef = 0).
        sampling: the distribution the engine sampled from (temperature, top-k, top-p): every
            log-probability and entropy the trainer computes is of this distribution.
        pad_id: the tokenizer's pad id.
        max_len: L_max, the generation cap (the constant of "seq-mean-token-sum-norm").
        micro_batch_size, mini_batch_size: per process; ppo_epochs: passes over the batch.
        seed: the run's seed; step k's mini-batch shuffle is seeded by (seed, k, rank).
        ranks: this process among the run's processes (loss normalisation and metrics are global).
        fuse_old_logp: with one update per batch, take the old log-probs from the update's own
            forward (module doc); False always runs the separate pass.
        max_tokens_per_micro_batch: > 0 cuts micro-batches to this many tokens (as ``forward_mode``
            runs them: :meth:`lengths`) instead of ``micro_batch_size`` rows (``reasonrl.train.micro``);
            the gradient is the same.
        forward_mode: how a micro-batch goes through a model (``reasonrl.train.batch``): shared
            (each prompt into a KV cache once, then the rows), packed (one padding-free sequence),
            plain (the padded rows), or auto (the cheaper by token counts, one mode per pass decided
            on every rank's counts). The stages' default is auto (``--forward-mode``); this
            class's, shared, is for direct callers.
    """

    def __init__(self, *, spec: A.AlgoSpec, policy: torch.nn.Module | None, policy_backend: Any, critic_backend: Any,
                 ref_model: torch.nn.Module | None, sampling: A.Sampling, pad_id: int, max_len: int, micro_batch_size: int,
                 mini_batch_size: int, ppo_epochs: int, dtype: str, seed: int, ranks: Ranks | None = None,
                 fuse_old_logp: bool = True, max_tokens_per_micro_batch: int = 0, forward_mode: str = "shared") -> None:
        self.spec, self.policy, self.policy_backend, self.critic_backend, self.ref_model = spec, policy, policy_backend, critic_backend, ref_model
        self.sampling = sampling
        self.pad_id, self.max_len = pad_id, max_len
        self.micro, self.mini, self.epochs, self.dtype = micro_batch_size, mini_batch_size, ppo_epochs, dtype
        self.token_budget = max_tokens_per_micro_batch
        self.forward_mode = forward_mode
        self.ranks = ranks or Ranks()
        self.rank, self.world = self.ranks.rank, self.ranks.world
        self.seed = seed
        self.gen = torch.Generator().manual_seed(mix(seed, 0, self.rank))
        self.fuse_old_logp = fuse_old_logp
        # The entropy bonus's coefficient and whether it applies: fixed (spec.entropy_coef), or
        # Skywork-OR1's controller's state with spec.entropy_target (alpha_0 = entropy_coef, on).
        self.entropy_coef, self.entropy_on = spec.entropy_coef, True

    def state(self) -> dict[str, Any]:
        """What the learner carries from step to step (the adaptive entropy coefficient), for the
        checkpoint's trainer_state.json: JSON floats read back bit for bit."""
        return {"entropy_coef": self.entropy_coef, "entropy_on": self.entropy_on}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state` (None: a checkpoint written before it existed; the start values stay)."""
        if state:
            self.entropy_coef, self.entropy_on = float(state["entropy_coef"]), bool(state["entropy_on"])

    def applied_entropy_coef(self) -> float:
        """The entropy bonus's alpha this step (0: no entropy term)."""
        return self.entropy_coef if self.spec.entropy_target is None or self.entropy_on else 0.0

    @property
    def device(self) -> torch.device:
        """Where the models live (CPU, or the rank's GPU): micro-batches are moved there."""
        model = self.policy if self.policy is not None else self.critic_backend.model
        return next(model.parameters()).device

    # ---------------------------------------------------------------- the step's tensors
    def one_update(self, rows: int) -> bool:
        """Whether a batch of ``rows`` (this process's) takes its old log-probs from the update's own
        forward: exactly one policy update (one epoch, one mini-batch) and nothing that needs them
        before it (a KL penalty in the reward). The same answer on every rank (equal shares)."""
        s = self.spec
        return (self.fuse_old_logp and self.policy_backend is not None and self.epochs == 1 and rows <= self.mini
                and not (s.kl_in_reward and s.kl_coef > 0 and self.ref_model is not None))

    @torch.no_grad()
    def prepare(self, groups: list[list[Sample]], *, step: int = 0) -> StepTensors:
        """Old log-probs, entropy, values (and reference log-probs) of the batch, under the current
        weights; the mismatch with the sampler's log-probs. Padding copies get no valid token.
        With one update per batch (:meth:`one_update`) the policy's part is left to ``update_policy``."""
        self.gen = torch.Generator().manual_seed(mix(self.seed, step, self.rank))  # this step's mini-batch order
        # (tokens carrying versions: partial rollouts; decided over every rank, whose collectives must match)
        lagged = any(smp.versions for g in groups for smp in g)
        if self.world > 1:
            lagged = bool(self._all_max(torch.tensor(float(lagged), dtype=torch.float64)))
        st = step_tensors(groups, pad_id=self.pad_id, overlong_filter=self.spec.overlong_filter, values=self.critic_backend is not None,
                          ref=self.ref_model is not None, old_from_update=self.one_update(sum(len(g) for g in groups)), step=step,
                          lagged=lagged, mask_stale=self.spec.mask_stale_prefix)
        self._passes(st, policy=self.policy is not None and not st.old_from_update)
        if not st.old_from_update:
            self._off_policy(st)
        return st

    def _passes(self, st: StepTensors, *, policy: bool, others: bool = True) -> None:
        """The no-grad passes: the policy's when ``policy``; the reference's and the critic's (those
        the algo has) when ``others``."""
        ref = self.ref_model if others else None
        critic = self.critic_backend.model if others and self.critic_backend is not None else None
        if policy or ref is not None or critic is not None:
            rows = list(range(st.batch.input_ids.shape[0]))  # (in group order)
            micros = by_rows(rows, self.micro) if self.token_budget <= 0 else self.micro_batches(st, rows)
            no_grad_passes(st, policy=self.policy if policy else None, ref=ref, critic=critic, sampling=self.sampling, micros=micros,
                           device=self.device, dtype=self.dtype, forward_mode=self.forward_mode, total=self._all_sum)

    def _off_policy(self, st: StepTensors) -> None:
        off_policy(st, spec=self.spec, ranks=self.ranks)

    def advantages(self, st: StepTensors, *, group_size: int) -> None:
        """Fill st.advantages / st.returns with the algo's advantage estimator."""
        s = self.spec
        valid = st.batch.valid
        token_rewards = None
        if s.kl_in_reward and s.kl_coef > 0 and st.ref_logp is not None:
            token_rewards = -s.kl_coef * A.kl_penalty(st.old_logp, st.ref_logp, s.kl_kind) * valid
        knobs = s.advantage_knobs()  # gamma, lam_actor, lam_critic, scale_by_std
        if s.adaptive_lambda:
            knobs["lam_actor"] = A.adaptive_lambda(valid.sum(1).clamp(min=1), alpha=s.adaptive_lambda_alpha)
        adv, ret = A.compute_advantages(s.advantage, rewards=st.rewards, mask=valid, group_size=group_size, values=st.values,
                                        token_rewards=token_rewards, **knobs)
        if s.whiten_advantages:
            adv = A.masked_whiten(adv, st.batch.mask) * valid
        st.advantages, st.returns = adv, ret

    # ---------------------------------------------------------------- updates
    def _minibatches(self, B: int) -> list[list[int]]:
        out = []
        for _ in range(self.epochs):
            perm = torch.randperm(B, generator=self.gen).tolist()
            out += [perm[i : i + self.mini] for i in range(0, B, self.mini)]
        return out

    def lengths(self, st: StepTensors) -> RowLengths:
        """The batch's per-row prompt and response token counts and groups, and the forward mode
        whose tokens a micro-batch's cost counts: packed's real tokens; else the padded mode the
        trained model runs in (shared, plain under gradient checkpointing in training mode),
        ``auto``'s fallback: an upper bound of either pick (and of the no-grad passes, in eval mode)."""
        P = st.batch.prompt_len
        group = st.group.tolist() if st.group is not None else list(range(st.batch.input_ids.shape[0]))
        model = self._model()
        forward = self.forward_mode if self.forward_mode in ("packed", "plain") or model is None else padded_mode(model)
        return RowLengths(prompt=[int(x) for x in st.batch.attention_mask[:, :P].sum(1).tolist()],
                          response=[int(x) for x in st.batch.valid.sum(1).tolist()], group=group, forward=forward)

    def _model(self) -> torch.nn.Module | None:
        """The trained model (the policy, or the critic in value pretraining; the frozen policy when
        none is trained; None in a learner without models, whose budget counts shared's tokens)."""
        backend = self.policy_backend or self.critic_backend
        return backend.model if backend is not None else self.policy

    def update_mode(self, model: torch.nn.Module, st: StepTensors, micros: list[tuple[list[int], float]], *, causal_lm: bool) -> str:
        """The forward mode of one update's micro-batches (:func:`pass_mode` over every rank's: the same on every rank)."""
        return pass_mode(self.forward_mode, model, (st.batch.select(idx) for idx, _ in micros), causal_lm=causal_lm, total=self._all_sum)

    def micro_batches(self, st: StepTensors, rows: list[int]) -> list[list[int]]:
        """``rows`` (a mini-batch) cut into micro-batches (``reasonrl.train.micro``): arranged and cut
        every ``micro_batch_size`` rows, or to ``max_tokens_per_micro_batch`` tokens each, as many on
        every rank (the most any rank needs)."""
        lens = self.lengths(st)
        if self.token_budget <= 0:
            return by_rows(arrange(lens, rows, self.micro), self.micro)
        micros = to_budget(lens, rows, self.token_budget)
        if self.world > 1:
            micros = split_to(lens, micros, int(self._all_max(torch.tensor(float(len(micros)), dtype=torch.float64))))
        return micros

    def _weights(self, mask: torch.Tensor, micros: list[list[int]], agg: str) -> list[tuple[list[int], float]]:
        """Each micro-batch's weight so the accumulated gradient equals the mini-batch's aggregate.

        token-mean: micro tokens / mini tokens; seq modes: micro counted rows / mini counted rows,
        counted by ``mask`` (B, T): the same mask the loss is normalised with (the policy's loss
        mask, or the critic's valid tokens). Counts are summed over ranks, and scaled by world size
        because DDP/ZeRO average gradients.
        """
        per_row = mask[[r for m in micros for r in m]].sum(1)
        unit = per_row if agg == "token-mean" else (per_row > 0).float()
        total = float(self._all_sum(unit.sum()))
        if total <= 0:
            return []  # nothing counted on any rank: every rank skips this mini-batch together
        res, at = [], 0
        for mic in micros:
            w = float(unit[at : at + len(mic)].sum())
            res.append((mic, (w / total) * self.world))
            at += len(mic)
        return res

    def _correct_tokens(self, st: StepTensors, mini: list[int]) -> float:
        """The NLL term's denominator: counted tokens of correct responses in the mini-batch, summed
        over ranks, / world (DDP averages gradients): micro-batch terms then add up to the mini-batch's
        token-mean over correct-response tokens, whatever the micro-batch size or process count."""
        return float(self._all_sum((st.batch.mask[mini].sum(1) * st.correct[mini]).sum())) / self.world

    def _all_sum(self, x: torch.Tensor) -> torch.Tensor:
        return self.ranks.sum(x)

    def _all_max(self, x: torch.Tensor) -> torch.Tensor:
        return self.ranks.max(x)

    def update_policy(self, st: StepTensors) -> dict[str, Any]:
        """The policy's updates over the batch's mini-batches (``ppo_epochs`` passes); its metrics,
        means over the updates, ``actor/ratio_max`` and ``actor/clipfrac_by_prob`` over all of them.
        With the old log-probs from the update (``st.old_from_update``) the mismatch and TIS
        metrics follow once every row's forward ran. The entropy bonus takes this step's
        coefficient (``actor/entropy_coef``); with ``entropy_target`` the controller then moves it
        for the next step, from this step's entropy."""
        s = self.spec
        params = s.loss_params(generator=self.gen)  # the covariance losses draw from the learner's seeded generator
        ent_coef = self.applied_entropy_coef()
        metrics: dict[str, list[float]] = {}
        tally = _PolicyTally()
        minis = self._minibatches(st.batch.input_ids.shape[0])
        per_epoch = len(minis) // self.epochs
        for mi, mini in enumerate(minis):
            micros = self._weights(st.batch.mask, self.micro_batches(st, mini), s.loss_agg)
            if not micros:
                if st.old_from_update:  # no update (nothing counted on any rank): the old log-probs and entropy still come from a forward
                    self._passes(st, policy=True, others=False)
                continue
            nll_den = self._correct_tokens(st, mini) if s.pos_lm_coef > 0 else None
            loss_fn = partial(self._policy_micro_loss, st=st, params=params, nll_den=nll_den, tally=tally, ent_coef=ent_coef,
                              track=mi >= len(minis) - per_epoch,  # the clip counts: of the last epoch's updates
                              mode=self.update_mode(self.policy_backend.model, st, micros, causal_lm=True))
            for k, v in self.policy_backend.step(micros, loss_fn).items():
                metrics.setdefault(k, []).append(v)
        if st.old_from_update:
            self._off_policy(st)
        res: dict[str, Any] = {f"actor/{k}": sum(v) / len(v) for k, v in metrics.items()}
        res["actor/ratio_max"] = float(self._all_max(torch.tensor(tally.ratio_max, dtype=torch.float64)))
        counts = tally.clip_counts
        if counts:  # counts over every rank's tokens
            keys = sorted(counts)
            counts = dict(zip(keys, self._all_sum(torch.tensor([counts[k] for k in keys], dtype=torch.float64)).tolist()))
        res["actor/clipfrac_by_prob"] = clip_fractions_from_counts(counts)
        if s.entropy_coef > 0 or s.entropy_target is not None:
            res["actor/entropy_coef"] = ent_coef
        if s.entropy_target is not None:
            self._control_entropy(st)
        return res

    def _control_entropy(self, st: StepTensors) -> None:
        """Skywork-OR1's adaptive entropy control (``A.adaptive_entropy_coef``) from this step's
        mean token entropy over every rank's valid tokens (``actor/entropy``, of the forward under
        the weights before the update): the coefficient the next step applies."""
        s = self.spec
        local = [float((st.entropy * st.batch.valid).sum()), float(st.batch.valid.sum())]  # as rollout_metrics' actor/entropy
        ent = self._all_sum(torch.tensor(local, dtype=torch.float64)).tolist()
        if ent[1] > 0:
            self.entropy_coef, self.entropy_on = A.adaptive_entropy_coef(self.entropy_coef, ent[0] / ent[1], target=s.entropy_target,
                                                                         delta=s.entropy_coef_delta, coef_max=s.entropy_coef_max)

    def _policy_micro_loss(self, model: torch.nn.Module, item: tuple[list[int], float], *, st: StepTensors, params: A.LossParams,
                           nll_den: float | None, tally: _PolicyTally, track: bool, ent_coef: float = 0.0,
                           mode: str = "shared") -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch (rows ``idx``, weight ``w``) of a policy update: its forward, its old
        log-probs (this forward's, detached, when fused; else prepare's), the policy objective (with
        the entropy bonus ``ent_coef`` > 0: the entropy of the sampling distribution, with grad), its
        weighted loss and metrics (``backend.step``'s ``loss_fn``); ``mode``: the forward's (:meth:`update_mode`)."""
        s, dev = self.spec, self.device
        idx, w = item
        mb = st.batch.select(idx).to(dev)
        t = mb.T
        logits = response_logits(model, mb, mode=mode)
        logp = A.logprobs_from_logits(logits, mb.response_ids, sampling=self.sampling)
        ent = A.entropy_from_logits(logits, sampling=self.sampling, token_ids=mb.response_ids) if ent_coef > 0 else None
        if st.old_from_update:
            old, isw = self._old_from_forward(st, idx, mb, logits, logp, ent)
        else:
            old = st.old_logp[idx, :t].to(dev)
            isw = st.is_weights[idx, :t].to(dev) if st.is_weights is not None else None
        old = A.proximal_logp(old, st.sampler_logp[idx, :t].to(dev), mode=s.correction_mode)  # (bypass: the sampler's log-probs)
        del logits
        obj = policy_objective(logp, old, st.advantages[idx, :t].to(dev), mb.mask, loss=s.policy_loss, params=params, agg=s.loss_agg,
                               max_len=self.max_len, is_weights=isw,
                               ref_logp=st.ref_logp[idx, :t].to(dev) if st.ref_logp is not None and not s.kl_in_reward else None,
                               kl_coef=s.kl_coef, kl_kind=s.kl_kind, pos_lm_coef=s.pos_lm_coef if nll_den is not None else 0.0,
                               correct=st.correct[idx].to(dev) if nll_den is not None else None, nll_denominator=nll_den,
                               entropy=ent, entropy_coef=ent_coef)
        tally.ratio_max = max(tally.ratio_max, obj.metrics.pop("ratio_max", 0.0))
        if track:
            add_clip_counts(tally.clip_counts, clip_by_prob_bucket(old, obj.policy.clip_upper, obj.policy.clip_lower, mb.mask))
        loss = obj.loss * w
        if obj.nll is not None:  # VAPO: + mu * NLL of the correct responses, normalised over the mini-batch
            loss = loss + obj.nll
        return loss, {**{k: v * w / self.world for k, v in obj.metrics.items() if isinstance(v, (int, float))},
                      **{k: v / self.world for k, v in obj.nll_metrics.items()}}

    def _old_from_forward(self, st: StepTensors, idx: list[int], mb: Batch, logits: torch.Tensor, logp: torch.Tensor,
                          ent: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fused path (module doc): the old log-probs are this forward's, detached, and the
        entropy comes from the same logits (``ent``, the entropy bonus's, when it was computed: the
        same numbers); both recorded into ``st`` as the no-grad pass would; the off-policy
        correction's weights from them (``passes.correction``: row-local constants). Returns (old
        log-probs, the correction's weights or None)."""
        s = self.spec
        old = logp.detach()
        if ent is None:
            with torch.no_grad():
                ent = A.entropy_from_logits(logits.detach(), sampling=self.sampling, token_ids=mb.response_ids)
        st.record_policy(idx, old, ent.detach(), mb.valid)
        stale = st.staleness[idx, : mb.T].to(self.device) if st.staleness is not None else None
        return old, correction(s, old, st.sampler_logp[idx, : mb.T].to(self.device), mb.mask, stale)[0]

    def update_critic(self, st: StepTensors) -> dict[str, float]:
        """The critic's updates over the batch's mini-batches; its metrics, means over the updates."""
        assert st.values is not None and st.returns is not None
        metrics: dict[str, list[float]] = {}
        for mini in self._minibatches(st.batch.input_ids.shape[0]):
            micros = self._weights(st.batch.valid, self.micro_batches(st, mini), "token-mean")  # the value loss counts every valid token
            if not micros:
                continue
            mode = self.update_mode(self.critic_backend.model, st, micros, causal_lm=False)
            for k, v in self.critic_backend.step(micros, partial(self._critic_micro_loss, st=st, mode=mode)).items():
                metrics.setdefault(k, []).append(v)
        return {f"critic/{k}": sum(v) / len(v) for k, v in metrics.items()}

    def _critic_micro_loss(self, model: torch.nn.Module, item: tuple[list[int], float], *, st: StepTensors,
                           mode: str = "shared") -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch of a critic update: the clipped value loss, weighted, and its metrics
        (explained variance is logged once per step, of the values the advantages used)."""
        idx, w = item
        mb = st.batch.select(idx).to(self.device)
        t, dev = mb.T, self.device
        v = response_values(model, mb, mode=mode)
        loss, m = A.value_loss(v, st.values[idx, :t].to(dev), st.returns[idx, :t].to(dev), mb.valid, clip=self.spec.value_clip, agg="token-mean")
        m["vf_loss"] = float(loss.detach())
        return loss * w, {k: val * w / self.world for k, val in m.items() if isinstance(val, (int, float)) and k != "explained_variance"}
