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
``prepare`` decides it once (``StepTensors.old``: ``reasonrl.train.passes.OldFromUpdate``) and
then runs only the reference and critic passes, and ``update_policy`` fills ``old_logp`` and
``entropy`` from each micro-batch's forward; the TIS weights of a micro-batch are computed from
those detached log-probs before its loss uses them (constants, row-local: the same numbers as the
separate pass's), and the rollout/trainer mismatch metrics once every row's forward ran. The separate pass stays when the old log-probs are needed before the update (a KL penalty in
the reward), with several updates, or when ``fuse_old_logp=False``. Caveat: the update's forward runs
in training mode, so for a model with dropout the old log-probs would include its noise
(reasonrl's models have none; TRL makes the same choice).

Micro-batches (``reasonrl.train.micro``, pure functions the learner feeds): inside a mini-batch, rows are arranged by prompt (a group's
rows together, so the shared-prompt forward computes each prompt once per micro-batch, not once per
row) or by length (similar lengths together: less padding), and cut by rows or to a token budget; the
mini-batch itself stays a random draw, and the accumulated gradient is the mini-batch's whatever the
arrangement and the cut.

The parts: :class:`Learner` (the models, ``prepare``, ``advantages``, the two updates' loops);
:class:`PolicyLoss` and :class:`CriticLoss` (one micro-batch of each update: ``backend.step``'s
``loss_fn``); :class:`EntropyControl` (the entropy bonus's coefficient, the learner's state).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Mapping

import torch

from reasonrl import algos as A
from reasonrl.algos.diagnostics import add_clip_counts, clip_by_prob_bucket, clip_fractions_from_counts
from reasonrl.algos.objective import ObjectiveInputs, policy_objective
from reasonrl.models.lora import engine_weights
from reasonrl.rollouts import Sample
from reasonrl.train.batch import padded_mode, pass_mode, response_logits, response_values
from reasonrl.train.micro import by_rows, minibatches, plan, row_lengths, weights
from reasonrl.train.passes import OldFromPass, OldFromUpdate, StepTensors, no_grad_passes, off_policy, step_tensors
from reasonrl.train.ranks import Ranks, mix


class EntropyControl:
    """The entropy bonus's coefficient alpha and whether it applies: fixed (``spec.entropy_coef``),
    or Skywork-OR1's adaptive controller with ``spec.entropy_target`` (alpha_0 = entropy_coef, on),
    moved after each policy update from that step's entropy. Its state is the learner's, in the
    checkpoint's trainer_state.json."""

    def __init__(self, spec: A.AlgoSpec) -> None:
        self.spec = spec
        self.coef, self.on = spec.entropy_coef, True

    def applied(self) -> float:
        """The entropy bonus's alpha this step (0: no entropy term)."""
        return self.coef if self.spec.entropy_target is None or self.on else 0.0

    def observe(self, st: StepTensors, ranks: Ranks) -> None:
        """With ``entropy_target``: Skywork-OR1's adaptive entropy control (``A.adaptive_entropy_coef``)
        from this step's mean token entropy over every rank's valid tokens (``actor/entropy``, of the
        forward under the weights before the update): the coefficient the next step applies."""
        s = self.spec
        if s.entropy_target is None:
            return
        local = [float((st.entropy * st.batch.valid).sum()), float(st.batch.valid.sum())]  # as rollout_metrics' actor/entropy
        ent = ranks.sum(torch.tensor(local, dtype=torch.float64)).tolist()
        if ent[1] > 0:
            self.coef, self.on = A.adaptive_entropy_coef(self.coef, ent[0] / ent[1], target=s.entropy_target,
                                                         delta=s.entropy_coef_delta, coef_max=s.entropy_coef_max)

    def state(self) -> dict[str, Any]:
        """The coefficient and its switch (JSON floats read back bit for bit)."""
        return {"entropy_coef": self.coef, "entropy_on": self.on}

    def load(self, state: Mapping[str, Any] | None) -> None:
        """Restore :meth:`state` (None: a checkpoint written before it existed; the start values stay)."""
        if state:
            self.coef, self.on = float(state["entropy_coef"]), bool(state["entropy_on"])


@dataclass
class _PolicyTally:
    """What update_policy gathers across its updates: the largest ratio of any counted token (a
    max, not a mean) and the DAPO fig. 3a clip counts by probability (of the last epoch's updates)."""

    ratio_max: float = 0.0
    clip_counts: dict[str, float] = field(default_factory=dict)

    def metrics(self, ranks: Ranks) -> dict[str, Any]:
        """``actor/ratio_max`` (the max over every rank) and ``actor/clipfrac_by_prob`` (over every rank's tokens)."""
        res: dict[str, Any] = {"actor/ratio_max": float(ranks.max(torch.tensor(self.ratio_max, dtype=torch.float64)))}
        counts = self.clip_counts
        if counts:
            keys = sorted(counts)
            counts = dict(zip(keys, ranks.sum(torch.tensor([counts[k] for k in keys], dtype=torch.float64)).tolist()))
        res["actor/clipfrac_by_prob"] = clip_fractions_from_counts(counts)
        return res


@dataclass
class PolicyLoss:
    """One micro-batch (rows ``idx``, weight ``w``) of a policy update, ``backend.step``'s
    ``loss_fn``: its forward (``mode``), its old log-probs (``st.old``: this forward's, detached,
    when fused; else prepare's), the policy objective (with the entropy bonus ``ent_coef`` > 0: the
    entropy of the sampling distribution, with grad), its weighted loss and metrics. ``nll_den``:
    the NLL term's denominator (None: no NLL term); ``track``: count the clip fractions."""

    st: StepTensors
    spec: A.AlgoSpec
    sampling: A.Sampling
    max_len: int
    device: torch.device
    world: int
    params: A.LossParams
    tally: _PolicyTally
    ent_coef: float = 0.0
    nll_den: float | None = None
    track: bool = False
    mode: str = "shared"

    def __call__(self, model: torch.nn.Module, item: tuple[list[int], float]) -> tuple[torch.Tensor, dict[str, float]]:
        s, st, dev = self.spec, self.st, self.device
        idx, w = item
        mb = st.batch.select(idx).to(dev)
        t = mb.T
        logits = response_logits(model, mb, mode=self.mode)
        logp = A.logprobs_from_logits(logits, mb.response_ids, sampling=self.sampling)
        ent = A.entropy_from_logits(logits, sampling=self.sampling, token_ids=mb.response_ids) if self.ent_coef > 0 else None
        old, isw = st.old.take(st, idx, mb, logits, logp, ent)
        old = A.proximal_logp(old, st.sampler_logp[idx, :t].to(dev), mode=s.correction_mode)  # (bypass: the sampler's log-probs)
        del logits
        nll = self.nll_den is not None
        obj = policy_objective(ObjectiveInputs(
            logp, old, st.advantages[idx, :t].to(dev), mb.mask, loss=s.policy_loss, params=self.params, agg=s.loss_agg,
            max_len=self.max_len, is_weights=isw,
            ref_logp=st.ref_logp[idx, :t].to(dev) if st.ref_logp is not None and not s.kl_in_reward else None,
            kl_coef=s.kl_coef, kl_kind=s.kl_kind, pos_lm_coef=s.pos_lm_coef if nll else 0.0,
            correct=st.correct[idx].to(dev) if nll else None, nll_denominator=self.nll_den, entropy=ent, entropy_coef=self.ent_coef))
        self.tally.ratio_max = max(self.tally.ratio_max, obj.metrics.pop("ratio_max", 0.0))
        if self.track:
            add_clip_counts(self.tally.clip_counts, clip_by_prob_bucket(old, obj.policy.clip_upper, obj.policy.clip_lower, mb.mask))
        loss = obj.loss * w
        if obj.nll is not None:  # VAPO: + mu * NLL of the correct responses, normalised over the mini-batch
            loss = loss + obj.nll
        return loss, {**{k: v * w / self.world for k, v in obj.metrics.items() if isinstance(v, (int, float))},
                      **{k: v / self.world for k, v in obj.nll_metrics.items()}}


@dataclass
class CriticLoss:
    """One micro-batch of a critic update, ``backend.step``'s ``loss_fn``: the clipped value loss,
    weighted, and its metrics (explained variance is logged once per step, of the values the
    advantages used); ``mode``: the forward's."""

    st: StepTensors
    value_clip: float | None
    device: torch.device
    world: int
    mode: str = "shared"

    def __call__(self, model: torch.nn.Module, item: tuple[list[int], float]) -> tuple[torch.Tensor, dict[str, float]]:
        st, dev = self.st, self.device
        idx, w = item
        mb = st.batch.select(idx).to(dev)
        t = mb.T
        v = response_values(model, mb, mode=self.mode)
        loss, m = A.value_loss(v, st.values[idx, :t].to(dev), st.returns[idx, :t].to(dev), mb.valid, clip=self.value_clip, agg="token-mean")
        m["vf_loss"] = float(loss.detach())
        return loss * w, {k: val * w / self.world for k, val in m.items() if isinstance(val, (int, float)) and k != "explained_variance"}


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
            runs them: :meth:`micro_batches`) instead of ``micro_batch_size`` rows (``reasonrl.train.micro``);
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
        self.entropy = EntropyControl(spec)

    def state(self) -> dict[str, Any]:
        """What the learner carries from step to step (the adaptive entropy coefficient), for the
        checkpoint's trainer_state.json: JSON floats read back bit for bit."""
        return self.entropy.state()

    def load(self, state: Mapping[str, Any] | None) -> None:
        """Restore :meth:`state` (None: a checkpoint written before it existed; the start values stay)."""
        self.entropy.load(state)

    @property
    def device(self) -> torch.device:
        """Where the models live (CPU, or the rank's GPU): micro-batches are moved there."""
        model = self.policy if self.policy is not None else self.critic_backend.model
        return next(model.parameters()).device

    # ---------------------------------------------------------------- the step's tensors
    @torch.no_grad()
    def prepare(self, groups: list[list[Sample]], *, step: int = 0) -> StepTensors:
        """Old log-probs, entropy, values (and reference log-probs) of the batch, under the current
        weights; the mismatch with the sampler's log-probs. Padding copies get no valid token.

        Where the old log-probs come from is decided here, once (``StepTensors.old``): the update's
        own forward when the batch (this process's rows; equal shares, so the same on every rank)
        takes exactly one policy update (one epoch, one mini-batch) and nothing needs them before it
        (a KL penalty in the reward); the policy's part is then left to ``update_policy``. Else the
        no-grad pass here."""
        s = self.spec
        self.gen = torch.Generator().manual_seed(mix(self.seed, step, self.rank))  # this step's mini-batch order
        # (tokens carrying versions: partial rollouts; decided over every rank, whose collectives must match)
        lagged = any(smp.versions for g in groups for smp in g)
        if self.world > 1:
            lagged = bool(self.ranks.max(torch.tensor(float(lagged), dtype=torch.float64)))
        fused = (self.fuse_old_logp and self.policy_backend is not None and self.epochs == 1 and sum(len(g) for g in groups) <= self.mini
                 and not (s.kl_in_reward and s.kl_coef > 0 and self.ref_model is not None))
        old = OldFromUpdate(s, self.sampling, self.ranks, partial(self._passes, policy=True, others=False)) if fused else OldFromPass()
        st = step_tensors(groups, pad_id=self.pad_id, overlong_filter=s.overlong_filter, values=self.critic_backend is not None,
                          ref=self.ref_model is not None, old=old, step=step, lagged=lagged, mask_stale=s.mask_stale_prefix)
        self._passes(st, policy=self.policy is not None and not fused)
        if not fused:
            off_policy(st, spec=s, ranks=self.ranks)
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
                           device=self.device, dtype=self.dtype, forward_mode=self.forward_mode, total=self.ranks.sum)

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
    def micro_batches(self, st: StepTensors, rows: list[int]) -> list[list[int]]:
        """``rows`` (a mini-batch) cut into micro-batches (``reasonrl.train.micro.plan``): arranged and
        cut every ``micro_batch_size`` rows, or to ``max_tokens_per_micro_batch`` tokens each, as many
        on every rank (the most any rank needs). A micro-batch's cost counts the tokens of the forward
        mode: packed's real tokens; else the padded mode the trained model runs in (shared, plain
        under gradient checkpointing in training mode), ``auto``'s fallback: an upper bound of either
        pick (and of the no-grad passes, in eval mode). The trained model is the policy, or the
        critic in value pretraining; the frozen policy when none is trained; none in a learner
        without models, whose budget counts shared's tokens."""
        backend = self.policy_backend or self.critic_backend
        model = backend.model if backend is not None else self.policy
        forward = self.forward_mode if self.forward_mode in ("packed", "plain") or model is None else padded_mode(model)
        group = st.group.tolist() if st.group is not None else list(range(st.batch.input_ids.shape[0]))
        lens = row_lengths(st.batch.attention_mask, st.batch.valid, st.batch.prompt_len, group, forward)
        most = None
        if self.world > 1:
            most = lambda n: int(self.ranks.max(torch.tensor(float(n), dtype=torch.float64)))  # noqa: E731
        return plan(lens, rows, micro=self.micro, budget=self.token_budget, most=most)

    def update_critic(self, st: StepTensors) -> dict[str, float]:
        """The critic's updates over the batch's mini-batches (:class:`CriticLoss` per micro-batch);
        its metrics, means over the updates."""
        assert st.values is not None and st.returns is not None
        model = self.critic_backend.model
        loss_fn = CriticLoss(st, self.spec.value_clip, self.device, self.world)
        metrics: dict[str, list[float]] = {}
        for mini in minibatches(st.batch.input_ids.shape[0], epochs=self.epochs, size=self.mini, gen=self.gen):
            micros = weights(st.batch.valid, self.micro_batches(st, mini), "token-mean", total=self.ranks.sum,  # the value loss counts every valid token
                             world=self.world)
            if not micros:
                continue
            mode = pass_mode(self.forward_mode, model, (st.batch.select(idx) for idx, _ in micros), causal_lm=False, total=self.ranks.sum)
            for k, v in self.critic_backend.step(micros, replace(loss_fn, mode=mode)).items():
                metrics.setdefault(k, []).append(v)
        return {f"critic/{k}": sum(v) / len(v) for k, v in metrics.items()}

    def update_policy(self, st: StepTensors) -> dict[str, Any]:
        """The policy's updates over the batch's mini-batches (``ppo_epochs`` passes; :class:`PolicyLoss`
        per micro-batch); its metrics, means over the updates, ``actor/ratio_max`` and
        ``actor/clipfrac_by_prob`` over all of them. With the old log-probs from the update
        (``st.old``) the mismatch and TIS metrics follow once every row's forward ran. The entropy
        bonus takes this step's coefficient (``actor/entropy_coef``); with ``entropy_target`` the
        controller then moves it for the next step, from this step's entropy."""
        s = self.spec
        model = self.policy_backend.model
        params = s.loss_params(generator=self.gen)  # the covariance losses draw from the learner's seeded generator
        ent_coef = self.entropy.applied()
        tally = _PolicyTally()
        loss_fn = PolicyLoss(st, s, self.sampling, self.max_len, self.device, self.world, params, tally, ent_coef=ent_coef)
        metrics: dict[str, list[float]] = {}
        minis = minibatches(st.batch.input_ids.shape[0], epochs=self.epochs, size=self.mini, gen=self.gen)
        per_epoch = len(minis) // self.epochs
        for mi, mini in enumerate(minis):
            micros = weights(st.batch.mask, self.micro_batches(st, mini), s.loss_agg, total=self.ranks.sum, world=self.world)
            if not micros:
                st.old.skipped(st)
                continue
            # The NLL term's denominator: counted tokens of correct responses in the mini-batch, summed over
            # ranks, / world (DDP averages gradients): micro-batch terms then add up to the mini-batch's
            # token-mean over correct-response tokens, whatever the micro-batch size or process count.
            nll_den = float(self.ranks.sum((st.batch.mask[mini].sum(1) * st.correct[mini]).sum())) / self.world if s.pos_lm_coef > 0 else None
            mode = pass_mode(self.forward_mode, model, (st.batch.select(idx) for idx, _ in micros), causal_lm=True, total=self.ranks.sum)
            step_loss = replace(loss_fn, nll_den=nll_den, track=mi >= len(minis) - per_epoch, mode=mode)  # (clip counts: the last epoch's)
            for k, v in self.policy_backend.step(micros, step_loss).items():
                metrics.setdefault(k, []).append(v)
        st.old.done(st)
        res: dict[str, Any] = {f"actor/{k}": sum(v) / len(v) for k, v in metrics.items()}
        res.update(tally.metrics(self.ranks))
        if s.entropy_coef > 0 or s.entropy_target is not None:
            res["actor/entropy_coef"] = ent_coef
        self.entropy.observe(st, self.ranks)
        return res

    def scheduler_step(self, which: str) -> None:
        """Advance the LR schedule of the ``"policy"`` or the ``"critic"`` (none: not trained here),
        once per step, with or without an update."""
        backend = self.policy_backend if which == "policy" else self.critic_backend
        if backend is not None:
            backend.scheduler_step()

    def engine_weights(self) -> Any:
        """The policy's weights as the generation engine takes them (LoRA: the merged linear layers)."""
        return engine_weights(self.policy_backend.model, self.policy_backend.full_state_dict())
