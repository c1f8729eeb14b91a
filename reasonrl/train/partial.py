"""Partial rollouts (``train --partial-rollout-len S``): responses generated S tokens at a time, a
response still going when its step's batch is full continued in the next step.

Why: with long chains of thought the response lengths are heavy-tailed, and a synchronous step
waits for its longest response. Its last decode steps carry a handful of rows, each paying the
engine's whole fixed per-step cost, so the cost per generated token grows with L_max (issue 24,
``bench/README.md``). Cutting generation into segments of S tokens bounds every engine call at S
decode steps; the rows of a segment are the new groups plus the responses still going, so the
batch stays full. This is Kimi k1.5's partial rollout (§2.6.2; slime's ``--partial-rollout``).

What it changes: a response continued in a later step was sampled by more than one policy, its
first tokens by an older one. Its sampling log-probabilities are kept per token as the engine
reported them, and so is each token's policy version (the step whose weights sampled it), so the
off-policy corrections (``reasonrl.algos.offpolicy``) see, and correct, exactly that: by default
the stale tokens are weighted by ``stale_correction`` (token TIS, C = 2), and ``mask_stale_prefix``
takes them out of the loss instead. ``rollout/partial_stale_frac`` says how much of each batch
began in an earlier step, ``rollout/staleness_mean`` / ``_max`` how far its tokens lag: a response
can span L_max / S steps or more (a step filled by finished groups runs no round), so its first
tokens can be several policy versions old.

``max_staleness`` K bounds the lag: at the start of each step a response holding a token sampled
more than K versions before it (in progress, or finished and waiting for a batch) is regenerated:
its tokens are dropped and it starts again from its prompt in this step, its group's other
responses kept (:meth:`PartialPool.enforce`, counted in ``rollout/partial_stale_regenerated``).
Regenerating rather than dropping the group keeps the prompt: the responses that grow stale are
the long ones, and dropping them would bias every batch towards short responses.

The pool is the same on every rank (each round's new tokens are gathered), so one state describes
it, and it is saved in the checkpoint beside the data position: a resumed run continues the same
responses with the same seeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reasonrl.rollouts import Sample

IN_PROGRESS = ""


@dataclass
class Piece:
    """One response so far: its tokens, their sampling log-probs, how it ended ("stop": EOS or a
    stop token; "length": L_max reached; "" while it goes on), and each token's policy version
    (the step that sampled it)."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = IN_PROGRESS
    versions: list[int] = field(default_factory=list)

    def restart(self) -> None:
        """Drop what was sampled: the response starts again from its prompt."""
        self.ids, self.logprobs, self.finish, self.versions = [], [], IN_PROGRESS, []


@dataclass
class OpenGroup:
    """A prompt's G responses while any of them goes on. ``draw``: the prompt's draw index in the
    data stream (its group id); ``row``: its index in the stream's rows; ``born``: the step that
    began it."""

    draw: int
    row: int
    born: int
    prompt: str
    prompt_ids: list[int]
    pieces: list[Piece]

    @property
    def done(self) -> bool:
        return all(p.finish for p in self.pieces)


