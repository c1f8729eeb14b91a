"""The on-policy loop, shared by `train` (every algo) and `pretrain-value` (policy frozen).

One step: rollout → rule rewards (+ soft overlong punishment) → dynamic sampling (over-sample,
drop groups that are all correct or all wrong, refill, a cap on rounds) → old logprobs recomputed by
the trained model (never the sampler's) and old values → advantages (GAE / decoupled GAE with the
critic, or group-relative) → mini-batch updates of the policy (and critic) with the algo's loss and
aggregation → weights into the generation engine → metrics → checkpoint.

Which components run is decided by the algo's row (``reasonrl.algos.ALGOS``), never by its name.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from reasonrl import algos as A
from reasonrl.algos.metrics import clipfrac_by_prob_bucket, explained_variance, mean_by_position
from reasonrl.engines.base import SamplingParams
from reasonrl.rollout import RolloutStats, Sample, generate_rollouts
from reasonrl.train.backend import autocast_ctx
from reasonrl.train.batch import Batch, build_batch, response_logits, response_values


class DataStream:
    """Prompts in a seeded order, epoch after epoch; its position is saved in checkpoints."""

    def __init__(self, rows: Sequence[dict[str, Any]], seed: int) -> None:
        self.rows, self.seed, self.epoch, self.pos = list(rows), seed, 0, 0
        self._order = self._perm()

    def _perm(self) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return order

    def take(self, k: int) -> tuple[list[dict[str, Any]], list[int]]:
        out, idx = [], []
        while len(out) < k:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm()
            i = self._order[self.pos]
            self.pos += 1
            out.append(self.rows[i])
            idx.append(i)
        return out, idx

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, st: dict[str, int]) -> None:
        self.epoch, self.pos = int(st["epoch"]), int(st["pos"])
        self._order = self._perm()


@dataclass
class Collected:
    groups: list[list[Sample]]
    stats: RolloutStats
    generated: list[Sample] = field(default_factory=list)  # every response sampled this step, kept or not
    rounds: int = 0
    generated_groups: int = 0
    kept_groups: int = 0
    dropped_all_correct: int = 0
    dropped_all_wrong: int = 0
    gen_seconds: float = 0.0


@dataclass
class StepTensors:
    """Everything the updates need for one step's batch (B responses, T response tokens)."""

    batch: Batch
    old_logp: torch.Tensor  # (B, T)
    entropy: torch.Tensor  # (B, T)
    rewards: torch.Tensor  # (B,) shaped rewards
    correct: torch.Tensor  # (B,) bool
    values: torch.Tensor | None = None  # (B, T)
    ref_logp: torch.Tensor | None = None  # (B, T)
    advantages: torch.Tensor | None = None  # (B, T)
    returns: torch.Tensor | None = None  # (B, T)
    extra: dict[str, Any] = field(default_factory=dict)


def shape_rewards(groups: list[list[Sample]], *, overlong_penalty: bool, max_len: int, cache_len: int) -> None:
    """shaped = rule reward + DAPO eq. 13 punishment (when the algo uses it)."""
    flat = [s for g in groups for s in g]
    if not flat:
        return
    pen = A.overlong_penalty(torch.tensor([s.length for s in flat]), max_len=max_len, cache_len=cache_len) if overlong_penalty else torch.zeros(len(flat))
    for s, p in zip(flat, pen.tolist()):
        s.shaped_reward = s.reward + float(p)


