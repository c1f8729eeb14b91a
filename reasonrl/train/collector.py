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

The loop is one; where its rounds come from is the only difference (:class:`RoundSource`, said by
:attr:`Collected.kind`). Whole responses (:class:`WholeRounds`): each round generates its prompts'
responses to their end. Partial rollouts (``train --partial-rollout-len S``, :class:`SegmentRounds`
over the pool of :mod:`reasonrl.train.partial`): each round is one segment of S tokens over the
round's new prompts and every response still going; a group joins the batch once its G responses
have finished, the finished groups beyond the batch wait in the pool for the next step (taken
first), and what is still going is continued then. The pool is the same on every rank and part of
:meth:`Collector.state`. One step off (``train --async-steps K``, :class:`AheadRounds`): the first
round of step t+K is drawn and submitted to the engine's own process (``reasonrl.engines.process``)
at the end of step t's collection, so it generates while step t trains; its tokens carry the
version of the policy that sampled them (staleness <= K), and the batches in flight are part of
every checkpoint (:meth:`AheadRounds.save`). With several ranks each rank submits its share of the
same draws to an engine process of its own, and every rank agrees on the batch and its version.

Every random stream is derived, not carried: prompt ``p`` of round ``r`` of step ``s`` samples with
seed ``mix(seed, s, r, draw index)`` (the engine's per-request seeds), so a resumed run draws the
same tokens as an uninterrupted one and no rank's tokens depend on another's.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from reasonrl import algos as A
from reasonrl.engines.base import SamplingParams
from reasonrl.rollouts import RolloutStats, Sample, fit_prompt, generate_rollouts, generate_timed, new_sample, score_groups
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


class Collection(enum.Enum):
    """How a batch was collected (:attr:`Collected.kind`); the value names it in messages."""

    WHOLE = "dynamic sampling"  # rounds of whole responses (dynamic sampling's rounds, or one round without it)
    SEGMENTS = "collection (partial rollouts)"  # rounds of one segment over the pool (--partial-rollout-len)
    REPLAY = "replay"  # saved groups served again (:class:`Replay`)


@dataclass
class Collected:
    """One step's collection. ``groups``: this rank's share of the kept groups (padding copies
    included); ``generated``: every response this rank sampled, kept or not. The counts are global."""

    groups: list[list[Sample]]
    stats: RolloutStats
    kind: Collection = Collection.WHOLE
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
    pool_metrics: dict[str, float] = field(default_factory=dict)  # the rollout/partial_… metrics (--partial-rollout-len; empty when off)
    born: dict[int, int] = field(default_factory=dict)  # each kept group's draw index → the step that began it, in batch order

    @property
    def label(self) -> str:
        """What collected this batch, for messages."""
        return self.kind.value

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


class RoundSource:
    """Where a collection's rounds come from (:meth:`Collector.collect` runs the one loop over it):
    what it carries in from earlier steps, each round's finished groups, what it keeps of those
    beyond the batch. This base carries nothing and keeps nothing; :meth:`round` is the source's.

    ``round(rows, row_ids, start, step=, rnd=, stats=)``: round ``rnd`` of step ``step`` over the
    prompts just drawn (``rows``, their stream rows ``row_ids``, draw indices from ``start``);
    returns this rank's finished groups, scored, and each finished group's ``(row, born)`` by draw
    index, every rank's. The round's counts and times go to ``stats``."""

    kind = Collection.WHOLE

    def __init__(self, *, engine: Any, tokenizer: Any, scorer: Any, sampling: SamplingParams, max_prompt_len: int, seed: int, ranks: Ranks) -> None:
        self.engine, self.tok, self.scorer, self.sampling = engine, tokenizer, scorer, sampling
        self.max_prompt_len, self.seed, self.ranks = max_prompt_len, seed, ranks

    def round_cap(self, max_rounds: int, dynamic: bool) -> int:
        """The most rounds a collection runs (``max_rounds``: --max-gen-rounds)."""
        return max_rounds

    def draw(self, stream: DataStream, k: int, *, step: int, rnd: int) -> tuple[list[Any], list[int], int]:
        """Round ``rnd`` of step ``step``'s ``k`` prompts: (rows, their stream rows, the first one's
        draw index), taken from ``stream`` now."""
        start = stream.drawn
        rows, row_ids = stream.take(k)
        return rows, row_ids, start

    def finish(self, first: int, step: int) -> None:
        """Step ``step``'s collection is over (``first``: how many prompts a step's first round draws)."""

    def snapshot(self) -> Any:
        """What :meth:`restore` puts back of the source's in-memory state (a step dropped before its update)."""
        return None

    def restore(self, snap: Any) -> None:
        """(See :meth:`snapshot`.)"""

    def begin(self, n_prompts: int, step: int) -> list[tuple[int, list[Sample]]]:
        """Up to ``n_prompts`` finished groups waiting from earlier steps, ``(born, group)`` in batch order."""
        return []

    def round(self, rows: list[Any], row_ids: list[int], start: int, *, step: int, rnd: int,
              stats: RolloutStats) -> tuple[list[list[Sample]], dict[int, tuple[int, int]]]:
        raise NotImplementedError

    def defer(self, surplus: list[int], mine: dict[int, list[Sample]], origin: dict[int, tuple[int, int]]) -> list[int]:
        """Groups finished beyond the batch (``surplus``, draw indices; this rank's in ``mine``):
        those kept for the next step (none: not kept)."""
        return []

    def metrics(self, out: Collected, step: int) -> dict[str, float]:
        """The source's metrics of the collection ``out`` (:attr:`Collected.pool_metrics`)."""
        return {}

    def keep_back(self, col: Collected) -> int:
        """(See :meth:`Collector.keep_back`: nothing to keep.)"""
        return 0


class WholeRounds(RoundSource):
    """Rounds of whole responses (no partial rollouts): each round generates ``G`` responses to
    their end for each of its prompts (this rank its share, ``rows[rank::world]``) in one engine
    call (:func:`reasonrl.rollouts.generate_rollouts`), and scores them. Without dynamic sampling
    one round makes the batch; the groups beyond it are not kept."""

    def round_cap(self, max_rounds: int, dynamic: bool) -> int:
        return max_rounds if dynamic else 1

    def round(self, rows: list[Any], row_ids: list[int], start: int, *, step: int, rnd: int,
              stats: RolloutStats) -> tuple[list[list[Sample]], dict[int, tuple[int, int]]]:
        rank, world = self.ranks.rank, self.ranks.world
        share = list(range(rank, len(rows), world))
        draws = [start + p for p in share]  # (unique: retired rows skipped advance the stream further)
        params = dataclasses.replace(self.sampling, seeds=tuple(mix(self.seed, step, rnd, d) for d in draws))
        groups, st = generate_rollouts(self.engine, self.tok, self.scorer, [rows[p] for p in share], params,
                                       max_prompt_len=self.max_prompt_len, group_ids=draws)
        stats.merge(st)
        return groups, {start + p: (rid, step) for p, rid in enumerate(row_ids)}


@dataclass
class AheadBatch:
    """The first round of step ``step``, submitted ahead: prompts drawn from ``start`` (stream rows
    ``row_ids``), sampled by the policy of version ``version``. In flight: ``pending``; back:
    ``outs`` (per prompt of this rank's share that fit, its completions as (token ids, log-probs,
    finish reason))."""

    step: int
    start: int
    row_ids: list[int]
    version: int
    pending: Any = None
    outs: list[list[tuple[list[int], list[float], str]]] | None = None
    wait_s: float = 0.0  # how long the trainer waited for it
    gen_s: float = 0.0  # the engine's time generating it


class AheadRounds(WholeRounds):
    """Whole responses, the first round of each step generated ahead (``train --async-steps K``).

    At the end of step t's collection (:meth:`finish`), the first round of each of the steps t+1 …
    t+K not yet submitted is drawn from the stream and submitted to the engine, an
    ``reasonrl.engines.process.EngineProcess`` (its ordered queue: the request runs before the weight
    sync that follows step t's update), so it generates while step t trains. Step t's first round is
    then its batch taken back (:meth:`draw`, :meth:`round`: waiting for it if it is still
    generating), scored, its tokens carrying the version of the policy that sampled them
    (the policy of the step that submitted it, so staleness <= K: the engine's queue puts the
    request before that step's weight sync; a step that skipped its update leaves the weights as
    they were, which is then the next step's policy, so versions count updates, not syncs; the
    default stale correction applies, as to partial rollouts). Dynamic sampling's further rounds, if
    any, generate at the step with the current weights. A step with no batch ahead (the first of a
    run) submits its own first round with the current weights.

    Several ranks (torchrun): each rank has an engine process of its own. Every rank draws the same
    rows from the one stream (its state is the same on every rank) and submits its share,
    ``rows[rank::world]``, as :class:`WholeRounds` generates it; the versions are the submitting
    step's, which the ranks pass in lockstep. So every rank takes back the same batch of the same
    version (checked each step: :meth:`_check_agreed`), its share of the groups, and returns every
    rank's origins, and the collector's agreement over the ranks (dynamic sampling, the equal
    shares) runs as without K. Each rank saves its own share (``ahead-rank{r}-of-{world}.pt``).

    Prompts and seeds are a step's own (seed ``mix(seed, step, 0, draw index)`` per prompt, as
    without K), so what a batch holds depends only on its draws and the weights that sample it: the
    batches in flight are saved with every checkpoint (:meth:`save`, waiting for them) and a resumed
    run takes them back (:meth:`load`) and submits the next with its resumed weights: the same run."""

    def __init__(self, ahead: int, *, stream: DataStream, **kw: Any) -> None:
        super().__init__(**kw)
        self.ahead, self.stream = ahead, stream
        self.batches: dict[int, AheadBatch] = {}  # step → its first round, submitted ahead (in step order)
        self.waited: float | None = None  # seconds this step's collection waited for its batch (None: it had none ahead)
        self.lag: int | None = None  # how many versions that batch's policy lags the step's

    def draw(self, stream: DataStream, k: int, *, step: int, rnd: int) -> tuple[list[Any], list[int], int]:
        if rnd:
            return super().draw(stream, k, step=step, rnd=rnd)
        b = self.batches.get(step) or self._submit(k, step, version=step)
        if len(b.row_ids) != k:
            raise ValueError(f"step {step}'s batch ahead holds {len(b.row_ids)} prompts; its first round draws {k}")
        self._check_agreed(b)
        return [stream.rows[i] for i in b.row_ids], list(b.row_ids), b.start

    def finish(self, first: int, step: int) -> None:
        for s in range(step + 1, step + self.ahead + 1):
            if s not in self.batches:
                self._submit(first, s, version=step)

    def _submit(self, k: int, step: int, *, version: int) -> AheadBatch:
        """Draw step ``step``'s first round and submit this rank's share of it (every rank draws the
        same ``k`` rows), sampled by the policy of step ``version`` (the engine's weights when the
        request runs)."""
        start = self.stream.drawn
        rows, row_ids = self.stream.take(k)
        fits = [(p, ids) for p in self._share(len(rows)) if (ids := fit_prompt(rows[p], self.tok, self.max_prompt_len)[1]) is not None]
        params = dataclasses.replace(self.sampling, seeds=tuple(mix(self.seed, step, 0, start + p) for p, _ in fits))
        pending = self.engine.submit([ids for _, ids in fits], params)
        b = self.batches[step] = AheadBatch(step, start, list(row_ids), version, pending=pending)
        return b

    def _share(self, k: int) -> range:
        """The positions of a round of ``k`` prompts that this rank generates (as :class:`WholeRounds`)."""
        return range(self.ranks.rank, k, self.ranks.world)

    def _check_agreed(self, b: AheadBatch) -> None:
        """Every rank takes back the same batch: its step, draws, rows and version (one gather of a
        digest; nothing with one process). A rank whose data position differs would train on other
        prompts, sampled by another policy, than the rest: refused."""
        if self.ranks.world == 1:
            return
        facts = (b.step, b.start, len(b.row_ids), mix(*b.row_ids), b.version)
        everyone = self.ranks.gather(facts)
        odd = next((r for r, f in enumerate(everyone) if f != everyone[0]), None)
        if odd is not None:
            from reasonrl.errors import ReasonRLError

            say = lambda f: f"draws {f[1]}..{f[1] + f[2] - 1} (digest {f[3]:x}), version {f[4]}"  # noqa: E731
            raise ReasonRLError(f"step {b.step}: the ranks disagree on its batch generated ahead (rank 0: {say(everyone[0])}; rank {odd}: "
                                f"{say(everyone[odd])}): their data positions differ; resume every rank from the same checkpoint")

    def _wait(self, b: AheadBatch) -> list[list[tuple[list[int], list[float], str]]]:
        """``b``'s completions, waiting for them if they are still generating (taken once, kept in ``b``)."""
        if b.outs is None:
            t0 = time.perf_counter()
            comps = self.engine.result(b.pending)
            b.outs = [[(list(c.token_ids), list(c.logprobs), c.finish_reason) for c in cs] for cs in comps]
            b.wait_s, b.gen_s, b.pending = time.perf_counter() - t0, float(getattr(self.engine, "last_generate_seconds", 0.0)), None
        return b.outs

    def round(self, rows: list[Any], row_ids: list[int], start: int, *, step: int, rnd: int,
              stats: RolloutStats) -> tuple[list[list[Sample]], dict[int, tuple[int, int]]]:
        if rnd:
            return super().round(rows, row_ids, start, step=step, rnd=rnd, stats=stats)
        b = self.batches.pop(step)
        outs = iter(self._wait(b))
        self.waited, self.lag = b.wait_s, step - b.version
        stats.gen_seconds += b.gen_s  # (the engine's own time: perf/generate_s, perf/gen_tokens_per_s; the trainer's wait is perf/ahead_wait_s)
        groups, scored = [], []
        for p in self._share(len(rows)):  # (this rank's share; as generate_rollouts: a prompt too long is skipped and counted)
            row = rows[p]
            text, ids = fit_prompt(row, self.tok, self.max_prompt_len)
            if ids is None:
                stats.skipped_long_prompts += 1
                continue
            groups.append([new_sample(self.tok, row, group=start + p, prompt_index=len(groups), prompt=text, prompt_ids=ids, response_ids=t,
                                      logprobs=lp, finish_reason=fin, versions=[b.version] * len(t)) for t, lp, fin in next(outs)])
            scored.append(row)
        stats.prompts += len(groups)
        stats.gen_tokens += sum(smp.length for g in groups for smp in g)
        score_groups(self.scorer, groups, scored, stats)
        return groups, {start + p: (rid, step) for p, rid in enumerate(row_ids)}

    def metrics(self, out: Collected, step: int) -> dict[str, float]:
        """``perf/ahead_wait_s``: how long the step waited for its batch generated ahead (0: it was
        back before the step needed it); ``rollout/ahead_lag``: the versions its policy lags the step's."""
        if self.waited is None:
            return {}
        waited = self.waited if self.ranks.world == 1 else float(self.ranks.max(torch.tensor([self.waited], dtype=torch.float64)).item())  # (the slowest rank's)
        return {"perf/ahead_wait_s": waited, "rollout/ahead_lag": self.lag}

    def snapshot(self) -> Any:
        return dict(self.batches)  # (the batches themselves keep their completions once taken)

    def restore(self, snap: Any) -> None:
        self.batches = dict(snap)

    # ---------------------------------------------------------------- in checkpoints (a ``reasonrl.train.checkpoint.FilePart``)
    def _file(self, where: Path) -> Path:
        """This rank's file of the part ``where``: ``ahead.pt`` in one process, else
        ``ahead-rank{r}-of-{world}.pt`` (each rank's share of the batches, generated by its own engine)."""
        rank, world = self.ranks.rank, self.ranks.world
        return where.with_suffix(".pt") if world == 1 else where.with_name(f"{where.name}-rank{rank}-of-{world}.pt")

    def save(self, where: Path) -> None:
        """This rank's file (:meth:`_file`) := its share of the batches ahead, each waited for (so the
        checkpoint holds what they generate), with the number of ranks that wrote them."""
        rec = []
        for b in self.batches.values():
            outs = self._wait(b)
            flat = [c for cs in outs for c in cs]
            rec.append({"step": b.step, "start": b.start, "row_ids": b.row_ids, "version": b.version, "gen_s": b.gen_s, "n": [len(cs) for cs in outs],
                        "lens": torch.tensor([len(c[0]) for c in flat], dtype=torch.int64),
                        "ids": torch.tensor([t for c in flat for t in c[0]], dtype=torch.int64),
                        "logprobs": torch.tensor([x for c in flat for x in c[1]], dtype=torch.float64),  # (the engine's floats, exactly)
                        "finish": [c[2] for c in flat]})
        torch.save({"batches": rec, **({"world": self.ranks.world, "rank": self.ranks.rank} if self.ranks.world > 1 else {})}, self._file(where))

    def load(self, where: Path) -> None:
        """This rank's share of the batches ahead, from its file; a checkpoint written by another
        number of ranks is refused (each rank's share is its engine's)."""
        from reasonrl.errors import ReasonRLError

        f = self._file(where)
        saved = self._saved_world(where)
        if saved is not None and saved != self.ranks.world:
            how = "one process (no torchrun)" if saved == 1 else f"torchrun --nproc_per_node {saved}"
            raise ReasonRLError(f"{where.parent.name}'s batches generated ahead (--async-steps) were saved by {saved} process{'es' * (saved > 1)}, "
                                f"this run has {self.ranks.world}: resume with {how}")
        if not f.is_file():
            raise ReasonRLError(f"{where.parent} holds no {f.name} (the batches generated ahead by --async-steps): "
                                "resume from a checkpoint of this run, or start over with --overwrite")
        self.batches = {}
        for r in torch.load(f, weights_only=True)["batches"]:
            lens, ids, lps = r["lens"].tolist(), r["ids"].tolist(), r["logprobs"].tolist()
            flat, at = [], 0
            for n, fin in zip(lens, r["finish"]):
                flat.append((ids[at : at + n], lps[at : at + n], fin))
                at += n
            outs, at = [], 0
            for n in r["n"]:
                outs.append(flat[at : at + n])
                at += n
            self.batches[int(r["step"])] = AheadBatch(int(r["step"]), int(r["start"]), [int(i) for i in r["row_ids"]], int(r["version"]), outs=outs,
                                                    gen_s=float(r["gen_s"]))

    @staticmethod
    def _saved_world(where: Path) -> int | None:
        """How many ranks wrote the part ``where``, as its files' names say (``ahead.pt``: one; None:
        no file)."""
        worlds = {int(m.group(1)) for f in where.parent.glob(f"{where.name}-rank*-of-*.pt") if (m := re.search(r"-of-(\d+)\.pt$", f.name))}
        return max(worlds) if worlds else 1 if where.with_suffix(".pt").is_file() else None


class SegmentRounds(RoundSource):
    """The rounds' source with partial rollouts (:mod:`reasonrl.train.partial`): the pool is its
    state. A collection first takes the finished groups waiting from earlier steps; each round adds
    its new prompts to the pool and generates one segment (S tokens) of every response still going
    (this rank its share); the groups it finishes are scored (this rank its share of them), those
    beyond the batch wait in the pool for the next step. The round cap holds with or without dynamic
    sampling (a round need not finish a group)."""

    kind = Collection.SEGMENTS

    def __init__(self, pool: PartialPool, *, rows: list[Any], max_staleness: int | None, **kw: Any) -> None:
        super().__init__(**kw)
        self.pool, self.rows, self.max_staleness = pool, rows, max_staleness
        self.decode_steps = 0  # the engine's decode steps over a collection's rounds (each round: its longest segment)
        self.regenerated: int | None = None

    def begin(self, n_prompts: int, step: int) -> list[tuple[int, list[Sample]]]:
        # --max-staleness K: what this step trains lags its policy by at most K versions (the responses older restart)
        self.regenerated = self.pool.enforce(step, self.max_staleness) if self.max_staleness is not None else None
        self.decode_steps = 0
        return self.pool.take_ready(n_prompts)

    def round(self, rows: list[Any], row_ids: list[int], start: int, *, step: int, rnd: int,
              stats: RolloutStats) -> tuple[list[list[Sample]], dict[int, tuple[int, int]]]:
        pool, rank, world = self.pool, self.ranks.rank, self.ranks.world
        for p, (row, rid) in enumerate(zip(rows, row_ids)):  # (every rank adds every prompt: the pool is the same on every rank)
            text, ids = fit_prompt(row, self.tok, self.max_prompt_len)
            if ids is None:
                stats.skipped_long_prompts += int(p % world == rank)  # (a rank counts its share, as without segments)
                continue
            stats.prompts += int(p % world == rank)
            pool.add(OpenGroup(draw=start + p, row=rid, born=step, prompt=text, prompt_ids=ids, pieces=[Piece() for _ in range(self.sampling.n)]))
        work = pool.work()[rank::world]
        params = dataclasses.replace(self.sampling, n=1, max_tokens=pool.segment, seeds=tuple(mix(self.seed, step, rnd, d, j) for d, j in work))
        outs = generate_timed(self.engine, [pool.prompt_of(d, j) for d, j in work], params, stats, unit=f"responses (up to {pool.segment} tokens each)")
        done = [(d, j, list(c[0].token_ids), list(c[0].logprobs), c[0].finish_reason) for (d, j), c in zip(work, outs)]
        stats.gen_tokens += sum(len(r[2]) for r in done)
        everyone_done = [r for part in self.ranks.gather(done) for r in part]
        self.decode_steps += max((len(r[2]) for r in everyone_done), default=0)
        finished = pool.apply(everyone_done, version=step)
        ours = finished[rank::world]
        groups = [[new_sample(self.tok, self.rows[g.row], group=g.draw, prompt_index=g.row, prompt=g.prompt, prompt_ids=g.prompt_ids,
                              response_ids=pc.ids, logprobs=pc.logprobs, finish_reason=pc.finish, versions=pc.versions) for pc in g.pieces] for g in ours]
        score_groups(self.scorer, groups, [self.rows[g.row] for g in ours], stats)
        return groups, {g.draw: (g.row, g.born) for g in finished}

    def defer(self, surplus: list[int], mine: dict[int, list[Sample]], origin: dict[int, tuple[int, int]]) -> list[int]:
        """Groups finished beyond the batch wait in the pool for the next step, marked kept: every
        rank keeps a copy (one gather)."""
        if surplus:
            extra = [[dataclasses.replace(s, kept=True) for s in mine[d]] for d in surplus if d in mine]
            self.pool.defer(sorted(((origin[g[0].group][1], g) for part in self.ranks.gather(extra) for g in part), key=lambda bg: bg[1][0].group))
        return surplus

    def metrics(self, out: Collected, step: int) -> dict[str, float]:
        """The rollout/partial_… metrics (the pool is the same on every rank)."""
        pool = self.pool
        m = {"rollout/partial_open_groups": len(pool.open), "rollout/partial_open_responses": pool.open_responses,
             "rollout/partial_ready_groups": len(pool.ready), "rollout/partial_carried_groups": out.carried_groups,
             "rollout/partial_deferred_groups": out.deferred_groups, "rollout/partial_decode_steps": self.decode_steps,
             "rollout/partial_stale_frac": sum(b < step for b in out.born.values()) / len(out.born) if out.born else 0.0}
        if self.regenerated is not None:
            m["rollout/partial_stale_regenerated"] = self.regenerated
        return m

    def keep_back(self, col: Collected) -> int:
        """Put ``col``'s finished groups back at the front of the pool's waiting line (see
        :meth:`Collector.keep_back`)."""
        if not col.born:
            return 0
        order = {d: i for i, d in enumerate(col.born)}
        mine = [g for g in col.groups if not g[0].pad]
        everyone = sorted((g for part in self.ranks.gather(mine) for g in part), key=lambda g: order[g[0].group])
        self.pool.put_back([(col.born[g[0].group], g) for g in everyone])
        col.pool_metrics["rollout/partial_ready_groups"] = len(self.pool.ready)
        col.pool_metrics["rollout/partial_kept_back_groups"] = len(everyone)
        return len(everyone)


class Collector:
    """Rollout → reward → dynamic sampling, for the whole run (this rank generates its share).

    Args:
        spec: the algo's row (dynamic_sampling, overlong_penalty, max_staleness are read from it).
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
        ahead: K > 0 (``train --async-steps K``): each step's first round generated K steps ahead
            (:class:`AheadRounds`; ``engine`` an ``EngineProcess``, this rank's own); not with ``partial_len``.

    The rounds' source (:attr:`source`) is the one difference: a :class:`WholeRounds`, an
    :class:`AheadRounds`, or a :class:`SegmentRounds` over its pool (:attr:`pool`; None without).
    """

    def __init__(self, *, spec: A.AlgoSpec, engine: Any, tokenizer: Any, scorer: Any, stream: DataStream, sampling: SamplingParams,
                 max_prompt_len: int, overlong_cache_len: int, oversample: float = 1.0, max_rounds: int = 1, seed: int = 0,
                 ranks: Ranks | None = None, partial_len: int = 0, ahead: int = 0) -> None:
        self.spec, self.stream, self.sampling, self.cache_len = spec, stream, sampling, overlong_cache_len
        self.oversample, self.max_rounds = oversample, max_rounds
        self.ranks = ranks or Ranks()
        self.pool = (PartialPool(partial_len, sampling.max_tokens, context_len=getattr(engine, "max_model_len", None))  # (vLLM's; None: no known limit)
                     if partial_len and partial_len < sampling.max_tokens else None)
        kw = dict(engine=engine, tokenizer=tokenizer, scorer=scorer, sampling=sampling, max_prompt_len=max_prompt_len, seed=seed, ranks=self.ranks)
        if self.pool is not None and ahead:
            raise ValueError("partial rollouts and rounds generated ahead do not combine")
        self.source: RoundSource = (SegmentRounds(self.pool, rows=stream.rows, max_staleness=spec.max_staleness, **kw) if self.pool is not None else
                                    AheadRounds(ahead, stream=stream, **kw) if ahead else WholeRounds(**kw))

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of collection: the data position (and the partial rollouts' pool)."""
        return {**self.stream.state(), **({"partial": self.pool.state()} if self.pool is not None else {})}

    def load(self, st: dict[str, Any]) -> None:
        self.stream.load(st)
        if self.pool is not None:
            self.pool.load(st.get("partial", {}))

    def snapshot(self) -> tuple[dict[str, Any], Any]:
        """All of collection's state as it stands (:meth:`state`, and the batches generated ahead,
        held in memory), for :meth:`restore` when a step is dropped before its update."""
        return self.state(), self.source.snapshot()

    def restore(self, snap: tuple[dict[str, Any], Any]) -> None:
        self.load(snap[0])
        self.source.restore(snap[1])

    @property
    def ahead(self) -> AheadRounds | None:
        """The source of rounds generated ahead (``--async-steps``; a checkpoint part), or None."""
        return self.source if isinstance(self.source, AheadRounds) else None

    def collect(self, n_prompts: int, *, step: int = 0, dynamic: bool | None = None) -> Collected:
        """Generate until ``n_prompts`` groups (over all ranks) are kept, or the round cap is hit.

        The finished groups waiting from earlier steps first (partial rollouts), then rounds: each
        draws ceil(still-needed × oversample) new prompts (no over-sampling without dynamic
        sampling) and gives the groups its source finished, scored; the ranks agree on them, dynamic
        sampling drops the uninformative ones, the first in draw order fill the batch, and those
        beyond it are deferred to the next step (partial rollouts) or not kept."""
        dynamic = self.spec.dynamic_sampling if dynamic is None else dynamic
        src, rank, world = self.source, self.ranks.rank, self.ranks.world
        out = Collected(groups=[], stats=RolloutStats(), wanted=n_prompts, kind=src.kind)
        mine: dict[int, list[Sample]] = {}  # draw index → this rank's finished groups
        selected: list[tuple[int, int]] = []  # (draw index, generating rank) of the kept groups, in batch order
        deferred: list[int] = []  # groups finished beyond the batch (trained next step)
        for i, (born, g) in enumerate(src.begin(n_prompts, step)):
            selected.append((g[0].group, i % world))
            out.born[g[0].group] = born
            if i % world == rank:
                mine[g[0].group] = g
        out.carried_groups = len(selected)
        need = n_prompts - len(selected)
        while need > 0 and out.rounds < src.round_cap(self.max_rounds, dynamic):
            k = math.ceil(need * (self.oversample if dynamic else 1.0))
            rows, row_ids, start = src.draw(self.stream, k, step=step, rnd=out.rounds)
            groups, origin = src.round(rows, row_ids, start, step=step, rnd=out.rounds, stats=out.stats)
            out.rounds += 1
            shape_rewards(groups, overlong_penalty=self.spec.overlong_penalty, max_len=self.sampling.max_tokens, cache_len=self.cache_len)
            out.generated.extend(s for g in groups for s in g)
            everyone = self._agree(groups)
            out.generated_groups += len(everyone)
            for draw, _, n_corr, size, _ in everyone:  # (--skip-solved-epochs: every rank keeps the same streaks)
                self.stream.visit(origin[draw][0], n_corr == size)
            for g in groups:
                mine[g[0].group] = g
            surplus: list[int] = []
            for draw, owner, n_corr, size, useful in everyone:
                if dynamic and not useful:
                    out.drop(n_corr, size)
                elif len(selected) < n_prompts:
                    selected.append((draw, owner))
                    out.born[draw] = origin[draw][1]
                else:
                    surplus.append(draw)
            deferred += src.defer(surplus, mine, origin)
            need = n_prompts - len(selected)
        self._close(out, selected, mine, deferred)
        out.pool_metrics = src.metrics(out, step)
        src.finish(math.ceil(n_prompts * (self.oversample if dynamic else 1.0)), step)  # (--async-steps: the next steps' first rounds submitted)
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
        return self.source.keep_back(col)

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
        return Collected(groups=share, stats=stats, kind=Collection.REPLAY, generated=real, rounds=0, wanted=n_prompts, generated_groups=n_prompts,
                         kept_groups=n_prompts)

    def keep_back(self, col: Collected) -> int:
        """(Nothing to keep: a replayed batch is never short.)"""
        return 0