class PartialPool:
    """The responses in progress and the finished groups waiting for a batch, across steps.

    Args:
        segment: S, the most tokens one engine call adds to a response (divides L_max).
        max_len: L_max; a response that reaches it is finished ("length"), as without segments.
        context_len: the engine's context length when it has one (prompt + response tokens); a
            response whose prompt and tokens fill it is finished ("length"), as without segments.
    """

    def __init__(self, segment: int, max_len: int, context_len: int | None = None) -> None:
        if segment < 1 or max_len % segment:
            raise ValueError(f"the segment length ({segment}) must divide L_max ({max_len})")
        self.segment, self.max_len, self.context_len = segment, max_len, context_len
        self.open: dict[int, OpenGroup] = {}  # draw index → group in progress
        self.ready: list[tuple[int, list[Sample]]] = []  # (born, scored group) finished and kept, not yet trained on, in draw order

    def add(self, group: OpenGroup) -> None:
        self.open[group.draw] = group

    def work(self) -> list[tuple[int, int]]:
        """The responses to continue, (draw, sample index) in draw order."""
        return [(d, j) for d in sorted(self.open) for j, p in enumerate(self.open[d].pieces) if not p.finish]

    def prompt_of(self, draw: int, j: int) -> list[int]:
        """What the engine continues: the prompt followed by the response so far."""
        g = self.open[draw]
        return g.prompt_ids + g.pieces[j].ids

    def apply(self, results: list[tuple[int, int, list[int], list[float], str]], version: int = 0) -> list[OpenGroup]:
        """Add one segment's output, ``(draw, j, token ids, log-probs, engine finish reason)`` per
        response, sampled by policy ``version``; returns the groups it finished (taken out of the
        pool), in draw order.

        An engine "length" is the segment's end, not the response's: the response goes on unless it
        reached L_max, or the engine's context length (the segment came back shorter than S, or the
        prompt and response fill ``context_len``; vLLM lowers ``max_model_len`` to what the model
        supports): then it ends there, "length", as without segments."""
        for draw, j, ids, logprobs, reason in results:
            g = self.open[draw]
            p = g.pieces[j]
            if len(ids) > self.segment:
                raise RuntimeError(f"the engine returned {len(ids)} tokens for a segment of {self.segment}")
            p.ids += list(ids)
            p.logprobs += list(logprobs)
            p.versions += [version] * len(ids)
            full = len(p.ids) >= self.max_len or len(ids) < self.segment or (self.context_len is not None and len(g.prompt_ids) + len(p.ids) >= self.context_len)
            p.finish = "stop" if reason != "length" else ("length" if full else IN_PROGRESS)
        done = [d for d in sorted(self.open) if self.open[d].done]
        return [self.open.pop(d) for d in done]

    def defer(self, groups: list[tuple[int, list[Sample]]]) -> None:
        """Finished groups, ``(born, group)`` in draw order, to wait for the next step's batch (after
        those already waiting)."""
        self.ready += groups

    def put_back(self, groups: list[tuple[int, list[Sample]]]) -> None:
        """Finished groups taken for a batch that made no update (``--on-short-batch skip``), ``(born,
        group)`` in the batch's order: back to the front of the waiting line, the next step's first."""
        self.ready[:0] = groups

    def take_ready(self, k: int) -> list[tuple[int, list[Sample]]]:
        """Up to ``k`` finished groups, oldest draw first (``(born, group)``)."""
        got, self.ready = self.ready[:k], self.ready[k:]
        return got

    def enforce(self, step: int, max_staleness: int) -> int:
        """Bound the lag of what step ``step`` may train to ``max_staleness`` versions: every response,
        in progress or finished and waiting, holding a token sampled before ``step - max_staleness``
        restarts from its prompt (a waiting group goes back in progress, its fresh responses kept).
        Returns how many responses restart. The same on every rank (the pool is)."""
        oldest = step - max_staleness
        n = 0
        for g in self.open.values():
            for p in g.pieces:
                if p.versions and p.versions[0] < oldest:  # (a response's first token is its oldest)
                    p.restart()
                    n += 1
        keep: list[tuple[int, list[Sample]]] = []
        for born, grp in self.ready:
            if not any(smp.versions and smp.versions[0] < oldest for smp in grp):
                keep.append((born, grp))
                continue
            pieces = [Piece(list(smp.response_ids), list(smp.logprobs), smp.finish_reason, list(smp.versions)) for smp in grp]
            for p in pieces:
                if p.versions and p.versions[0] < oldest:
                    p.restart()
                    n += 1
            s0 = grp[0]
            self.add(OpenGroup(draw=s0.group, row=s0.prompt_index, born=born, prompt=s0.prompt, prompt_ids=list(s0.prompt_ids), pieces=pieces))
        self.ready = keep
        return n

    @property
    def open_responses(self) -> int:
        return sum(not p.finish for g in self.open.values() for p in g.pieces)

    def state(self) -> dict[str, Any]:
        """JSON-able, for checkpoints (and to put the pool back when a step is abandoned)."""
        return {"open": [{"draw": g.draw, "row": g.row, "born": g.born, "prompt": g.prompt, "prompt_ids": list(g.prompt_ids),
                          "pieces": [[list(p.ids), list(p.logprobs), p.finish, list(p.versions)] for p in g.pieces]} for g in self.open.values()],
                "ready": [[born, [s.to_dict() for s in grp]] for born, grp in self.ready]}

    def load(self, st: dict[str, Any]) -> None:
        """Restore :meth:`state`. A checkpoint written before tokens carried their versions gives
        each token its group's ``born`` step (the oldest it can be: the staleness is not understated)."""
        self.open = {}
        for g in st.get("open", []):
            born = int(g["born"])
            pieces = [Piece(list(p[0]), list(p[1]), p[2], [int(v) for v in p[3]] if len(p) > 3 else [born] * len(p[0])) for p in g["pieces"]]
            self.add(OpenGroup(draw=int(g["draw"]), row=int(g["row"]), born=born, prompt=g["prompt"], prompt_ids=list(g["prompt_ids"]), pieces=pieces))
        self.ready = []
        for born, grp in st.get("ready", []):
            samples = [Sample(**s) for s in grp]
            for smp in samples:
                if not smp.versions:
                    smp.versions = [int(born)] * smp.length
            self.ready.append((int(born), samples))