class Loop:
    """The machinery of one run. ``policy_backend`` is None when the policy is frozen."""

    def __init__(self, *, spec: A.AlgoSpec, engine: Any, tokenizer: Any, scorer: Any, stream: DataStream, policy: torch.nn.Module,
                 policy_backend: Any, critic_backend: Any, ref_model: torch.nn.Module | None, sampling: SamplingParams,
                 max_prompt_len: int, overlong_cache_len: int, micro_batch_size: int, mini_batch_size: int, ppo_epochs: int,
                 dtype: str, seed: int, oversample: float = 1.0, max_gen_rounds: int = 1, rank: int = 0, world_size: int = 1,
                 console: Any = None) -> None:
        self.spec, self.engine, self.tok, self.scorer, self.stream = spec, engine, tokenizer, scorer, stream
        self.policy, self.policy_backend, self.critic_backend, self.ref_model = policy, policy_backend, critic_backend, ref_model
        self.sampling, self.max_prompt_len, self.cache_len = sampling, max_prompt_len, overlong_cache_len
        self.micro, self.mini, self.epochs, self.dtype = micro_batch_size, mini_batch_size, ppo_epochs, dtype
        self.oversample, self.max_rounds, self.rank, self.world = oversample, max_gen_rounds, rank, world_size
        self.gen = torch.Generator().manual_seed(seed + 7919 * rank)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.console = console
        self._group_counter = 0

    @property
    def device(self) -> torch.device:
        """Where the models live (CPU, or the rank's GPU): micro-batches are moved there."""
        return next(self.policy.parameters()).device

    # ---------------------------------------------------------------- rollouts + dynamic sampling
    def collect(self, n_prompts: int, *, dynamic: bool | None = None) -> Collected:
        dynamic = self.spec.dynamic_sampling if dynamic is None else dynamic
        out = Collected(groups=[], stats=RolloutStats())
        need = n_prompts
        while need > 0 and out.rounds < (self.max_rounds if dynamic else 1):
            k = math.ceil(need * (self.oversample if dynamic else 1.0))
            rows, idx = self.stream.take(k * self.world)
            rows, idx = rows[self.rank :: self.world], idx[self.rank :: self.world]
            t0 = time.perf_counter()
            groups, st = generate_rollouts(self.engine, self.tok, self.scorer, rows, self.sampling, max_prompt_len=self.max_prompt_len,
                                           group_offset=self._group_counter)
            out.gen_seconds += time.perf_counter() - t0
            self._group_counter += len(groups)
            out.stats.merge(st)
            out.rounds += 1
            out.generated_groups += len(groups)
            shape_rewards(groups, overlong_penalty=self.spec.overlong_penalty, max_len=self.sampling.max_tokens, cache_len=self.cache_len)
            out.generated.extend(s for g in groups for s in g)
            if dynamic and groups:
                correct = torch.tensor([[s.correct for s in g] for g in groups], dtype=torch.bool)
                keep = A.informative_groups(correct)
                n_corr = correct.sum(1)
                out.dropped_all_correct += int((n_corr == correct.shape[1]).sum())
                out.dropped_all_wrong += int((n_corr == 0).sum())
                for g, k_ in zip(groups, keep.tolist()):
                    for smp in g:
                        smp.kept = bool(k_)
                groups = [g for g, k_ in zip(groups, keep.tolist()) if k_]
            out.groups.extend(groups)
            need = n_prompts - len(out.groups)
        for g in out.groups[n_prompts:]:
            for smp in g:
                smp.kept = False
        out.groups = out.groups[:n_prompts]
        out.kept_groups = len(out.groups)
        return out

    # ---------------------------------------------------------------- tensors for the step
    def _micro_slices(self, n: int) -> list[list[int]]:
        return [list(range(i, min(i + self.micro, n))) for i in range(0, n, self.micro)]

    @torch.no_grad()
    def prepare(self, groups: list[list[Sample]]) -> StepTensors:
        flat = [s for g in groups for s in g]
        loss_rows = [not (self.spec.overlong_filter and s.truncated) for s in flat]
        batch = build_batch([s.prompt_ids for s in flat], [s.response_ids for s in flat], pad_id=self.pad_id, loss_rows=loss_rows)
        B, T = batch.response_ids.shape
        old_logp = torch.zeros(B, T)
        entropy = torch.zeros(B, T)
        ref_logp = torch.zeros(B, T) if self.ref_model is not None else None
        values = torch.zeros(B, T) if self.critic_backend is not None else None
        self.policy.eval()
        for idx in self._micro_slices(B):
            mb = batch.select(idx).to(self.device)
            t = mb.T
            with autocast_ctx(self.dtype):
                logits = response_logits(self.policy, mb)
                old_logp[idx, :t] = (A.logprobs_from_logits(logits, mb.response_ids) * mb.valid).cpu()
                entropy[idx, :t] = (A.entropy_from_logits(logits) * mb.valid).cpu()
                del logits
                if ref_logp is not None:
                    ref_logp[idx, :t] = (A.logprobs_from_logits(response_logits(self.ref_model, mb), mb.response_ids) * mb.valid).cpu()
                if values is not None:
                    self.critic_backend.model.eval()
                    values[idx, :t] = (response_values(self.critic_backend.model, mb) * mb.valid).cpu()
        self.policy.train()
        if self.critic_backend is not None:
            self.critic_backend.model.train()
        rewards = torch.tensor([s.shaped_reward for s in flat], dtype=torch.float32)
        correct = torch.tensor([s.correct for s in flat], dtype=torch.bool)
        return StepTensors(batch, old_logp, entropy, rewards, correct, values, ref_logp)

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

    def _weights(self, batch: Batch, mini: list[int], agg: str) -> list[tuple[list[int], float]]:
        """Each micro-batch's weight so the accumulated gradient equals the mini-batch's aggregate.

        token-mean: micro tokens / mini tokens; seq modes: micro counted rows / mini counted rows.
        Counts are summed over ranks, and scaled by world size because DDP/ZeRO average gradients.
        """
        m = batch.mask[mini]
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

    def _all_sum(self, x: torch.Tensor) -> torch.Tensor:
        backend = self.policy_backend or self.critic_backend
        return backend.all_reduce_sum(x.clone()) if backend is not None and self.world > 1 else x

    def update_policy(self, st: StepTensors) -> dict[str, float]:
        s = self.spec
        agg = s.loss_agg
        max_len = self.sampling.max_tokens
        metrics: dict[str, list[float]] = {}
        buckets: dict[str, float] = {}  # DAPO fig. 3a counts, from the ratios of the last epoch's updates
        minis = self._minibatches(st.batch.input_ids.shape[0])
        per_epoch = len(minis) // self.epochs
        for mi, mini in enumerate(minis):
            micros = self._weights(st.batch, mini, agg)
            track = mi >= len(minis) - per_epoch

            def loss_fn(model: torch.nn.Module, item: tuple[list[int], float]) -> tuple[torch.Tensor, dict[str, float]]:
                idx, w = item
                mb = st.batch.select(idx).to(self.device)
                t, dev = mb.T, self.device
                logits = response_logits(model, mb)
                logp = A.logprobs_from_logits(logits, mb.response_ids)
                del logits
                adv = st.advantages[idx, :t].to(dev)
                loss, m = A.policy_loss(logp, st.old_logp[idx, :t].to(dev), adv, mb.mask, eps_low=s.eps_low, eps_high=s.eps_high,
                                        dual_clip=s.dual_clip, agg=agg, max_len=max_len)
                if s.kl_coef > 0 and not s.kl_in_reward and st.ref_logp is not None:
                    kl = A.kl_penalty(logp, st.ref_logp[idx, :t].to(dev), s.kl_kind)
                    kl_loss = A.aggregate(kl, mb.mask, agg, max_len=max_len)
                    loss = loss + s.kl_coef * kl_loss
                    m["kl_ref"] = float(kl_loss.detach())
                m["pg_loss"] = float(loss.detach())
                if track:
                    with torch.no_grad():
                        ratio = torch.exp((logp.detach() - st.old_logp[idx, :t].to(dev)).clamp(-20, 20))
                        bm = clipfrac_by_prob_bucket(st.old_logp[idx, :t].to(dev), ratio, adv, mb.mask, s.eps_low, s.eps_high)
                    for k, v in bm.items():
                        if k.startswith("tokens/"):
                            b = k[len("tokens/"):]
                            buckets[k] = buckets.get(k, 0.0) + v
                            for kind in ("clip_upper", "clip_lower"):
                                buckets[f"{kind}/{b}"] = buckets.get(f"{kind}/{b}", 0.0) + bm.get(f"{kind}/{b}", 0.0) * v
                return loss * w, {k: v * w / self.world for k, v in m.items() if isinstance(v, (int, float))}

            if not micros:
                continue
            out = self.policy_backend.step(micros, loss_fn)
            for k, v in out.items():
                metrics.setdefault(k, []).append(v)
        res: dict[str, Any] = {k: sum(v) / len(v) for k, v in metrics.items()}
        by_prob: dict[str, float] = {}
        for k, n in buckets.items():
            if k.startswith("tokens/"):
                b = k[len("tokens/"):]
                by_prob[k] = n
                for kind in ("clip_upper", "clip_lower"):
                    by_prob[f"{kind}/{b}"] = buckets.get(f"{kind}/{b}", 0.0) / n if n else 0.0
        res["clipfrac_by_prob"] = by_prob
        return res

    def update_critic(self, st: StepTensors) -> dict[str, float]:
        s = self.spec
        assert st.values is not None and st.returns is not None
        metrics: dict[str, list[float]] = {}
        for mini in self._minibatches(st.batch.input_ids.shape[0]):
            micros = self._weights(st.batch, mini, "token-mean")

            def loss_fn(model: torch.nn.Module, item: tuple[list[int], float]) -> tuple[torch.Tensor, dict[str, float]]:
                idx, w = item
                mb = st.batch.select(idx).to(self.device)
                t, dev = mb.T, self.device
                v = response_values(model, mb)
                loss, m = A.value_loss(v, st.values[idx, :t].to(dev), st.returns[idx, :t].to(dev), mb.valid, clip=s.value_clip, agg="token-mean")
                m["vf_loss"] = float(loss.detach())
                return loss * w, {k: val * w / self.world for k, val in m.items() if isinstance(val, (int, float))}

            if not micros:
                continue
            out = self.critic_backend.step(micros, loss_fn)
            for k, v in out.items():
                metrics.setdefault(k, []).append(v)
        return {f"critic/{k}": sum(v) / len(v) for k, v in metrics.items()}

    def sync_engine(self) -> float:
        t0 = time.perf_counter()
        self.engine.update_weights(self.policy_backend.full_state_dict())
        return time.perf_counter() - t0


