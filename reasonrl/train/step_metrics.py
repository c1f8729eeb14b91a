"""What a step logs: rollout statistics over every generated response of every rank, the kept
batch, dynamic sampling's counts, VC-PPO's by-position picture; the console line (``metrics.jsonl`` is
``reasonrl.tracking.RunLog``'s).

Names are namespaced the way verl users read them: ``rollout/…`` (what was sampled and scored),
``actor/…`` (the policy update), ``critic/…`` (the value model), ``perf/…`` (throughput and time);
``val/…`` is evaluation's. docs/metrics.md lists every name."""

from __future__ import annotations

from typing import Any

import torch

from reasonrl.algos.diagnostics import explained_variance, mean_by_position
from reasonrl.train.collector import Collected
from reasonrl.train.passes import StepTensors
from reasonrl.train.ranks import Ranks


def rollout_metrics(col: Collected, st: StepTensors | None, ranks: Ranks | None = None) -> dict[str, Any]:
    """Reward, accuracy and lengths over every response generated this step by every rank
    (dynamic sampling's dropped groups included: that is the policy's real score), plus the kept
    batch's and the filter's counts. Padding copies count nowhere."""
    ranks = ranks or Ranks()
    gen = col.generated
    kept = [s for g in col.groups for s in g if not s.pad]
    ent_sum, ent_n = 0.0, 0.0
    if st is not None:
        ent_sum, ent_n = float((st.entropy * st.batch.valid).sum()), float(st.batch.valid.sum())
    sc = col.stats.scorer
    prompt_lens = {s.group: len(s.prompt_ids) for s in gen}  # one per group: its samples share the prompt
    local = [len(gen), sum(s.reward for s in gen), sum(s.shaped_reward for s in gen), sum(s.correct for s in gen),
             sum(s.length for s in gen), sum(s.truncated for s in gen), sum(s.extracted is None for s in gen), len(kept),
             sum(s.correct for s in kept), col.stats.gen_tokens, col.stats.skipped_long_prompts, sc.get("timeouts", 0),
             sc.get("errors", 0), ent_sum, ent_n, sum(prompt_lens.values()), len(prompt_lens), sc.get("reward_errors", 0)]
    (n, rew, shaped, corr, lens, trunc, noans, n_kept, kept_corr, tokens, skipped, timeouts, errors, ent_sum, ent_n, plen, n_groups, rerr) = (
        ranks.sum(torch.tensor(local, dtype=torch.float64)).tolist())
    len_max, gen_s, score_s = ranks.max(torch.tensor([max((s.length for s in gen), default=0), col.stats.gen_seconds,
                                                      col.stats.score_seconds], dtype=torch.float64)).tolist()
    # The length distribution over every rank's responses: a histogram by token count, summed.
    hist = ranks.sum(torch.bincount(torch.tensor([s.length for s in gen], dtype=torch.long), minlength=int(len_max) + 1)[: int(len_max) + 1]
                     .to(torch.float64))
    m: dict[str, Any] = {}
    if n:
        m.update({
            "rollout/reward_mean": rew / n,
            "rollout/shaped_reward_mean": shaped / n,
            "rollout/acc_mean": corr / n,
            "rollout/response_length_mean": lens / n,
            "rollout/response_length_max": int(len_max),
            **{f"rollout/response_length_p{q}": _quantile(hist, q / 100) for q in (50, 90, 99)},
            "rollout/prompt_length_mean": plen / n_groups,
            "rollout/truncated_frac": trunc / n,
            "rollout/no_answer_frac": noans / n,
        })
    if n_kept:
        m["rollout/batch_acc_mean"] = kept_corr / n_kept
        m["rollout/batch_size"] = int(n_kept)
    m.update({
        "rollout/ds_rounds": col.rounds,
        "rollout/ds_generated_groups": col.generated_groups,
        "rollout/ds_kept_groups": col.kept_groups,
        "rollout/ds_kept_frac": col.kept_frac,
        "rollout/ds_dropped_all_correct": col.dropped_all_correct,
        "rollout/ds_dropped_all_wrong": col.dropped_all_wrong,
        "rollout/gen_tokens": int(tokens),
        "perf/gen_tokens_per_s": tokens / gen_s if gen_s else 0.0,
        "perf/generate_s": gen_s,
        "perf/score_s": score_s,
        "rollout/skipped_long_prompts": int(skipped),
        "rollout/verifier_timeouts": int(timeouts),
        "rollout/verifier_errors": int(errors),
        "rollout/reward_errors": int(rerr),
    })
    if col.retired is not None:
        m["rollout/retired_prompts"] = col.retired  # (--skip-solved-epochs)
    m.update(col.pool_metrics)  # (--partial-rollout-len: the pool is the same on every rank)
    if st is not None:
        m["actor/entropy"] = ent_sum / ent_n if ent_n else 0.0
    if st is not None and st.staleness is not None:  # (partial rollouts: the same on every rank)
        m.update(staleness_metrics(st, ranks))
    return m


