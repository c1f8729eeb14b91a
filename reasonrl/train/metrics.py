"""What a step logs: rollout statistics over every generated response, the kept batch, dynamic
sampling's counts, VC-PPO's by-position picture; the console line; ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reasonrl import algos as A
from reasonrl.algos.metrics import explained_variance, mean_by_position
from reasonrl.train.collector import Collected
from reasonrl.train.learner import StepTensors


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

