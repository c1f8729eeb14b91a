"""Collecting a step's batch: rollouts, rule rewards, the soft overlong punishment and dynamic
sampling (DAPO §3.2, eq. 11).

One call of :meth:`Collector.collect` generates ``G`` responses for each prompt it takes from the
data stream, scores them, adds DAPO's eq. 13 punishment to the reward when the algo uses it, and,
with dynamic sampling, drops the groups that are all correct or all wrong and generates again
(over-sampling by ``oversample``) until the batch holds the prompts asked for or the round cap is
hit. Which of these run is decided by the algo's row (``reasonrl.algos.ALGOS``), never by its name.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from reasonrl import algos as A
from reasonrl.engines.base import SamplingParams
from reasonrl.samples import RolloutStats, Sample, generate_rollouts


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
    """One step's collection: the kept groups and every response generated on the way."""

    groups: list[list[Sample]]
    stats: RolloutStats
    generated: list[Sample] = field(default_factory=list)  # every response sampled this step, kept or not
    rounds: int = 0
    generated_groups: int = 0
    kept_groups: int = 0
    dropped_all_correct: int = 0
    dropped_all_wrong: int = 0


def shape_rewards(groups: list[list[Sample]], *, overlong_penalty: bool, max_len: int, cache_len: int) -> None:
    """shaped = rule reward + DAPO eq. 13 punishment (when the algo uses it)."""
    flat = [s for g in groups for s in g]
    if not flat:
        return
    pen = A.overlong_penalty(torch.tensor([s.length for s in flat]), max_len=max_len, cache_len=cache_len) if overlong_penalty else torch.zeros(len(flat))
    for s, p in zip(flat, pen.tolist()):
        s.shaped_reward = s.reward + float(p)


class Collector:
    """Rollout → reward → dynamic sampling, for one rank's share of the prompts.

    Args:
        spec: the algo's row (dynamic_sampling, overlong_penalty are read from it).
        engine, tokenizer, scorer: generation and the rule reward.
        stream: where prompts come from.
        sampling: G (``n``), temperature, top-p/k, L_max (``max_tokens``).
        overlong_cache_len: L_cache of eq. 13.
        oversample, max_rounds: dynamic sampling's over-sampling factor and round cap.
        rank, world: this process's share of each round's prompts is ``rows[rank::world]``.
    """

    def __init__(self, *, spec: A.AlgoSpec, engine: Any, tokenizer: Any, scorer: Any, stream: DataStream, sampling: SamplingParams,
                 max_prompt_len: int, overlong_cache_len: int, oversample: float = 1.0, max_rounds: int = 1, rank: int = 0,
                 world: int = 1) -> None:
        self.spec, self.engine, self.tok, self.scorer, self.stream = spec, engine, tokenizer, scorer, stream
        self.sampling, self.max_prompt_len, self.cache_len = sampling, max_prompt_len, overlong_cache_len
        self.oversample, self.max_rounds, self.rank, self.world = oversample, max_rounds, rank, world
        self._group_counter = 0

    def collect(self, n_prompts: int, *, dynamic: bool | None = None) -> Collected:
        """Generate until ``n_prompts`` groups are kept (or the round cap is hit)."""
        dynamic = self.spec.dynamic_sampling if dynamic is None else dynamic
        out = Collected(groups=[], stats=RolloutStats())
        need = n_prompts
        while need > 0 and out.rounds < (self.max_rounds if dynamic else 1):
            k = math.ceil(need * (self.oversample if dynamic else 1.0))
            rows, idx = self.stream.take(k * self.world)
            rows, idx = rows[self.rank :: self.world], idx[self.rank :: self.world]
            groups, st = generate_rollouts(self.engine, self.tok, self.scorer, rows, self.sampling, max_prompt_len=self.max_prompt_len,
                                           group_offset=self._group_counter)
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
