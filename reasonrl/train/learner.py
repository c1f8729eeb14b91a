"""Learning from a collected batch: prepare → advantages → critic and policy updates.

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

Micro-batches: inside a mini-batch, rows are arranged by prompt (a group's rows together, so the
shared-prompt forward computes each prompt once per micro-batch, not once per row) and by length
(similar lengths together: less padding); the mini-batch itself stays a random draw, and the
accumulated gradient is the mini-batch's whatever the arrangement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from reasonrl import algos as A
from reasonrl.algos.metrics import clip_by_prob_bucket
from reasonrl.devices import autocast_ctx
from reasonrl.samples import Sample
from reasonrl.train.batch import Batch, build_batch, response_logits, response_values
from reasonrl.train.ranks import Ranks, mix


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
    """

    def __init__(self, *, spec: A.AlgoSpec, policy: torch.nn.Module | None, policy_backend: Any, critic_backend: Any,
                 ref_model: torch.nn.Module | None, sampling: A.Sampling, pad_id: int, max_len: int, micro_batch_size: int,
                 mini_batch_size: int, ppo_epochs: int, dtype: str, seed: int, ranks: Ranks | None = None,
                 fuse_old_logp: bool = True) -> None:
        self.spec, self.policy, self.policy_backend, self.critic_backend, self.ref_model = spec, policy, policy_backend, critic_backend, ref_model
        self.sampling = sampling
        self.pad_id, self.max_len = pad_id, max_len
        self.micro, self.mini, self.epochs, self.dtype = micro_batch_size, mini_batch_size, ppo_epochs, dtype
        self.ranks = ranks or Ranks()
        self.rank, self.world = self.ranks.rank, self.ranks.world
        self.seed = seed
        self.gen = torch.Generator().manual_seed(mix(seed, 0, self.rank))
        self.fuse_old_logp = fuse_old_logp

    @property
    def device(self) -> torch.device:
        """Where the models live (CPU, or the rank's GPU): micro-batches are moved there."""
        model = self.policy if self.policy is not None else self.critic_backend.model
        return next(model.parameters()).device

    # ---------------------------------------------------------------- prepare
    def _micro_slices(self, n: int) -> list[list[int]]:
        return [list(range(i, min(i + self.micro, n))) for i in range(0, n, self.micro)]

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
        flat = [s for g in groups for s in g]
        loss_rows = [not (s.pad or (self.spec.overlong_filter and s.truncated)) for s in flat]
        batch = build_batch([s.prompt_ids for s in flat], [s.response_ids for s in flat], pad_id=self.pad_id, loss_rows=loss_rows)
        batch.valid[torch.tensor([s.pad for s in flat], dtype=torch.bool)] = 0.0
        B, T = batch.response_ids.shape
        sampler_logp = torch.zeros(B, T)
        for i, smp in enumerate(flat):
            sampler_logp[i, : len(smp.logprobs)] = torch.tensor(smp.logprobs, dtype=torch.float32)
        rewards = torch.tensor([s.shaped_reward for s in flat], dtype=torch.float32)
        correct = torch.tensor([s.correct for s in flat], dtype=torch.bool)
        st = StepTensors(batch, torch.zeros(B, T), torch.zeros(B, T), rewards, correct, sampler_logp,
                         values=torch.zeros(B, T) if self.critic_backend is not None else None,
                         ref_logp=torch.zeros(B, T) if self.ref_model is not None else None,
                         group=torch.tensor([s.group for s in flat], dtype=torch.long), old_from_update=self.one_update(B))
        self._forward_passes(st, policy=self.policy is not None and not st.old_from_update)
        if not st.old_from_update:
            self._off_policy(st)
        return st

    @torch.no_grad()
    def _forward_passes(self, st: StepTensors, *, policy: bool, others: bool = True) -> None:
        """The no-grad passes over the batch in group order: the policy's (old log-probs, entropy)
        when ``policy``; the reference's and the critic's when ``others`` (and the algo has them)."""
        batch, B = st.batch, st.batch.response_ids.shape[0]
        if not (policy or (others and (st.ref_logp is not None or st.values is not None))):
            return
        models = [m for m in (self.policy if policy else None, self.critic_backend.model if others and st.values is not None else None) if m is not None]
        for m in models:
            m.eval()
        for idx in self._micro_slices(B):
            mb = batch.select(idx).to(self.device)
            t = mb.T
            with autocast_ctx(self.dtype):
                if policy:
                    logits = response_logits(self.policy, mb)
                    st.old_logp[idx, :t] = (A.logprobs_from_logits(logits, mb.response_ids, sampling=self.sampling) * mb.valid).cpu()
                    st.entropy[idx, :t] = (A.entropy_from_logits(logits, sampling=self.sampling, token_ids=mb.response_ids) * mb.valid).cpu()
                    del logits
                if others and st.ref_logp is not None:
                    ref_logits = response_logits(self.ref_model, mb)
                    st.ref_logp[idx, :t] = (A.logprobs_from_logits(ref_logits, mb.response_ids, sampling=self.sampling) * mb.valid).cpu()
                if others and st.values is not None:
                    st.values[idx, :t] = (response_values(self.critic_backend.model, mb) * mb.valid).cpu()
        for m in models:
            m.train()

    def _off_policy(self, st: StepTensors) -> None:
        """The rollout/trainer gap over the loss tokens, always; the TIS weights when the row asks."""
        st.metrics = self._mismatch(st.old_logp, st.sampler_logp, st.batch.mask)
        if self.spec.tis_cap is not None:
            st.is_weights, tis = A.truncated_is_weights(st.old_logp, st.sampler_logp, st.batch.mask, cap=self.spec.tis_cap, level=self.spec.tis_level)
            st.metrics.update({f"actor/{k}": v for k, v in tis.items()})

    def advantages(self, st: StepTensors, *, group_size: int) -> None:
        """Fill st.advantages / st.returns with the algo's advantage estimator."""
        s = self.spec
        valid = st.batch.valid
        token_rewards = None
        if s.kl_in_reward and s.kl_coef > 0 and st.ref_logp is not None:
            token_rewards = -s.kl_coef * A.kl_penalty(st.old_logp, st.ref_logp, s.kl_kind) * valid
        lam_actor: float | torch.Tensor = s.lam_actor
        if s.adaptive_lambda:
            lam_actor = A.adaptive_lambda(valid.sum(1).clamp(min=1), alpha=s.adaptive_lambda_alpha)
        adv, ret = A.compute_advantages(s.advantage, rewards=st.rewards, mask=valid, group_size=group_size, values=st.values,
                                        token_rewards=token_rewards, gamma=s.gamma, lam_actor=lam_actor, lam_critic=s.lam_critic,
                                        scale_by_std=s.grpo_scale_by_std)
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

    def arrange(self, st: StepTensors, mini: list[int]) -> list[int]:
        """The mini-batch's rows in the order they are cut into micro-batches: the cheaper (by a
        token count of the two passes: each micro-batch's distinct prompts at its longest prompt,
        its rows at its longest response) of a group's rows together (groups longest first, each
        longest first: every prompt computed once per micro-batch) and all rows longest first
        (least padding; each row may bring its own prompt)."""
        if len(mini) <= self.micro:
            return mini
        resp = st.batch.valid.sum(1).tolist()
        prompt = st.batch.attention_mask[:, : st.batch.prompt_len].sum(1).tolist()
        group = st.group.tolist() if st.group is not None else list(range(len(resp)))
        top: dict[int, float] = {}
        for r in mini:
            top[group[r]] = max(top.get(group[r], 0.0), resp[r])

        def cost(order: list[int]) -> float:
            total = 0.0
            for i in range(0, len(order), self.micro):
                mic = order[i : i + self.micro]
                total += len({group[r] for r in mic}) * max(prompt[r] for r in mic) + len(mic) * max(resp[r] for r in mic)
            return total

        by_group = sorted(mini, key=lambda r: (-top[group[r]], group[r], -resp[r]))
        by_length = sorted(mini, key=lambda r: (-resp[r], group[r]))
        return min(by_group, by_length, key=cost)

    def _weights(self, mask: torch.Tensor, mini: list[int], agg: str) -> list[tuple[list[int], float]]:
        """Each micro-batch's weight so the accumulated gradient equals the mini-batch's aggregate.

        token-mean: micro tokens / mini tokens; seq modes: micro counted rows / mini counted rows,
        counted by ``mask`` (B, T): the same mask the loss is normalised with (the policy's loss
        mask, or the critic's valid tokens). Counts are summed over ranks, and scaled by world size
        because DDP/ZeRO average gradients.
        """
        m = mask[mini]
        per_row = m.sum(1)
        unit = per_row if agg == "token-mean" else (per_row > 0).float()
        total = float(self._all_sum(unit.sum()))
        if total <= 0:
            return []  # nothing counted on any rank: every rank skips this mini-batch together
        micros = [mini[i : i + self.micro] for i in range(0, len(mini), self.micro)]
        res = []
        for j, mic in enumerate(micros):
            w = float(unit[j * self.micro : j * self.micro + len(mic)].sum())
            res.append((mic, (w / total) * self.world))
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

    def _mismatch(self, old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        """``A.mismatch_metrics`` over every rank's loss tokens."""
        m = mask.bool()
        n = float(m.sum())
        local = A.mismatch_metrics(old_logp, sampler_logp, mask)
        sums = self.ranks.sum(torch.tensor([local["logprob_diff_mean"] * n, local["mismatch_kl"] * n, n], dtype=torch.float64)).tolist()
        top = float(self.ranks.max(torch.tensor(local["logprob_diff_max"], dtype=torch.float64)))
        total = sums[2] or 1.0
        return {"rollout/logprob_diff_mean": sums[0] / total, "rollout/logprob_diff_max": top, "rollout/mismatch_kl": sums[1] / total}

    def update_policy(self, st: StepTensors) -> dict[str, float]:
        s = self.spec
        agg = s.loss_agg
        params = s.loss_params(generator=self.gen)  # the covariance losses draw from the learner's seeded generator
        max_len = self.max_len
        metrics: dict[str, list[float]] = {}
        buckets: dict[str, float] = {}  # DAPO fig. 3a counts, from the ratios of the last epoch's updates
        peak = [0.0]  # the largest ratio of any counted token of any update (a max, not a mean)
        minis = self._minibatches(st.batch.input_ids.shape[0])
        per_epoch = len(minis) // self.epochs
        fused = st.old_from_update
        for mi, mini in enumerate(minis):
            micros = self._weights(st.batch.mask, self.arrange(st, mini), agg)
            track = mi >= len(minis) - per_epoch
            nll_den = self._correct_tokens(st, mini) if s.pos_lm_coef > 0 and micros else None

            def loss_fn(model: torch.nn.Module, item: tuple[list[int], float]) -> tuple[torch.Tensor, dict[str, float]]:
                idx, w = item
                mb = st.batch.select(idx).to(self.device)
                t, dev = mb.T, self.device
                logits = response_logits(model, mb)
                logp = A.logprobs_from_logits(logits, mb.response_ids, sampling=self.sampling)
                if fused:  # the old log-probs are this forward's, detached (module doc); entropy from the same logits
                    old = logp.detach()
                    with torch.no_grad():
                        ent = A.entropy_from_logits(logits.detach(), sampling=self.sampling, token_ids=mb.response_ids)
                    st.old_logp[idx, :t], st.entropy[idx, :t] = (old * mb.valid).cpu(), (ent * mb.valid).cpu()
                    isw = None if s.tis_cap is None else A.truncated_is_weights(old, st.sampler_logp[idx, :t].to(dev), mb.mask, cap=s.tis_cap,
                                                                                  level=s.tis_level)[0]
                else:
                    old = st.old_logp[idx, :t].to(dev)
                    isw = st.is_weights[idx, :t].to(dev) if st.is_weights is not None else None
                del logits
                adv = st.advantages[idx, :t].to(dev)
                out = A.POLICY_LOSSES[s.policy_loss](logp, old, adv, mb.mask, params=params, agg=agg, max_len=max_len, is_weights=isw)
                loss, m = out.loss, dict(out.metrics)
                peak[0] = max(peak[0], m.pop("ratio_max", 0.0))
                if s.kl_coef > 0 and not s.kl_in_reward and st.ref_logp is not None:
                    kl = A.kl_penalty(logp, st.ref_logp[idx, :t].to(dev), s.kl_kind)
                    kl_loss = A.aggregate(kl, mb.mask, agg, max_len=max_len)
                    loss = loss + s.kl_coef * kl_loss
                    m["kl_ref"] = float(kl_loss.detach())
                m["pg_loss"] = float(loss.detach())
                loss, nll_m = loss * w, {}
                if nll_den is not None:  # VAPO: + mu * NLL of the correct responses, normalised over the mini-batch
                    nll, nll_m = A.positive_example_nll(logp, mb.mask, st.correct[idx].to(dev), denominator=nll_den)
                    loss = loss + s.pos_lm_coef * nll
                if track:
                    bm = clip_by_prob_bucket(old, out.clip_upper, out.clip_lower, mb.mask)
                    for k, v in bm.items():
                        if k.startswith("tokens/"):
                            b = k[len("tokens/"):]
                            buckets[k] = buckets.get(k, 0.0) + v
                            for kind in ("clip_upper", "clip_lower"):
                                buckets[f"{kind}/{b}"] = buckets.get(f"{kind}/{b}", 0.0) + bm.get(f"{kind}/{b}", 0.0) * v
                return loss, {**{k: v * w / self.world for k, v in m.items() if isinstance(v, (int, float))},
                              **{k: v / self.world for k, v in nll_m.items()}}

            if not micros:
                if fused:  # no update (nothing counted on any rank): the old log-probs and entropy still come from a forward
                    self._forward_passes(st, policy=True, others=False)
                continue
            out = self.policy_backend.step(micros, loss_fn)
            for k, v in out.items():
                metrics.setdefault(k, []).append(v)
        if fused:
            self._off_policy(st)
        res: dict[str, Any] = {f"actor/{k}": sum(v) / len(v) for k, v in metrics.items()}
        res["actor/ratio_max"] = float(self._all_max(torch.tensor(peak[0], dtype=torch.float64)))
        if buckets:  # counts over every rank's tokens
            keys = sorted(buckets)
            summed = self._all_sum(torch.tensor([buckets[k] for k in keys], dtype=torch.float64)).tolist()
            buckets = dict(zip(keys, summed))
        by_prob: dict[str, float] = {}
        for k, n in buckets.items():
            if k.startswith("tokens/"):
                b = k[len("tokens/"):]
                by_prob[k] = n
                for kind in ("clip_upper", "clip_lower"):
                    by_prob[f"{kind}/{b}"] = buckets.get(f"{kind}/{b}", 0.0) / n if n else 0.0
        res["actor/clipfrac_by_prob"] = by_prob
        return res

    def update_critic(self, st: StepTensors) -> dict[str, float]:
        s = self.spec
        assert st.values is not None and st.returns is not None
        metrics: dict[str, list[float]] = {}
        for mini in self._minibatches(st.batch.input_ids.shape[0]):
            micros = self._weights(st.batch.valid, self.arrange(st, mini), "token-mean")  # the value loss counts every valid token

            def loss_fn(model: torch.nn.Module, item: tuple[list[int], float]) -> tuple[torch.Tensor, dict[str, float]]:
                idx, w = item
                mb = st.batch.select(idx).to(self.device)
                t, dev = mb.T, self.device
                v = response_values(model, mb)
                loss, m = A.value_loss(v, st.values[idx, :t].to(dev), st.returns[idx, :t].to(dev), mb.valid, clip=s.value_clip, agg="token-mean")
                m["vf_loss"] = float(loss.detach())
                # (explained variance is logged once per step, of the values the advantages used)
                return loss * w, {k: val * w / self.world for k, val in m.items() if isinstance(val, (int, float)) and k != "explained_variance"}

            if not micros:
                continue
            out = self.critic_backend.step(micros, loss_fn)
            for k, v in out.items():
                metrics.setdefault(k, []).append(v)
        return {f"critic/{k}": sum(v) / len(v) for k, v in metrics.items()}