def staleness_metrics(st: StepTensors, ranks: Ranks) -> dict[str, Any]:
    """How many policy versions the batch's response tokens lag the policy they train, over every
    rank's: mean and max, and the share of tokens sampled by an older policy."""
    v, lag = st.batch.valid.bool(), st.staleness
    n, total, stale = ranks.sum(torch.tensor([float(v.sum()), float(lag[v].sum()), float((lag[v] > 0).sum())], dtype=torch.float64)).tolist()
    top = float(ranks.max(torch.tensor(float(lag[v].max()) if bool(v.any()) else 0.0, dtype=torch.float64)))
    return {"rollout/staleness_mean": total / n if n else 0.0, "rollout/staleness_max": int(top), "rollout/stale_token_frac": stale / n if n else 0.0}


def position_metrics(st: StepTensors, n_bins: int = 16) -> dict[str, Any]:
    """VC-PPO's bias picture: mean value and advantage by token position."""
    m: dict[str, Any] = {}
    if st.advantages is not None:
        m["actor/advantage_by_position"] = mean_by_position(st.advantages, st.batch.valid, n_bins=n_bins)
    if st.values is not None:
        m["critic/value_by_position"] = mean_by_position(st.values, st.batch.valid, n_bins=n_bins)
        if st.returns is not None:
            m["critic/explained_variance"] = float(explained_variance(st.values, st.returns, st.batch.valid))
    return m


def log_line(step: int, steps: int, m: dict[str, Any]) -> str:
    def g(k: str, fmt: str = "{:.3f}") -> str:
        return fmt.format(m[k]) if k in m and m[k] is not None else "-"

    parts = [
        f"step {step}/{steps}",
        f"reward {g('rollout/reward_mean')}",
        f"acc {g('rollout/acc_mean')}",
        f"ent {g('actor/entropy')}",
        f"clip↑ {g('actor/clipfrac_upper', '{:.4f}')}",
        f"clip↓ {g('actor/clipfrac_lower', '{:.4f}')}",
        f"len {g('rollout/response_length_mean', '{:.0f}')}",
        f"trunc {g('rollout/truncated_frac', '{:.2f}')}",
        f"kept {m.get('rollout/ds_kept_groups', '-')}/{m.get('rollout/ds_generated_groups', '-')}"
        + (f"+{m['rollout/partial_carried_groups']} carried" if m.get("rollout/partial_carried_groups") else "") + f" ({m.get('rollout/ds_rounds', '-')} rnd)",
        f"gen {g('perf/gen_tokens_per_s', '{:.0f}')} tok/s",
        f"train {g('perf/train_tokens_per_s', '{:.0f}')} tok/s",
    ]
    if "critic/vf_loss" in m:
        parts.insert(5, f"vf {g('critic/vf_loss')}")
    if "rollout/partial_open_responses" in m:  # (--partial-rollout-len: the batch's share begun earlier, the responses going on)
        parts.insert(-2, f"stale {g('rollout/partial_stale_frac', '{:.2f}')} | going {m['rollout/partial_open_responses']}")
    return " | ".join(parts)


def val_line(step: int, v: dict[str, Any], n: int) -> str:
    """One console line per validation: avg@n and pass@1 with their intervals, length, time."""
    def ci(k: str) -> str:
        if k not in v:
            return f"{k.split('/')[-1]} -"
        return f"{k.split('/')[-1]} {100 * v[k]:.1f}% [{100 * v[k + '_ci_low']:.1f}, {100 * v[k + '_ci_high']:.1f}]"

    parts = [f"val {step}", ci(f"val/avg@{n}"), ci(f"val/maj@{n}"), f"{int(v.get('val/problems', 0))}×{n}",
             f"len {v.get('val/response_length_mean', float('nan')):.0f}", f"{v.get('perf/val_s', 0.0):.1f} s"]
    return " | ".join(p for p in parts if p)


def flatten_metrics(m: dict[str, Any]) -> dict[str, Any]:
    """Drop the bulky lists for the console; keep everything for metrics.jsonl."""
    return {k: v for k, v in m.items() if not isinstance(v, (list, dict))}


def _quantile(hist: torch.Tensor, q: float) -> int:
    """The smallest length with at least a fraction ``q`` of the responses at or below it."""
    cum = hist.cumsum(0)
    return int(torch.searchsorted(cum, q * float(cum[-1])).item())
