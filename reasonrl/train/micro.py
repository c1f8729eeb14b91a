"""Cutting a mini-batch into micro-batches: by rows (``--micro-batch-size``) or to a token budget
(``--max-tokens-per-micro-batch``, verl's ``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``).

The gradient does not depend on the cut: the learner weights each micro-batch's loss by its share
of the mini-batch's counted tokens (token-mean) or rows (the sequence modes), counted over every
rank, so the accumulated gradient is the mini-batch's aggregate whatever the micro-batches are
(``tests/train/test_micro.py`` checks it in fp32). Only time and memory change.

A micro-batch's **cost** is the tokens the trainer's forward (``reasonrl.train.batch``) runs over
it: shared, its distinct prompts at its longest prompt plus its rows at its longest response
(padding included); plain, its rows at its longest prompt plus longest response; packed, its
distinct prompts' and its rows' real tokens. ``auto`` is counted as the padded mode it would fall
back to, an upper bound of whichever it picks, so the budget holds either way. By rows, a
mini-batch is arranged so that this cost is low (``arrange``) and cut every ``micro`` rows. To a
budget, the rows are taken in the cheaper of two orders (a group's rows together, or all rows
longest first) and a micro-batch is closed when the next row would take its
cost over the budget: short rows go many to a micro-batch, long rows few, so padding and the count
of forward calls both shrink where lengths are heavy-tailed. A row whose cost alone exceeds the
budget gets a micro-batch of its own.

ZeRO-3 gathers parameters collectively in every forward, so every rank must run as many
micro-batches: ``split_to`` cuts the costliest micro-batches in two until a rank has the most any
rank has (the learner takes that count's maximum over ranks).

The plan of an update, as pure functions of explicit inputs (the learner supplies its batch, its
seeded generator and its collectives): :func:`minibatches` (the shuffled draws of each epoch),
:func:`row_lengths` (what a cost counts), :func:`plan` (a mini-batch cut into micro-batches) and
:func:`weights` (each micro-batch's share of the mini-batch's aggregate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class RowLengths:
    """Per row of the step's batch: its prompt's and response's token counts and its group; the
    forward mode whose tokens a micro-batch's cost counts (shared, plain or packed)."""

    prompt: list[int]
    response: list[int]
    group: list[int]
    forward: str = "shared"

    def cost(self, rows: list[int]) -> int:
        """Tokens the ``forward`` mode runs for these rows as one micro-batch (its padding too, but packed has none)."""
        if not rows:
            return 0
        if self.forward == "packed":
            prompts = {self.group[r]: self.prompt[r] for r in rows}
            return sum(prompts.values()) + sum(self.response[r] for r in rows)
        top_prompt, top_response = max(self.prompt[r] for r in rows), max(self.response[r] for r in rows)
        if self.forward == "plain":
            return len(rows) * (top_prompt + top_response)
        return len({self.group[r] for r in rows}) * top_prompt + len(rows) * top_response

    def orders(self, rows: list[int]) -> tuple[list[int], list[int]]:
        """The two arrangements: a group's rows together (groups longest first, each longest first:
        a prompt computed once per micro-batch) and all rows longest first (least padding)."""
        top: dict[int, int] = {}
        for r in rows:
            top[self.group[r]] = max(top.get(self.group[r], 0), self.response[r])
        by_group = sorted(rows, key=lambda r: (-top[self.group[r]], self.group[r], -self.response[r]))
        by_length = sorted(rows, key=lambda r: (-self.response[r], self.group[r]))
        return by_group, by_length


def by_rows(order: list[int], micro: int) -> list[list[int]]:
    """``order`` cut every ``micro`` rows."""
    return [order[i : i + micro] for i in range(0, len(order), micro)]


def arrange(lens: RowLengths, rows: list[int], micro: int) -> list[int]:
    """The rows in the order they are cut by ``micro`` rows: the cheaper of the two orders (by the
    total cost of the micro-batches they give)."""
    if len(rows) <= micro:
        return rows
    return min(lens.orders(rows), key=lambda o: sum(lens.cost(m) for m in by_rows(o, micro)))


