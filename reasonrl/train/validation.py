"""Validation during training (``train --val-every N``): the current policy on held-out problems.

At step 0 (before any update), every N steps and at the last step, the engine (its weights synced
at the end of the step) samples ``n`` responses for each validation problem at the evaluation
setting (DAPO's AIME setting: temperature 1.0, top_p 0.7), the reward scores them, and avg@n,
pass@k and maj@n with percentile-bootstrap intervals over the problems (overall and per data
source, as ``reasonrl eval`` computes them) join the step's metrics as ``val/...``; each problem's
values (with the problem's ``where`` and data source) go to the run's ``validation.jsonl``, one line
per validation, for comparisons paired by problem (``reasonrl ablate``).

Validation samples with its own seeds, derived from (seed, step, problem): it never draws from the
training's random streams (the engines' per-request generators leave torch's global RNG alone), so
turning it on leaves the training trajectory unchanged, and a resumed run validates exactly as the
uninterrupted one. Under torchrun each rank samples its share of the problems (problem p on rank
p mod world) and rank 0 computes the metrics.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

from reasonrl.train.ranks import Ranks, mix

#: The stream tag of validation seeds (so they never coincide with a training stream's).
_VAL_STREAM = 0x5A1


@dataclass
class Validator:
    """Validates the engine's current policy on ``rows`` (distinct problems)."""

    rows: Sequence[dict[str, Any]]
    tokenizer: Any
    scorer: Any
    ranks: Ranks
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    max_prompt_len: int
    ks: Sequence[int]
    seed: int
    n_boot: int = 1000

    def seeds(self, step: int) -> list[int]:
        """Problem p's sampling seed at ``step`` (sample j uses seed + j)."""
        return [mix(self.seed, _VAL_STREAM, step, p) % (2**62 - self.n) for p in range(len(self.rows))]

    def run(self, engine: Any, step: int) -> tuple[dict[str, float], dict[str, Any]]:
        """Sample, score and summarise; returns the ``val/...`` scalars and ``perf/val_s``, and the
        per-problem record ``{"where": [...], "source": [...], "avg@n": [...], "pass@1": [...], ...}``
        (each list in problem order; rank 0; the other ranks return ({}, {}))."""
        from reasonrl.engines.base import SamplingParams
        from reasonrl.evaluation.scores import flat_metrics, metrics_by_source, per_problem_values
        from reasonrl.rewards import ScoreStats
        from reasonrl.rollouts import generate_rollouts

        t0 = time.perf_counter()
        mine = list(range(self.ranks.rank, len(self.rows), self.ranks.world))
        seeds = self.seeds(step)
        params = SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, max_tokens=self.max_tokens,
                                seeds=tuple(seeds[p] for p in mine))
        groups, st = generate_rollouts(engine, self.tokenizer, self.scorer, [self.rows[p] for p in mine], params,
                                       max_prompt_len=self.max_prompt_len, row_offset=0)
        # what rank 0 needs of each problem, in problem order
        kept = [(mine[g[0].prompt_index], [(s.correct, s.extracted, s.length, s.truncated) for s in g], g[0].ground_truth, g[0].data_source)
                for g in groups]
        shares = self.ranks.gather((kept, st.skipped_long_prompts, st.scorer.get("reward_errors", 0)))
        if self.ranks.rank != 0:
            return {}, {}
        problems = sorted((p for share, *_ in shares for p in share), key=lambda x: x[0])
        skipped = sum(k for _, k, _ in shares)
        out: dict[str, float] = {"val/problems": float(len(problems)), "val/skipped_long_prompts": float(skipped),
                                 "val/reward_errors": float(sum(e for *_, e in shares))}
        record: dict[str, Any] = {}
        if problems:
            correct = [[c for c, *_ in samples] for _, samples, _, _ in problems]
            answers = [[a for _, a, *_ in samples] for _, samples, _, _ in problems]
            truths = [gt for _, _, gt, _ in problems]
            votes = ScoreStats()
            equal = functools.partial(self.scorer.equivalent, stats=votes)  # maj@n: the reward's equivalence
            values = per_problem_values(correct, answers, truths, ks=sorted({*self.ks, self.n}), equal=equal,
                                        maj_by_reward=getattr(self.scorer, "reward", "math") != "math")
            metrics, by_source = metrics_by_source(values, [src for *_, src in problems], n_boot=self.n_boot, seed=mix(self.seed, _VAL_STREAM, step))
            out.update(flat_metrics(metrics, by_source if len(by_source) > 1 else None))
            record = {"where": [(self.rows[p].get("extra_info") or {}).get("where", f"problem {p}") for p, *_ in problems],
                      "source": [src for *_, src in problems], **values}
            flat = [x for _, samples, _, _ in problems for x in samples]
            out["val/response_length_mean"] = sum(x[2] for x in flat) / len(flat)
            out["val/truncated_frac"] = sum(bool(x[3]) for x in flat) / len(flat)
            out["val/no_answer_frac"] = sum(x[1] is None for x in flat) / len(flat)
        out["perf/val_s"] = time.perf_counter() - t0
        return out, record


def improved(value: float, best: float | None, metric: str) -> bool:
    """Whether ``value`` of ``metric`` beats ``best`` (higher is better for every val/ metric but
    lengths and fractions, where lower is)."""
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    lower_better = metric.endswith(("_frac", "length_mean"))
    return value < best if lower_better else value > best


@dataclass
class Best:
    """``--save-best`` and ``--early-stop-patience``: the best value of ``metric`` so far, its step,
    and how many validations in a row have not beaten it (saved in each checkpoint, so a resumed
    run keeps the same best)."""

    metric: str
    patience: int = 0
    value: float | None = None
    step: int | None = None
    since: int = 0

    def update(self, metrics: dict[str, float], step: int) -> bool:
        """Record a validation; True when it is the new best."""
        if self.metric not in metrics:
            from reasonrl.errors import ReasonRLError

            names = ", ".join(k for k in metrics if k.startswith("val/") and not k.endswith(("_ci_low", "_ci_high")))
            raise ReasonRLError(f"--save-best {self.metric} is not a validation metric of this run: choose one of {names}")
        v = float(metrics[self.metric])
        if improved(v, self.value, self.metric):
            self.value, self.step, self.since = v, step, 0
            return True
        self.since += 1
        return False

    @property
    def stop(self) -> bool:
        return bool(self.patience) and self.since >= self.patience

    def state(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "step": self.step, "since": self.since}

    def load(self, state: dict[str, Any] | None) -> None:
        if state and state.get("metric") == self.metric:
            self.value, self.step, self.since = state.get("value"), state.get("step"), int(state.get("since", 0))