def rollout_metrics(col: Collected, st: StepTensors | None) -> dict[str, Any]:
    """Reward, accuracy and lengths over every response generated this step (dynamic sampling's
    dropped groups included: that is the policy's real score), plus the kept batch's and the
    filter's counts."""
    m: dict[str, Any] = {}
    gen = col.generated
    if gen:
        lens = [s.length for s in gen]
        m.update({
            "reward_mean": sum(s.reward for s in gen) / len(gen),
            "shaped_reward_mean": sum(s.shaped_reward for s in gen) / len(gen),
            "acc_mean": sum(s.correct for s in gen) / len(gen),
            "response_length_mean": sum(lens) / len(lens),
            "response_length_max": max(lens),
            "truncated_frac": sum(s.truncated for s in gen) / len(gen),
            "no_answer_frac": sum(s.extracted is None for s in gen) / len(gen),
        })
    kept = [s for g in col.groups for s in g]
    if kept:
        m["batch_acc_mean"] = sum(s.correct for s in kept) / len(kept)
        m["batch_size"] = len(kept)
    m.update({
        "ds_rounds": col.rounds,
        "ds_generated_groups": col.generated_groups,
        "ds_kept_groups": col.kept_groups,
        "ds_kept_frac": col.kept_groups / col.generated_groups if col.generated_groups else 0.0,
        "ds_dropped_all_correct": col.dropped_all_correct,
        "ds_dropped_all_wrong": col.dropped_all_wrong,
        "gen_tokens": col.stats.gen_tokens,
        "gen_tokens_per_s": col.stats.gen_tokens / col.gen_seconds if col.gen_seconds else 0.0,
        "skipped_long_prompts": col.stats.skipped_long_prompts,
        "verifier_timeouts": col.stats.scorer.get("timeouts", 0),
        "verifier_errors": col.stats.scorer.get("errors", 0),
    })
    if st is not None:
        m["entropy"] = float(A.masked_mean(st.entropy, st.batch.valid)) if st.batch.valid.sum() > 0 else 0.0
    return m