def by_tokens(lens: RowLengths, order: list[int], budget: int) -> list[list[int]]:
    """``order`` cut greedily: a micro-batch is closed when the next row would take its cost over ``budget``."""
    out: list[list[int]] = []
    cur: list[int] = []
    for r in order:
        if cur and lens.cost(cur + [r]) > budget:
            out.append(cur)
            cur = []
        cur.append(r)
    if cur:
        out.append(cur)
    return out


def to_budget(lens: RowLengths, rows: list[int], budget: int) -> list[list[int]]:
    """The rows cut to ``budget`` tokens per micro-batch, in the order that runs fewer tokens (then
    fewer micro-batches)."""
    if not rows:
        return []
    cuts = [by_tokens(lens, o, budget) for o in lens.orders(rows)]
    return min(cuts, key=lambda c: (sum(lens.cost(m) for m in c), len(c)))


def split_to(lens: RowLengths, micros: list[list[int]], count: int) -> list[list[int]]:
    """``micros`` with the costliest multi-row micro-batch cut in two (where the two halves' larger
    cost is least) until there are ``count``; as many as possible when there are fewer rows."""
    out = [list(m) for m in micros]
    while len(out) < count:
        cands = [i for i, m in enumerate(out) if len(m) > 1]
        if not cands:
            break
        i = max(cands, key=lambda j: lens.cost(out[j]))
        m = out[i]
        at = min(range(1, len(m)), key=lambda k: max(lens.cost(m[:k]), lens.cost(m[k:])))
        out[i : i + 1] = [m[:at], m[at:]]
    return out


def row_lengths(attention_mask: torch.Tensor, valid: torch.Tensor, prompt_len: int, group: list[int], forward: str) -> RowLengths:
    """The batch's per-row prompt tokens (``attention_mask`` over its first ``prompt_len`` columns)
    and response tokens (``valid``), with each row's ``group`` and the ``forward`` mode a cost counts."""
    return RowLengths(prompt=[int(x) for x in attention_mask[:, :prompt_len].sum(1).tolist()],
                      response=[int(x) for x in valid.sum(1).tolist()], group=group, forward=forward)


def plan(lens: RowLengths, rows: list[int], *, micro: int, budget: int, most: Callable[[int], int] | None = None) -> list[list[int]]:
    """``rows`` (a mini-batch) cut into micro-batches: arranged and cut every ``micro`` rows when
    ``budget`` <= 0, else cut to ``budget`` tokens each and, with ``most`` (a count's maximum over
    ranks; None in one process), split to as many as the rank that needs the most."""
    if budget <= 0:
        return by_rows(arrange(lens, rows, micro), micro)
    micros = to_budget(lens, rows, budget)
    if most is not None:
        micros = split_to(lens, micros, most(len(micros)))
    return micros


def minibatches(n: int, *, epochs: int, size: int, gen: torch.Generator) -> list[list[int]]:
    """``epochs`` passes over ``n`` rows, each a fresh permutation from ``gen`` cut every ``size`` rows."""
    out = []
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen).tolist()
        out += [perm[i : i + size] for i in range(0, n, size)]
    return out


def weights(mask: torch.Tensor, micros: list[list[int]], agg: str, *, total: Callable[[torch.Tensor], torch.Tensor],
            world: int) -> list[tuple[list[int], float]]:
    """Each micro-batch's weight so the accumulated gradient equals the mini-batch's aggregate.

    token-mean: micro tokens / mini tokens; seq modes: micro counted rows / mini counted rows,
    counted by ``mask`` (B, T): the same mask the loss is normalised with (the policy's loss
    mask, or the critic's valid tokens). Counts are summed over ranks (``total``), and scaled by
    ``world`` because DDP/ZeRO average gradients. Empty when nothing is counted on any rank (every
    rank then skips the mini-batch together).
    """
    per_row = mask[[r for m in micros for r in m]].sum(1)
    unit = per_row if agg == "token-mean" else (per_row > 0).float()
    counted = float(total(unit.sum()))
    if counted <= 0:
        return []
    res, at = [], 0
    for mic in micros:
        w = float(unit[at : at + len(mic)].sum())
        res.append((mic, (w / counted) * world))
        at += len(mic)
    return res
