"""Collecting a step's batch: rollouts, rule rewards, the soft overlong punishment and dynamic
sampling (DAPO §3.2, eq. 11), over all ranks as one step.

One call of :meth:`Collector.collect` generates ``G`` responses for each prompt it takes from the
data stream, scores them, adds DAPO's eq. 13 punishment to the reward when the algo uses it, and,
with dynamic sampling, drops the groups that are all correct or all wrong and generates again
(over-sampling by ``oversample``) until the batch holds the prompts asked for or the round cap is
hit. Which of these run is decided by the algo's row (``reasonrl.algos.ALGOS``), never by its name.

Several ranks: every rank draws the same global rows from one data stream (so one stream state
describes them all) and generates its share, ``rows[rank::world]``; the ranks then agree (one
gather of each group's correctness) on which groups are kept: the first informative groups in draw
order, whichever rank generated them. The kept groups are then redistributed so every rank trains
on an equal share: a rank keeps its own up to the share, the surplus moves to ranks that are short,
and when the total does not divide, the short ranks get a padding copy (no loss, no metric) rather
than any informative group being thrown away.

Partial rollouts (``train --partial-rollout-len S``, :mod:`reasonrl.train.partial`): each round is
one segment of S tokens over the round's new prompts and every response still going; a group joins
the batch once its G responses have finished, and what is still going when the batch is full is
continued in the next step. The pool is the same on every rank and part of :meth:`Collector.state`.

Every random stream is derived, not carried: prompt ``p`` of round ``r`` of step ``s`` samples with
seed ``mix(seed, s, r, draw index)`` (the engine's per-request seeds), so a resumed run draws the
same tokens as an uninterrupted one and no rank's tokens depend on another's.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from reasonrl import algos as A
from reasonrl.engines.base import SamplingParams
from reasonrl.progress import phase
from reasonrl.rollouts import RolloutStats, Sample, generate_rollouts, new_sample, prompt_text, score_samples
from reasonrl.train.partial import OpenGroup, PartialPool, Piece
from reasonrl.train.ranks import Ranks, mix


class DataStream:
    """Prompts in a seeded order, epoch after epoch; its position is saved in checkpoints.

    ``skip_solved`` K > 0 (``train --skip-solved-epochs``): a row every sample of which was correct
    in K visits in a row (:meth:`visit`) is retired, skipped by every later draw for the rest of the
    run. The streaks and the retired rows are part of :meth:`state`, so a resumed run skips the same."""

    def __init__(self, rows: Sequence[Any], seed: int, *, skip_solved: int = 0) -> None:
        self.rows, self.seed, self.epoch, self.pos = list(rows), seed, 0, 0
        self.skip_solved = skip_solved
        self.streak: dict[int, int] = {}  # row → visits in a row with every sample correct
        self.retired: set[int] = set()
        self._order = self._perm()

    def _perm(self) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return order

    @property
    def drawn(self) -> int:
        """How many draws were made so far (the next row's draw index)."""
        return self.epoch * len(self.rows) + self.pos

    def take(self, k: int) -> tuple[list[Any], list[int]]:
        if self.retired and len(self.retired) >= len(self.rows):
            from reasonrl.errors import ReasonRLError

            raise ReasonRLError(f"every one of the {len(self.rows)} prompts was solved in {self.skip_solved} visits in a row and is retired "
                                "(--skip-solved-epochs): nothing is left to train on; raise --skip-solved-epochs or train on harder data")
        out, idx = [], []
        while len(out) < k:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm()
            i = self._order[self.pos]
            self.pos += 1
            if i in self.retired:
                continue
            out.append(self.rows[i])
            idx.append(i)
        return out, idx

    def visit(self, row: int, all_correct: bool) -> None:
        """Row ``row`` was sampled: every sample correct or not (with ``skip_solved``; else a no-op)."""
        if not self.skip_solved:
            return
        self.streak[row] = self.streak.get(row, 0) + 1 if all_correct else 0
        if self.streak[row] >= self.skip_solved:
            self.retired.add(row)

    def state(self) -> dict[str, Any]:
        st: dict[str, Any] = {"epoch": self.epoch, "pos": self.pos}
        if self.skip_solved:
            st["streak"] = sorted([i, n] for i, n in self.streak.items() if n)
            st["retired"] = sorted(self.retired)
        return st

    def load(self, st: dict[str, Any]) -> None:
        self.epoch, self.pos = int(st["epoch"]), int(st["pos"])
        self.streak = {int(i): int(n) for i, n in st.get("streak", [])}
        self.retired = {int(i) for i in st.get("retired", [])}
        self._order = self._perm()


@dataclass
class Collected:
    """One step's collection. ``groups``: this rank's share of the kept groups (padding copies
    included); ``generated``: every response this rank sampled, kept or not. The counts are global."""

    groups: list[list[Sample]]
    stats: RolloutStats
    generated: list[Sample] = field(default_factory=list)
    rounds: int = 0
    wanted: int = 0  # groups asked for, over all ranks
    generated_groups: int = 0  # groups finished in this step's rounds
    kept_groups: int = 0
    carried_groups: int = 0  # groups finished in an earlier step, taken into this batch first (--partial-rollout-len)
    deferred_groups: int = 0  # groups finished beyond this batch, trained in the next step (--partial-rollout-len)
    dropped_all_correct: int = 0
    dropped_all_wrong: int = 0
    retired: int | None = None  # prompts retired as solved so far (--skip-solved-epochs; None when off)
    partial: dict[str, float] = field(default_factory=dict)  # the rollout/partial_… metrics (--partial-rollout-len; empty when off)
    born: dict[int, int] = field(default_factory=dict)  # each kept group's draw index → the step that began it, in batch order (--partial-rollout-len)

    @property
    def label(self) -> str:
        """What collected this batch, for messages."""
        return "collection (partial rollouts)" if self.partial else "dynamic sampling"

    @property
    def kept_frac(self) -> float:
        """The share of the groups on offer this step that its batch kept: finished in it or carried
        into it, less those deferred to the next step (neither dropped nor kept here)."""
        offered = self.generated_groups + self.carried_groups - self.deferred_groups
        return self.kept_groups / offered if offered else 0.0

    def drop(self, n_correct: int, size: int) -> None:
        """Count a group dynamic sampling dropped (all correct or all wrong)."""
        self.dropped_all_correct += int(n_correct == size)
        self.dropped_all_wrong += int(n_correct == 0)

    @property
    def short(self) -> bool:
        """Collection stopped at its round cap with fewer groups than wanted (dynamic sampling, or
        partial rollouts with groups still going)."""
        return self.kept_groups < self.wanted


def shape_rewards(groups: list[list[Sample]], *, overlong_penalty: bool, max_len: int, cache_len: int) -> None:
    """shaped = rule reward + DAPO eq. 13 punishment (when the algo uses it)."""
    flat = [s for g in groups for s in g]
    if not flat:
        return
    pen = A.soft_overlong_punishment(torch.tensor([s.length for s in flat]), max_len=max_len, cache_len=cache_len) if overlong_penalty else torch.zeros(len(flat))
    for s, p in zip(flat, pen.tolist()):
        s.shaped_reward = s.reward + float(p)


class Collector:
    """Rollout → reward → dynamic sampling, for the whole run (this rank generates its share).

    Args:
        spec: the algo's row (dynamic_sampling, overlong_penalty are read from it).
        engine, tokenizer, scorer: generation and the rule reward.
        stream: where prompts come from (the same on every rank).
        sampling: G (``n``), temperature, top-p/k, L_max (``max_tokens``).
        overlong_cache_len: L_cache of eq. 13.
        oversample, max_rounds: dynamic sampling's over-sampling factor and round cap (with partial
            rollouts the cap holds whether dynamic sampling is on or not).
        seed: the run's seed (every sampling seed derives from it).
        ranks: this process among the run's processes.
        partial_len: S > 0: partial rollouts (``reasonrl.train.partial``), S tokens per response and
            round; 0: every response generated whole in one round.
    """

    def __init__(self, *, spec: A.AlgoSpec, engine: Any, tokenizer: Any, scorer: Any, stream: DataStream, sampling: SamplingParams,
                 max_prompt_len: int, overlong_cache_len: int, oversample: float = 1.0, max_rounds: int = 1, seed: int = 0,
                 ranks: Ranks | None = None, partial_len: int = 0) -> None:
        self.spec, self.engine, self.tok, self.scorer, self.stream = spec, engine, tokenizer, scorer, stream
        self.sampling, self.max_prompt_len, self.cache_len = sampling, max_prompt_len, overlong_cache_len
        self.oversample, self.max_rounds, self.seed = oversample, max_rounds, seed
        self.ranks = ranks or Ranks()
        self.pool = (PartialPool(partial_len, sampling.max_tokens, context_len=getattr(engine, "max_model_len", None))  # (vLLM's; None: no known limit)
                     if partial_len and partial_len < sampling.max_tokens else None)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of collection: the data position (and the partial rollouts' pool)."""
        return {**self.stream.state(), **({"partial": self.pool.state()} if self.pool is not None else {})}

    def load(self, st: dict[str, Any]) -> None:
        self.stream.load(st)
        if self.pool is not None:
            self.pool.load(st.get("partial", {}))

    def collect(self, n_prompts: int, *, step: int = 0, dynamic: bool | None = None) -> Collected:
        """Generate until ``n_prompts`` groups (over all ranks) are kept, or the round cap is hit."""
        dynamic = self.spec.dynamic_sampling if dynamic is None else dynamic
        if self.pool is not None:
            return self._collect_partial(n_prompts, step=step, dynamic=dynamic)
        rank, world = self.ranks.rank, self.ranks.world
        out = Collected(groups=[], stats=RolloutStats(), wanted=n_prompts)
        mine: dict[int, list[Sample]] = {}  # draw index → this rank's kept groups
        selected: list[tuple[int, int]] = []  # (draw index, generating rank) of the kept groups, in draw order
        need = n_prompts
        while need > 0 and out.rounds < (self.max_rounds if dynamic else 1):
            k = math.ceil(need * (self.oversample if dynamic else 1.0))
            start = self.stream.drawn
            rows, row_ids = self.stream.take(k)
            share = list(range(rank, k, world))
            draws = [start + p for p in share]  # (unique: retired rows skipped advance the stream further)
            params = dataclasses.replace(self.sampling, seeds=tuple(mix(self.seed, step, out.rounds, d) for d in draws))
            groups, st = generate_rollouts(self.engine, self.tok, self.scorer, [rows[p] for p in share], params,
                                           max_prompt_len=self.max_prompt_len, group_ids=draws)
            out.stats.merge(st)
            out.rounds += 1
            shape_rewards(groups, overlong_penalty=self.spec.overlong_penalty, max_len=self.sampling.max_tokens, cache_len=self.cache_len)
            out.generated.extend(s for g in groups for s in g)
            everyone = self._agree(groups)
            out.generated_groups += len(everyone)
            for draw, _, n_corr, size, _ in everyone:  # (--skip-solved-epochs: every rank keeps the same streaks)
                self.stream.visit(row_ids[draw - start], n_corr == size)
            for draw, owner, n_corr, size, useful in everyone:
                if dynamic and not useful:
                    out.drop(n_corr, size)
                    continue
                if len(selected) < n_prompts:
                    selected.append((draw, owner))
            for g in groups:
                mine[g[0].group] = g
            need = n_prompts - len(selected)
        return self._close(out, selected, mine)

    def _collect_partial(self, n_prompts: int, *, step: int, dynamic: bool) -> Collected:
        """:meth:`collect` with partial rollouts: the finished groups waiting from earlier steps
        first, then rounds of one segment (S tokens) each over the new prompts and every response
        still going, until ``n_prompts`` groups are kept or the round cap is hit. Each round draws
        ceil(still-needed × oversample) new prompts (no over-sampling without dynamic sampling).
        Groups finished beyond the batch wait for the next step; responses still going stay in the
        pool. Every rank generates its share of the round's responses and scores its share of the
        groups it finished."""
        from reasonrl.models.tokens import fitting_ids

        pool, rank, world = self.pool, self.ranks.rank, self.ranks.world
        assert pool is not None
        out = Collected(groups=[], stats=RolloutStats(), wanted=n_prompts)
        mine: dict[int, list[Sample]] = {}
        selected: list[tuple[int, int]] = []
        stale = 0  # kept groups begun in an earlier step
        decode_steps = 0  # the engine's decode steps over the step's rounds (each round: its longest segment)
        deferred: list[int] = []  # groups finished beyond the batch (trained next step)
        # --max-staleness K: what this step trains lags its policy by at most K versions (the responses older restart)
        regenerated = pool.enforce(step, self.spec.max_staleness) if self.spec.max_staleness is not None else None
        for i, (born, g) in enumerate(pool.take_ready(n_prompts)):
            selected.append((g[0].group, i % world))
            out.born[g[0].group] = born
            stale += born < step
            if i % world == rank:
                mine[g[0].group] = g
        out.carried_groups = len(selected)
        need = n_prompts - len(selected)
        while need > 0 and out.rounds < self.max_rounds:
            k = math.ceil(need * (self.oversample if dynamic else 1.0))
            start = self.stream.drawn
            rows, row_ids = self.stream.take(k)
            for p, (row, rid) in enumerate(zip(rows, row_ids)):
                text = prompt_text(row, self.tok)
                ids = fitting_ids(text, self.tok, self.max_prompt_len)
                if ids is None:
                    out.stats.skipped_long_prompts += int(p % world == rank)  # (a rank counts its share, as without segments)
                    continue
                out.stats.prompts += int(p % world == rank)
                pool.add(OpenGroup(draw=start + p, row=rid, born=step, prompt=text, prompt_ids=ids, pieces=[Piece() for _ in range(self.sampling.n)]))
            work = pool.work()[rank::world]
            params = dataclasses.replace(self.sampling, n=1, max_tokens=pool.segment, seeds=tuple(mix(self.seed, step, out.rounds, d, j) for d, j in work))
            t0 = time.perf_counter()
            # (called with no responses too: with --engine-tp, generate is collective over an engine group)
            with phase("generate", len(work), unit=f"responses (up to {pool.segment} tokens each)") as bar:
                outs = self.engine.generate([pool.prompt_of(d, j) for d, j in work], params, progress=None if bar is None else bar.generated)
            out.stats.gen_seconds += time.perf_counter() - t0
            done = [(d, j, list(c[0].token_ids), list(c[0].logprobs), c[0].finish_reason) for (d, j), c in zip(work, outs)]
            out.stats.gen_tokens += sum(len(r[2]) for r in done)
            everyone_done = [r for part in self.ranks.gather(done) for r in part]
            decode_steps += max((len(r[2]) for r in everyone_done), default=0)
            finished = pool.apply(everyone_done, version=step)
            out.rounds += 1
            # Score this rank's share of the finished groups; then agree, as without segments.
            ours = finished[rank::world]
            groups = [[new_sample(self.tok, self.stream.rows[g.row], group=g.draw, prompt_index=g.row, prompt=g.prompt, prompt_ids=g.prompt_ids,
                                  response_ids=pc.ids, logprobs=pc.logprobs, finish_reason=pc.finish, versions=pc.versions) for pc in g.pieces] for g in ours]
            flat = [s for g in groups for s in g]
            if flat:
                score_samples(self.scorer, flat, [self.stream.rows[g.row] for g in ours for _ in g.pieces], out.stats)
            out.stats.samples += len(flat)
            shape_rewards(groups, overlong_penalty=self.spec.overlong_penalty, max_len=self.sampling.max_tokens, cache_len=self.cache_len)
            out.generated.extend(flat)
            everyone = self._agree(groups)
            out.generated_groups += len(everyone)
            born = {g.draw: g.born for g in finished}
            row_of = {g.draw: g.row for g in finished}
            for draw, _, n_corr, size, _ in everyone:
                self.stream.visit(row_of[draw], n_corr == size)
            surplus: list[int] = []
            for g in groups:
                mine[g[0].group] = g
            for draw, owner, n_corr, size, useful in everyone:
                if dynamic and not useful:
                    out.drop(n_corr, size)
                elif len(selected) < n_prompts:
                    selected.append((draw, owner))
                    out.born[draw] = born[draw]
                    stale += born[draw] < step
                else:
                    surplus.append(draw)
            if surplus:  # finished beyond the batch: every rank keeps a copy for the next step
                extra = [[dataclasses.replace(s, kept=True) for s in mine[d]] for d in surplus if d in mine]
                pool.defer(sorted(((born[g[0].group], g) for part in self.ranks.gather(extra) for g in part), key=lambda bg: bg[1][0].group))
                deferred += surplus
            need = n_prompts - len(selected)
        self._close(out, selected, mine, deferred)
        out.partial = {"rollout/partial_open_groups": len(pool.open), "rollout/partial_open_responses": pool.open_responses,
                       "rollout/partial_ready_groups": len(pool.ready), "rollout/partial_carried_groups": out.carried_groups,
                       "rollout/partial_deferred_groups": out.deferred_groups, "rollout/partial_decode_steps": decode_steps,
                       "rollout/partial_stale_frac": stale / len(selected) if selected else 0.0}
        if regenerated is not None:
            out.partial["rollout/partial_stale_regenerated"] = regenerated
        return out

    @property
    def dynamic_sampling(self) -> bool:
        """Whether this collector tops the batch up by dynamic sampling (the algo's row)."""
        return self.spec.dynamic_sampling

    def keep_back(self, col: Collected) -> int:
        """A batch of partial rollouts that makes no update (``--on-short-batch skip``): its groups,
        finished and scored (carried from earlier steps or finished in this one), go back to the pool
        to be trained first in the next step, and into the checkpoint with it, rather than be lost
        with the update. Every rank gets them all (one gather). Returns how many (0 without partial
        rollouts: dynamic sampling's groups are sampled again)."""
        if self.pool is None or not col.born:
            return 0
        order = {d: i for i, d in enumerate(col.born)}
        mine = [g for g in col.groups if not g[0].pad]
        everyone = sorted((g for part in self.ranks.gather(mine) for g in part), key=lambda g: order[g[0].group])
        self.pool.put_back([(col.born[g[0].group], g) for g in everyone])
        col.partial["rollout/partial_ready_groups"] = len(self.pool.ready)
        col.partial["rollout/partial_kept_back_groups"] = len(everyone)
        return len(everyone)

    def _agree(self, groups: list[list[Sample]]) -> list[tuple[int, int, int, int, bool]]:
        """What every rank generated, agreed on: (draw index, rank, #correct, G, informative) of
        each rank's ``groups``, sorted by draw index."""
        informative = A.informative_groups(torch.tensor([[s.correct for s in g] for g in groups], dtype=torch.bool)).tolist() if groups else []
        facts = [(g[0].group, self.ranks.rank, sum(s.correct for s in g), len(g), inf) for g, inf in zip(groups, informative)]
        return sorted(f for part in self.ranks.gather(facts) for f in part)

    def _close(self, out: Collected, selected: list[tuple[int, int]], mine: dict[int, list[Sample]], deferred: Sequence[int] = ()) -> Collected:
        """Mark this rank's groups kept or not, and give ``out`` the counts and this rank's share.
        ``deferred``: groups finished beyond the batch (partial rollouts), marked kept too: trained in
        the next step (--keep-rollouts writes a response in the step it finished)."""
        chosen = {d for d, _ in selected} | set(deferred)
        for g in mine.values():
            for smp in g:
                smp.kept = g[0].group in chosen
        out.kept_groups, out.deferred_groups = len(selected), len(deferred)
        out.retired = len(self.stream.retired) if self.stream.skip_solved else None
        out.groups = self._share(selected, mine)
        return out

    def _share(self, selected: list[tuple[int, int]], mine: dict[int, list[Sample]]) -> list[list[Sample]]:
        """This rank's equal share of the kept groups (see the module doc)."""
        rank, world = self.ranks.rank, self.ranks.world
        own = [mine[d] for d, r in selected if r == rank]
        if world == 1 or not selected:
            return own
        quota = math.ceil(len(selected) / world)
        counts = [sum(1 for _, r in selected if r == q) for q in range(world)]
        surplus = own[quota:]
        # Surplus groups, and one template group for padding, cross ranks only when needed.
        template = mine[selected[0][0]] if selected[0][1] == rank else None
        gathered = self.ranks.gather((surplus, template))
        pool = sorted((g for part, _ in gathered for g in part), key=lambda g: g[0].group)
        template = next(t for _, t in gathered if t is not None)
        share = own[:quota]
        # Ranks that are short take the surplus in rank order.
        short = [q for q in range(world) if counts[q] < quota]
        for q in short:
            take = quota - counts[q]
            got, pool = pool[:take], pool[take:]
            if q == rank:
                share += got
        while len(share) < quota:
            share.append([dataclasses.replace(s, pad=True, kept=False) for s in template])
        return share


class Replay:
    """Saved groups (a rollout artifact's) served as steps' batches, in place of a :class:`Collector`:
    ``n`` groups per step in a seeded order, epoch after epoch (a :class:`DataStream` over the
    groups), each rank its share ``groups[rank::world]``; a rank left short by an ``n`` that does not
    divide gets a padding copy (no loss, no metric). Nothing is generated or scored: the samples keep
    the rewards they were saved with."""

    def __init__(self, groups: Sequence[list[Sample]], seed: int, ranks: Ranks | None = None) -> None:
        self.stream, self.ranks = DataStream(groups, seed), ranks or Ranks()

    def collect(self, n_prompts: int, *, step: int = 0, dynamic: bool | None = None) -> Collected:
        groups, _ = self.stream.take(n_prompts)
        rank, world = self.ranks.rank, self.ranks.world
        share = groups[rank::world]
        while len(share) < math.ceil(n_prompts / world):
            share.append([dataclasses.replace(s, pad=True, kept=False) for s in groups[0]])
        real = [s for g in share for s in g if not s.pad]
        stats = RolloutStats(prompts=sum(not g[0].pad for g in share), samples=len(real), gen_tokens=sum(s.length for s in real))
        return Collected(groups=share, stats=stats, generated=real, rounds=0, wanted=n_prompts, generated_groups=n_prompts, kept_groups=n_prompts)

    def keep_back(self, col: Collected) -> int:
        """(Nothing to keep: a replayed batch is never short.)"""
        return 0