def position_metrics(st: StepTensors, n_bins: int = 16) -> dict[str, Any]:
    """VC-PPO's bias picture: mean value and advantage by token position."""
    m: dict[str, Any] = {}
    if st.advantages is not None:
        m["advantage_by_position"] = mean_by_position(st.advantages, st.batch.valid, n_bins=n_bins)
    if st.values is not None:
        m["value_by_position"] = mean_by_position(st.values, st.batch.valid, n_bins=n_bins)
        if st.returns is not None:
            m["explained_variance"] = float(explained_variance(st.values, st.returns, st.batch.valid))
    return m


def append_jsonl(path: Path, rec: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, default=float) + "\n")


def log_line(step: int, steps: int, m: dict[str, Any]) -> str:
    def g(k: str, fmt: str = "{:.3f}") -> str:
        return fmt.format(m[k]) if k in m and m[k] is not None else "-"

    parts = [
        f"step {step}/{steps}",
        f"reward {g('reward_mean')}",
        f"acc {g('acc_mean')}",
        f"ent {g('entropy')}",
        f"clip↑ {g('clipfrac_upper', '{:.4f}')}",
        f"clip↓ {g('clipfrac_lower', '{:.4f}')}",
        f"len {g('response_length_mean', '{:.0f}')}",
        f"trunc {g('truncated_frac', '{:.2f}')}",
        f"kept {m.get('ds_kept_groups', '-')}/{m.get('ds_generated_groups', '-')} ({m.get('ds_rounds', '-')} rnd)",
        f"gen {g('gen_tokens_per_s', '{:.0f}')} tok/s",
        f"train {g('train_tokens_per_s', '{:.0f}')} tok/s",
    ]
    if "critic/vf_loss" in m:
        parts.insert(5, f"vf {g('critic/vf_loss')}")
    return " | ".join(parts)


def flatten_metrics(m: dict[str, Any]) -> dict[str, Any]:
    """Drop the bulky lists for the console; keep everything for metrics.jsonl."""
    return {k: v for k, v in m.items() if not isinstance(v, (list, dict))}


Callback = Callable[[int, dict[str, Any]], None]
